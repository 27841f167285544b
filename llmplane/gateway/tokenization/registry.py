"""Per served model name, where the gateway gets the engine's token ids (docs/gateway.md,
"Tokenization"): the model's own files when an endpoint names them (``Endpoint.model_path``),
checked against the engine's /tokenize with canary prompts; else the engine's /tokenize, asked
before scheduling (``prepare``) and cached whole and by leading part (``prefix.py``), each
whole answer checked against the leading ids its request could use."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from llmplane.gateway.observability import Counter
from llmplane.gateway.tokenization.lru import LRU
from llmplane.gateway.tokenization.model import (
    CANARY_CHAT,
    CANARY_PROMPT,
    ModelTokenizer,
    NoTokenIds,
    TokenizerUnavailable,
    one_prompt,
)
from llmplane.gateway.tokenization.prefix import LeadingIds, Runs, kept, leading_runs
from llmplane.gateway.tokenization.remote import RemoteTokenizer, tokenize_body
from llmplane.runtime.endpoint import Endpoint

log = logging.getLogger("llmplane.gateway.tokenization")

# Request path -> chat (True) or completion (False); other paths have no token ids here.
KINDS = {
    "/v1/chat/completions": True, "/chat/completions": True,
    "/v1/completions": False, "/completions": False,
}  # fmt: skip
# How long a request waits for the engine's /tokenize before it is scheduled without token ids.
PREPARE_WAIT = 0.1
SEEN = 16_384  # keys of completion prompts' leading texts remembered (about 2 MB)


@dataclass
class _Model:
    path: str = ""  # the model's files, if an endpoint named them
    addresses: list[str] = field(default_factory=list)  # endpoints that may serve /tokenize
    tokenizer: ModelTokenizer | None = None
    loaded_from: str = ""  # the path ``tokenizer`` came from ("" while none)
    canary: str = "unchecked"  # unchecked | match | mismatch | undecided | no-files
    # Which leading parts requests may use (``prefix.py``): "all", "system" (a chat's system
    # messages only, after a failed check) or "off"; per kind (chat: True, completion: False).
    prefixes: dict[bool, str] = field(default_factory=lambda: {True: "all", False: "all"})


class Tokenization:
    """The gateway's token ids per model (see the module's docstring)."""

    def __init__(self, timeout: float = 0.5, prepare_wait: float = PREPARE_WAIT) -> None:
        self.models: dict[str, _Model] = {}
        self.remote = RemoteTokenizer(timeout=timeout)
        self.prepare_wait = prepare_wait
        self._asked = 0  # requests prepared: which of a model's engines answers next
        # Keys of recent completion prompts' leading texts (``_part_to_ask``).
        self._seen: LRU[bytes, None] = LRU(max_entries=SEEN)
        self._learning: asyncio.Task[None] | None = None
        self._next: list[Endpoint] | None = None  # endpoints that came while learning
        self.mismatch = Counter(
            "llmplane_gateway_tokenizer_mismatch",
            "Canary prompts whose token ids from the model's files differ from the engine's "
            "/tokenize (the model's tokens then come from /tokenize)",
            ("model",),
        )
        self.prefix_mismatch = Counter(
            "llmplane_gateway_tokenizer_prefix_mismatch",
            "Requests of a model whose /tokenize ids did not start with the ids of their "
            "leading part (the model's chats then use only their system messages' ids, then "
            "none; completions none)",
            ("model",),
        )

    def metrics(self) -> list[Counter]:
        """For ``GatewayMetrics.add``."""
        return [self.mismatch, self.prefix_mismatch]

    # -- discovery ---------------------------------------------------------------------------

    def follow(self, endpoints: Iterable[Endpoint]) -> None:
        """``learn`` in the background (from discovery's callback, on the event loop); changes
        that come while it runs are learnt after it, the latest only."""
        self._next = list(endpoints)
        if self._learning is None or self._learning.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a synchronous caller): learnt on the next change
                return
            self._learning = loop.create_task(self._follow(), name="tokenization: learn endpoints")

    async def _follow(self) -> None:
        while self._next is not None:
            endpoints, self._next = self._next, None
            try:
                await self.learn(endpoints)
            except Exception:  # a bug here must not stop routing
                log.exception("tokenization: learning the endpoints failed")

    async def learn(self, endpoints: Iterable[Endpoint]) -> None:
        """Per served model name its files and addresses; the tokenizer of files seen for the
        first time loaded (in a thread: a large tokenizer.json takes a moment) and checked."""
        seen: dict[str, _Model] = {}
        for endpoint in endpoints:
            for name in sorted(endpoint.served_names()):
                model = seen.setdefault(name, _Model())
                model.path = model.path or endpoint.model_path
                if endpoint.address:
                    model.addresses.append(endpoint.address)
        for name, new in seen.items():
            old = self.models.get(name)
            if old is not None:
                new.prefixes = old.prefixes
                if old.loaded_from == new.path:
                    new.tokenizer, new.loaded_from, new.canary = (
                        old.tokenizer, old.loaded_from, old.canary
                    )  # fmt: skip
        self.models = seen
        for name, model in list(seen.items()):
            if model.path and model.loaded_from != model.path:
                await self._load(name, model)
            elif model.tokenizer is not None and model.canary == "undecided" and model.addresses:
                await self.check_canary(name, model.addresses[0])  # the engine may answer now

    async def _load(self, name: str, model: _Model) -> None:
        model.loaded_from = path = model.path
        twin = next(
            (m for m in self.models.values() if m is not model and m.loaded_from == path), None
        )
        if twin is not None and twin.tokenizer is not None:
            # Another name of the same model (its served name and its model-name label).
            model.tokenizer, model.canary = twin.tokenizer, twin.canary
            return
        try:
            model.tokenizer = await asyncio.to_thread(ModelTokenizer.load, path)
        except TokenizerUnavailable as err:
            log.info("model %s: no tokenizer in its files (%s); asking the engine", name, err)
            model.canary = "no-files"
            return
        if model.addresses:
            await self.check_canary(name, model.addresses[0])

    async def check_canary(self, name: str, address: str) -> bool | None:
        """Compare the model's local ids for the canary prompts with the engine's /tokenize at
        ``address``: True when they agree, False on a mismatch (counted, logged, and the
        model's local tokenizer set aside), None when the engine could not say."""
        model = self.models.get(name)
        if model is None or model.tokenizer is None:
            return None
        verdict: bool | None = None
        for doc, chat in ((CANARY_CHAT, True), (CANARY_PROMPT, False)):
            local = _local_ids(name, model.tokenizer, doc, chat)
            body = tokenize_body(name, doc, chat)
            if local is None or body is None:
                continue  # logged when loaded; such requests get no ids
            engine = await self.remote.ask(address, body)
            if engine is None:
                continue
            if engine != local:
                log.warning(
                    "model %s: the gateway's %s token ids differ from the engine's /tokenize at "
                    "%s (%d ids against %d, first difference at %d); using the engine's "
                    "/tokenize for this model",
                    name, "chat" if chat else "completion", address, len(local), len(engine),
                    _parting(local, engine),
                )  # fmt: skip
                self.mismatch.labels(name).inc()
                model.canary, model.tokenizer = "mismatch", None
                return False
            verdict = True
        if verdict:
            self.mismatch.labels(name)  # the series exists (at 0) once a check agreed
        else:
            log.info("model %s: the engine at %s did not answer /tokenize; canary undecided",
                     name, address)  # fmt: skip
        model.canary = "match" if verdict else "undecided"
        return verdict

    # -- requests ----------------------------------------------------------------------------

    def token_ids(self, request: Any, model: str | None = None) -> list[int] | None:
        """The engine's ids for an ``InferenceRequest`` (``model``: the served name when a
        route renamed it), or None: the local tokenizer's, a token-id prompt, else the cached
        /tokenize answer for the request or its longest leading part."""
        found = self._find(request, model)
        if found is None:
            return None
        name, entry, chat = found
        if entry.tokenizer is not None:
            return _local_ids(name, entry.tokenizer, request.doc, chat)
        if not chat and isinstance(prompt := one_prompt(request.doc), list):
            return prompt
        body = tokenize_body(name, request.doc, chat)
        if body is None:
            return None
        ids = self.remote.cache.get(RemoteTokenizer.key(body))
        return ids if ids is not None else self._leading(_runs(entry, body, chat))

    async def prepare(self, request: Any, model: str | None = None) -> bool:
        """For a model without local files: fetch the engine's ids into the cache that
        ``token_ids`` reads, waiting at most ``prepare_wait`` (a late answer serves the next
        request of the same text), and one leading part for the requests that follow. True
        when ids are there now. The model's engines answer in turn."""
        found = self._find(request, model)
        if found is None:
            return False
        name, entry, chat = found
        if entry.tokenizer is not None or not entry.addresses:
            return False
        body = tokenize_body(name, request.doc, chat)
        if body is None:
            return False
        key = RemoteTokenizer.key(body)
        if self.remote.cache.get(key) is not None:
            return True
        self._asked += 1
        address = entry.addresses[self._asked % len(entry.addresses)]
        runs = _runs(entry, body, chat)
        leading = self._leading(runs)
        fetch = self.remote.fetch(address, body, key)
        part = None if runs is None else self._part_to_ask(runs, chat)
        if part is not None:  # for the requests that follow
            self.remote.fetch(address, runs.body(part), runs.keys[part])
        if leading is not None:  # scored with the leading ids now, without waiting
            fetch.add_done_callback(lambda f: self._check(name, address, chat, leading, f))
            return True
        done, _ = await asyncio.wait((fetch,), timeout=self.prepare_wait)
        if fetch in done and fetch.result() is not None:
            return True
        return self._leading(runs) is not None  # a leading answer came first

    def _find(self, request: Any, model: str | None) -> tuple[str, _Model, bool] | None:
        """The served name, its model and whether the request is a chat."""
        chat = KINDS.get(request.path.partition("?")[0])
        name = model or request.model
        entry = self.models.get(name)
        return None if chat is None or entry is None else (name, entry, chat)

    def _leading(self, runs: Runs | None) -> LeadingIds | None:
        """The ids of a request's longest leading part whose answer is cached, less the safety
        tail (``prefix.py``); None when there is none."""
        if runs is None:
            return None
        for key, size in zip(runs.keys, runs.sizes, strict=True):
            ids = self.remote.cache.get(key)
            if ids is not None:
                n = kept(ids)
                # The whole prompt's tokens, estimated from the part's by their sizes.
                return LeadingIds(ids[:n], -(-len(ids) * runs.size // max(size, 1))) if n else None
        return None

    def _part_to_ask(self, runs: Runs, chat: bool) -> int | None:
        """Which of a request's leading parts to ask /tokenize for (None: none): a chat's
        messages but the last; a prompt's longest leading text another recent prompt had
        too (where prompts share a text up to where they part), else its longest one (for a
        prompt that extends it). Not one cached (one on its way is not asked twice: ``fetch``)."""
        i = 0
        if not chat:
            i = next((j for j, key in enumerate(runs.keys) if key in self._seen), 0)
            for key in runs.keys:
                self._seen.put(key, None)
        return None if self.remote.cache.get(runs.keys[i]) is not None else i

    def _check(
        self, name: str, address: str, chat: bool, leading: LeadingIds, fetch: asyncio.Task[Any]
    ) -> None:
        """A request's whole answer against the leading ids it was scored with: on a mismatch
        a model's chats use only their system messages' run, then none."""
        ids = None if fetch.cancelled() or fetch.exception() else fetch.result()
        if ids is None or ids[: len(leading)] == leading:
            return
        entry = self.models.get(name)
        if entry is not None and entry.prefixes[chat] != "off":
            mode = "system" if chat and entry.prefixes[chat] == "all" else "off"
            entry.prefixes[chat] = mode
            self.prefix_mismatch.labels(name).inc()
            log.warning(
                "model %s: a request's ids from /tokenize at %s do not start with the ids of its "
                "leading part (%d ids against %d, first difference at %d): its chat template "
                "renders earlier messages according to later ones, or its tokenizer merges "
                "across a cut; %s",
                name, address, len(ids), len(leading), _parting(leading, ids),
                "using only the ids of its chats' system messages" if mode == "system"
                else f"using whole {'chat' if chat else 'completion'} answers only",
            )  # fmt: skip

    async def close(self) -> None:
        if self._learning is not None:
            self._learning.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._learning
            self._learning = None
        await self.remote.close()


def _local_ids(
    name: str, tokenizer: ModelTokenizer, doc: dict[str, Any], chat: bool
) -> list[int] | None:
    try:
        return tokenizer.chat_ids(doc) if chat else tokenizer.completion_ids(doc)
    except NoTokenIds as err:
        log.debug("model %s: no token ids: %s", name, err)
    except Exception as err:  # whatever a request holds, routing goes on without ids
        log.warning("model %s: tokenizing a request failed: %r", name, err)
    return None


def _runs(entry: _Model, body: dict[str, Any], chat: bool) -> Runs | None:
    """The leading parts of a request the model's mode lets it use."""
    mode = entry.prefixes[chat]
    if mode == "off":
        return None
    runs = leading_runs(body, chat)
    return runs.system() if runs is not None and mode == "system" else runs


def _parting(a: list[int], b: list[int]) -> int:
    """Where two id lists part (the shorter one's length when it is a prefix of the other)."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
