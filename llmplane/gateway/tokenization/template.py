"""A model's chat template, rendered as transformers' ``apply_chat_template`` renders it (its
settings, ``{% generation %}``, ``tojson``, ``raise_exception``, ``strftime_now``), so the text
is the engine's to the byte; with bounds, because the template comes from the model's files,
which the gateway does not trust. It runs in jinja2's ``ImmutableSandboxedEnvironment``, and one
render has a budget (the ``MAX_`` constants); ``*``, ``+``, ``%``, ``~`` and the filters whose
result can explode check the size before they build it. Past a bound: ``TemplateRefused``, no
token ids for the request, which goes on unharmed.
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import meta, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.visitor import NodeTransformer

MAX_STEPS = 1_000_000  # loop iterations + calls in one render
MAX_WORK = 64 << 20  # characters (or items) built by operators, filters and calls in one render
MAX_VALUE = 8 << 20  # characters (or items) of any one value
MAX_OUTPUT = 8 << 20  # characters of rendered text
MAX_TEMPLATE = 1 << 20  # characters of template source
MAX_BITS = 1 << 16  # bits of an integer the template computes with * or **


class NoTokenIds(Exception):
    """The request cannot be tokenized here as the engine would (the reason is the message)."""


class TemplateRefused(NoTokenIds):
    """The template cannot be used (syntax, sandbox) or one render exceeded its budget."""


@dataclass(slots=True)
class _Budget:
    steps: int = MAX_STEPS
    work: int = MAX_WORK


_budget: contextvars.ContextVar[_Budget] = contextvars.ContextVar("chat_template_budget")


def _charge(steps: int = 1, size: int = 0) -> None:
    budget = _budget.get()
    budget.steps -= steps
    budget.work -= size
    if budget.steps < 0:
        raise TemplateRefused(f"the chat template ran more than {MAX_STEPS} loop steps or calls")
    if budget.work < 0:
        raise TemplateRefused(f"the chat template built more than {MAX_WORK} characters")


def _size(value: object) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple | dict) else 0


def _check_size(size: int) -> None:
    if size > MAX_VALUE:
        raise TemplateRefused(f"the chat template built a value of more than {MAX_VALUE} items")
    _charge(0, size)


def _checked(value: Any) -> Any:
    _check_size(_size(value))
    return value


def _check_bits(bits: int) -> None:
    if bits > MAX_BITS:
        raise TemplateRefused(f"the chat template computed a number of more than {MAX_BITS} bits")


def _check_args(args: Iterable[object]) -> None:
    """Integer arguments that set a width or a count (``center``, ``indent``, ``ljust``...)."""
    for arg in args:
        if type(arg) is int and abs(arg) > MAX_VALUE:
            raise TemplateRefused(f"the chat template passed {arg} to a function")


def _iterate(iterable: Any) -> Iterator[Any]:
    """Every ``{% for %}`` iterates through this (the AST is rewritten): a step per item."""
    for item in iterable:
        _charge()
        yield item


def _concat(*parts: Any) -> str:
    """``a ~ b``: the size is checked before the string is built."""
    texts = [p if isinstance(p, str) else str(p) for p in parts]
    _check_size(sum(map(len, texts)))
    return "".join(texts)


# Filters whose integer arguments size what they build (a width, a count).
_SIZED_BY_ARGUMENT = frozenset(
    {"center", "indent", "wordwrap", "batch", "slice", "truncate", "format", "random"}
)


def _bounded_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """A filter that checks its arguments before and its result after (``replace``, ``join``
    and ``sum`` their result's size before: one call can multiply a string's length)."""

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        _charge()
        if name in _SIZED_BY_ARGUMENT:
            _check_args((*args, *kwargs.values()))
        if name in ("join", "sum") and args and isinstance(args[0], list | tuple):
            _check_size(sum(map(_size, args[0])))
        elif name == "replace":
            strings = [a for a in args if isinstance(a, str)]
            if len(strings) >= 3:
                text, old, new = strings[-3:]
                count = text.count(old) if old else len(text) + 1
                _check_size(len(text) + count * max(0, len(new) - len(old)))
        return _checked(func(*args, **kwargs))

    return run


_WIDE = re.compile(r"\d{7,}")  # a printf or format width past MAX_VALUE's digits


class _TemplateRewrite(NodeTransformer):
    """Route loops through ``_iterate`` and ``~`` through ``_concat``."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Call(
            nodes.Name("__llmplane_iterate", "load"), [node.iter], [], None, None
        )
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Call(nodes.Name("__llmplane_concat", "load"), list(node.nodes), [], None, None)


class _Environment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(
        self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any
    ) -> Any:
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and type(times) is int:
                    _check_size(len(seq) * max(times, 0))
            if type(left) is int and type(right) is int:
                _check_bits(left.bit_length() + right.bit_length())
        elif operator == "**":
            if type(left) is int and type(right) is int and abs(left) > 1:
                _check_bits(left.bit_length() * right)
        elif operator == "+":
            if isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
                _check_size(len(left) + len(right))
        elif operator == "%" and isinstance(left, str) and _WIDE.search(left):
            raise TemplateRefused("the chat template formats with a width too large")
        return _checked(super().call_binop(context, operator, left, right))

    def call(
        __self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any
    ) -> Any:
        _charge()
        if isinstance(getattr(__obj, "__self__", None), str | list | tuple):
            _check_args((*args, *kwargs.values()))  # 'x'.ljust(n), 'x'.zfill(n), ...
        return _checked(super().call(__context, __obj, *args, **kwargs))

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        # The sandbox would render an unsafe attribute as empty; a model's template that
        # reaches for one is refused instead.
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r}")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is not None and _WIDE.search(getattr(value, "__self__", "")):
            raise TemplateRefused("the chat template formats with a width too large")
        return wrapped


class _GenerationTag(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}`` (it marks the assistant's
    tokens when asked to; for rendering it is its body)."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' own: jinja's would escape HTML characters and sort keys.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> _Environment:
    env = _Environment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["__llmplane_iterate"] = _iterate
    env.globals["__llmplane_concat"] = _concat
    return env


def _loops_over_content(tree: nodes.Template) -> bool:
    """vLLM's content-format detection, for the usual shapes: a template that loops over a
    message's ``content`` gets the OpenAI form (a list of parts), others a string."""
    message_vars = {
        loop.target.name
        for loop in tree.find_all(nodes.For)
        if isinstance(loop.target, nodes.Name) and _names(loop.iter, "messages")
    }
    for loop in tree.find_all(nodes.For):
        it = loop.iter
        while isinstance(it, nodes.Filter) and it.node is not None:
            it = it.node
        if isinstance(it, nodes.Getitem) and isinstance(it.arg, nodes.Const):
            key, base = it.arg.value, it.node
        elif isinstance(it, nodes.Getattr):
            key, base = it.attr, it.node
        else:
            if isinstance(it, nodes.Name) and it.name == "content":
                return True
            continue
        if key == "content" and isinstance(base, nodes.Name) and base.name in message_vars:
            return True
    return False


def _names(node: nodes.Node, name: str) -> bool:
    return any(n.name == name for n in node.find_all(nodes.Name)) or (
        isinstance(node, nodes.Name) and node.name == name
    )


class ChatTemplate:
    """One compiled chat template; ``render`` is transformers' render of it."""

    def __init__(self, source: str) -> None:
        if not isinstance(source, str) or len(source) > MAX_TEMPLATE:
            raise TemplateRefused(
                f"the chat template is not text of at most {MAX_TEMPLATE} characters"
            )
        self.source = source
        env = _environment()
        try:  # the template as written (its variables, its loops), and the one that runs
            tree = env.parse(source)
            self.variables = frozenset(meta.find_undeclared_variables(tree))
            self.openai_content = _loops_over_content(tree)
            self.template = env.from_string(_TemplateRewrite().visit(env.parse(source)))
        except jinja2.TemplateError as err:
            raise TemplateRefused(f"the chat template does not compile: {err}") from None

    def render(self, **variables: Any) -> str:
        """The rendered text; ``TemplateRefused`` past a bound, ``NoTokenIds`` when the template
        refuses the input (``raise_exception``)."""
        token = _budget.set(_Budget())
        try:
            out: list[str] = []
            size = 0
            for chunk in self.template.generate(**variables):
                size += len(chunk)
                if size > MAX_OUTPUT:
                    raise TemplateRefused(
                        f"the chat template rendered more than {MAX_OUTPUT} characters"
                    )
                out.append(chunk)
            return "".join(out)
        except SecurityError as err:
            raise TemplateRefused(f"the chat template broke the sandbox's rules: {err}") from None
        except jinja2.TemplateError as err:  # raise_exception: the template refuses this input
            raise NoTokenIds(f"the chat template refused the request: {err}") from None
        except NoTokenIds:
            raise
        except Exception as err:  # a template that fails on this input, or recursion
            raise TemplateRefused(
                f"the chat template failed: {type(err).__name__}: {err}"
            ) from None
        finally:
            _budget.reset(token)
