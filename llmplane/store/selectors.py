"""Label selectors: kubectl's text syntax and Kubernetes' ``LabelSelector`` objects.

``parse_selector("tier=web,env!=prod,gpu,!spot,zone in (a,b),arch notin (arm)")`` returns a
``Selector``; ``Selector.matches(labels)`` says whether a label map satisfies every requirement.
Anything malformed raises ``ValueError`` naming the selector, the position and what was expected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Operator = Literal["=", "!=", "in", "notin", "exists", "!", "gt", "lt"]

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_INTEGER = re.compile(r"^-?[0-9]+$")
# Characters that end a key or value; everything else belongs to one.
_SPECIAL = set(" \t\n\r,()=!<>")


def _key_problem(key: str) -> str | None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return f"label key {key!r} has an invalid prefix: it must be a DNS-1123 subdomain"
    if not name or len(name) > 63 or not _NAME.match(name):
        return (
            f"label key {key!r} is invalid: the name must be 1-63 alphanumeric characters, "
            "'-', '_' or '.', starting and ending with an alphanumeric character"
        )
    return None


def _value_problem(value: str) -> str | None:
    if value and (len(value) > 63 or not _NAME.match(value)):
        return (
            f"label value {value!r} is invalid: it must be at most 63 alphanumeric characters, "
            "'-', '_' or '.', starting and ending with an alphanumeric character"
        )
    return None


@dataclass(frozen=True)
class Requirement:
    """One clause of a selector. ``values`` is empty for ``exists`` and ``!``."""

    key: str
    op: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        # gt / lt: the label must be present and an integer.
        if not present or value is None or not _INTEGER.match(value):
            return False
        bound = int(self.values[0])
        return int(value) > bound if self.op == "gt" else int(value) < bound

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!":
            return f"!{self.key}"
        if self.op in ("=", "!="):
            return f"{self.key}{self.op}{self.values[0]}"
        if self.op in ("gt", "lt"):
            return f"{self.key}{'>' if self.op == 'gt' else '<'}{self.values[0]}"
        return f"{self.key} {self.op} ({','.join(self.values)})"


@dataclass(frozen=True)
class Selector:
    """All requirements must hold (they are ANDed). The empty selector matches everything."""

    requirements: tuple[Requirement, ...] = field(default_factory=tuple)

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)

    def __bool__(self) -> bool:
        return bool(self.requirements)

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> Selector:
        """Equality on every entry (a ``map[string]string`` selector)."""
        reqs = []
        for key, value in labels.items():
            if not isinstance(value, str):
                raise ValueError(f"label selector value for {key!r} must be a string")
            problem = _key_problem(key) or _value_problem(value)
            if problem:
                raise ValueError(f"invalid label selector: {problem}")
            reqs.append(Requirement(key, "=", (value,)))
        return cls(tuple(reqs))

    @classmethod
    def from_label_selector(cls, selector: Mapping[str, Any]) -> Selector:
        """A Kubernetes ``LabelSelector``: ``{matchLabels: {...}, matchExpressions: [...]}``."""
        unknown = set(selector) - {"matchLabels", "matchExpressions"}
        if unknown:
            raise ValueError(f"invalid label selector: unknown fields {sorted(unknown)}")
        reqs = list(cls.from_labels(selector.get("matchLabels") or {}).requirements)
        ops: dict[str, Operator] = {
            "In": "in",
            "NotIn": "notin",
            "Exists": "exists",
            "DoesNotExist": "!",
        }
        for i, expr in enumerate(selector.get("matchExpressions") or []):
            where = f"matchExpressions[{i}]"
            if not isinstance(expr, Mapping):
                raise ValueError(f"invalid label selector: {where} must be an object")
            key, op_name = expr.get("key"), expr.get("operator")
            values = expr.get("values") or []
            if not isinstance(key, str) or (problem := _key_problem(key)):
                raise ValueError(f"invalid label selector: {where}.key: {problem or 'required'}")
            if op_name not in ops:
                raise ValueError(
                    f"invalid label selector: {where}.operator must be one of "
                    f"{', '.join(ops)}, got {op_name!r}"
                )
            op = ops[op_name]
            if op in ("in", "notin") and not values:
                raise ValueError(
                    f"invalid label selector: {where}.values must be non-empty for {op_name}"
                )
            if op in ("exists", "!") and values:
                raise ValueError(
                    f"invalid label selector: {where}.values must be empty for {op_name}"
                )
            for v in values:
                if not isinstance(v, str) or (problem := _value_problem(v)):
                    raise ValueError(
                        f"invalid label selector: {where}.values: {problem or 'must be strings'}"
                    )
            reqs.append(Requirement(key, op, tuple(values)))
        return cls(tuple(reqs))


def as_selector(selector: str | Mapping[str, Any] | Selector | None) -> Selector:
    """Accept every form callers use: text, a label map, a ``LabelSelector`` dict, or None."""
    if selector is None:
        return Selector()
    if isinstance(selector, Selector):
        return selector
    if isinstance(selector, str):
        return parse_selector(selector)
    if isinstance(selector, Mapping):
        # A LabelSelector has only these keys and their values are never strings, whereas a
        # plain label map's values always are.
        if (
            selector
            and set(selector) <= {"matchLabels", "matchExpressions"}
            and not any(isinstance(v, str) for v in selector.values())
        ):
            return Selector.from_label_selector(selector)
        return Selector.from_labels(selector)
    raise TypeError(f"label selector must be a string or a mapping, not {type(selector).__name__}")


# --- text syntax -----------------------------------------------------------------------------


@dataclass
class _Token:
    kind: str  # "word", "op" or "end"
    text: str
    pos: int


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c in "=!":
            two = text[i : i + 2]
            if two in ("==", "!="):
                tokens.append(_Token("op", two, i))
                i += 2
            else:
                tokens.append(_Token("op", c, i))
                i += 1
        elif c in ",()<>":
            tokens.append(_Token("op", c, i))
            i += 1
        else:
            start = i
            while i < n and text[i] not in _SPECIAL:
                i += 1
            tokens.append(_Token("word", text[start:i], start))
    tokens.append(_Token("end", "", n))
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    def fail(self, message: str, token: _Token | None = None) -> ValueError:
        token = token or self.peek()
        found = "end of input" if token.kind == "end" else repr(token.text)
        return ValueError(
            f"invalid label selector {self.text!r}: {message}, found {found} at position {token.pos}"
        )

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def next(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def parse(self) -> Selector:
        if self.peek().kind == "end":
            return Selector()
        reqs = [self.requirement()]
        while self.peek().kind != "end":
            if self.peek().text != ",":
                raise self.fail("expected ',' between requirements")
            self.next()
            reqs.append(self.requirement())
        return Selector(tuple(reqs))

    def key(self) -> str:
        token = self.next()
        if token.kind != "word":
            raise self.fail("expected a label key", token)
        problem = _key_problem(token.text)
        if problem:
            raise ValueError(f"invalid label selector {self.text!r}: {problem}")
        return token.text

    def value(self, *, allow_empty: bool) -> str:
        token = self.peek()
        if token.kind != "word":
            if allow_empty and (token.kind == "end" or token.text in (",", ")")):
                return ""
            raise self.fail("expected a label value")
        self.next()
        problem = _value_problem(token.text)
        if problem:
            raise ValueError(f"invalid label selector {self.text!r}: {problem}")
        return token.text

    def requirement(self) -> Requirement:
        if self.peek().text == "!" and self.peek().kind == "op":
            self.next()
            return Requirement(self.key(), "!")
        key = self.key()
        token = self.peek()
        if token.kind == "end" or token.text == ",":
            return Requirement(key, "exists")
        if token.kind == "op" and token.text in ("=", "==", "!="):
            self.next()
            op: Operator = "!=" if token.text == "!=" else "="
            return Requirement(key, op, (self.value(allow_empty=True),))
        if token.kind == "op" and token.text in ("<", ">"):
            self.next()
            bound = self.peek()
            if bound.kind != "word" or not _INTEGER.match(bound.text):
                raise self.fail(f"expected an integer after {token.text!r}")
            self.next()
            return Requirement(key, "gt" if token.text == ">" else "lt", (bound.text,))
        if token.kind == "word" and token.text in ("in", "notin"):
            self.next()
            return Requirement(key, token.text, self.value_set())  # type: ignore[arg-type]
        raise self.fail(f"expected '=', '==', '!=', 'in' or 'notin' after key {key!r}")

    def value_set(self) -> tuple[str, ...]:
        if self.peek().text != "(":
            raise self.fail("expected '(' to start a set of values")
        self.next()
        values = [self.value(allow_empty=True)]
        while self.peek().text == ",":
            self.next()
            values.append(self.value(allow_empty=True))
        if self.peek().text != ")":
            raise self.fail("expected ',' or ')' in a set of values")
        self.next()
        if values == [""]:
            raise self.fail(
                "a set of values for 'in' or 'notin' must not be empty", self.tokens[self.i - 1]
            )
        return tuple(dict.fromkeys(values))


def parse_selector(text: str) -> Selector:
    """Parse kubectl's label selector syntax; an empty string selects everything."""
    if not isinstance(text, str):
        raise TypeError(f"label selector must be a string, not {type(text).__name__}")
    return _Parser(text).parse()
