"""Per model, where the gateway gets the engine's token ids: the model's own files when an
endpoint says where they are (``Endpoint.model_path``, set by the embedded runtime), else the
engine's ``/tokenize``. And the start-up check that the two agree.

``token_ids(request)`` is what the precise prefix-cache scorer reads (synchronously, while
scheduling): local tokenization, or the cached answer of the engine's /tokenize, which
``prepare(request)`` fetches beforehand for models without files (the gateway calls it before
scheduling and waits at most ``PREPARE_WAIT`` for it: a slower answer is kept for the next
request of the same text, and this one is scored without token ids). For a request whose
body is not cached, the cached answer of its longest leading part (a run of a chat's messages,
a completion prompt's first characters) serves at once (``LeadingIds``, ``prefix.py``):
``prepare`` then does not wait, and asks, next to the whole body, one leading part (one more
round trip at most) for the requests that follow. Each whole answer that arrives is checked
against the leading ids its request could use: a model that fails it (a template that renders
earlier messages according to later ones) counts in
``llmplane_gateway_tokenizer_prefix_mismatch_total{model}`` and from then on uses only the run
of its chats' system messages (templates render those first whatever follows: a Qwen3-style
template renders the answers after the last user message otherwise), and whole answers only
after a second failure (completions: after the first). ``learn(endpoints)`` follows
discovery: it loads a model's tokenizer the first time one of its endpoints names the files
(in a thread: a large tokenizer.json takes a moment) and then checks one canary prompt, chat
and completion, against that endpoint's /tokenize. A mismatch counts in
``llmplane_gateway_tokenizer_mismatch_total{model}``, logs a warning with both id lists'
lengths and where they part, and the model's tokens then come from the engine's /tokenize
(slower, but the engine's). An engine that does not answer /tokenize leaves the check
undecided (logged); it is tried again when the endpoints change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from llmplane.gateway.observability import Counter
from llmplane.gateway.tokenization.model import ModelTokenizer, NoTokenIds, TokenizerUnavailable
from llmplane.gateway.tokenization.prefix import LeadingIds, Runs, kept, leading_runs
from llmplane.gateway.tokenization.remote import RemoteTokenizer, tokenize_body
from llmplane.gateway.tokenization.template import TemplateRefused
from llmplane.runtime.endpoint import Endpoint

log = logging.getLogger("llmplane.gateway.tokenization")

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
COMPLETION_PATHS = frozenset({"/v1/completions", "/completions"})
CANARY_CHAT = {
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello! What is 2+2? Answer briefly, please."},
    ],
    "add_generation_prompt": True,
}
CANARY_PROMPT = {"prompt": "The quick brown fox jumps over the lazy dog. 0123456789 ?!"}
# How long a request waits for the engine's /tokenize before it is scheduled without token ids.
PREPARE_WAIT = 0.1
SEEN = 16_384  # keys of completion prompts' leading texts remembered (about 2 MB)


class TokenIdSource(Protocol):
    """What the precise prefix-cache scorer needs: the engine's ids for a request, or None."""

    def token_ids(self, request: Any, model: str | None = None) -> list[int] | None: ...


def request_kind(path: str) -> bool | None:
    """True for a chat request, False for a completion, None for anything else."""
    path = path.partition("?")[0]
    if path in CHAT_PATHS:
        return True
    if path in COMPLETION_PATHS:
        return False
    return None


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

    def __init__(
        self,
        timeout: float = 0.5,
        remote: RemoteTokenizer | None = None,
        prepare_wait: float = PREPARE_WAIT,
    ) -> None:
        self.models: dict[str, _Model] = {}
        self.remote = remote or RemoteTokenizer(timeout=timeout)
        self.prepare_wait = prepare_wait
        self._asked = 0  # requests prepared: which of a model's engines answers next
        # Round trips that run on after their request stopped waiting (cancelled by ``close``).
        self.fetches: set[asyncio.Future[list[int] | None]] = set()
        # Keys of the leading texts of recent completion prompts: a text two prompts start
        # with is the one to ask (``_part_to_ask``).
        self._seen: OrderedDict[bytes, None] = OrderedDict()
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
        """Follow the endpoints: per served model name its files and addresses; load the
        tokenizer of files seen for the first time and check its canary."""
        seen: dict[str, _Model] = {}
        for endpoint in endpoints:
            for name in sorted(endpoint.served_names()):
                model = seen.setdefault(name, _Model())
                if endpoint.model_path and not model.path:
                    model.path = endpoint.model_path
                if endpoint.address:
                    model.addresses.append(endpoint.address)
        for name, new in seen.items():
            old = self.models.get(name)
            if old is not None:
                new.prefixes = old.prefixes
            if old is not None and old.loaded_from == new.path:
                new.tokenizer, new.loaded_from, new.canary = (
                    old.tokenizer,
                    old.loaded_from,
                    old.canary,
                )
            self.models[name] = new
        for name in list(self.models):
            if name not in seen:
                del self.models[name]
        for name, model in list(self.models.items()):
            if model.path and model.loaded_from != model.path:
                await self._load(name, model)
            elif model.tokenizer is not None and model.canary == "undecided" and model.addresses:
                await self.check_canary(name, model.addresses[0])  # the engine may answer now

    async def _load(self, name: str, model: _Model) -> None:
        path = model.path
        model.loaded_from = path
        twin = next(
            (m for m in self.models.values() if m is not model and m.loaded_from == path),
            None,
        )
        if twin is not None and twin.tokenizer is not None:
            # Another name of the same model (its served name and its model-name label).
            model.tokenizer, model.canary = twin.tokenizer, twin.canary
            return
        try:
            tokenizer = await asyncio.to_thread(ModelTokenizer.load, path)
        except TokenizerUnavailable as err:
            log.info("model %s: no tokenizer in its files (%s); asking the engine", name, err)
            model.canary = "no-files"
            return
        try:
            sample = tokenizer.render_chat(CANARY_CHAT) if tokenizer.templates else "x"
        except (NoTokenIds, TemplateRefused) as err:
            log.warning("model %s: its chat template fails on the canary prompt: %s", name, err)
            sample = CANARY_PROMPT["prompt"]
        if not tokenizer.pieces.check(sample):
            log.info("model %s: its tokenizer encodes whole texts (no piece cache)", name)
        model.tokenizer = tokenizer
        if model.addresses:
            await self.check_canary(name, model.addresses[0])

    async def check_canary(self, name: str, address: str) -> bool | None:
        """Compare the model's local ids for the canary prompts with the engine's /tokenize at
        ``address``: True when they agree, False on a mismatch (counted, logged, and the
        model's local tokenizer set aside), None when the engine could not say."""
        model = self.models.get(name)
        if model is None or model.tokenizer is None:
            return None
        tokenizer = model.tokenizer
        verdict: bool | None = None
        for doc, chat in ((CANARY_CHAT, True), (CANARY_PROMPT, False)):
            if chat and not tokenizer.templates:
                continue
            try:
                local = tokenizer.chat_ids(doc) if chat else tokenizer.completion_ids(doc)
            except (NoTokenIds, TemplateRefused):
                continue  # logged when loaded; such requests get no ids
            body = tokenize_body(name, doc, chat)
            assert body is not None
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
                model.canary = "mismatch"
                model.tokenizer = None
                return False
            verdict = True
        if verdict:
            self.mismatch.labels(name)  # the series exists (at 0) once a check agreed
        model.canary = "match" if verdict else "undecided"
        if verdict is None:
            log.info(
                "model %s: the engine at %s did not answer /tokenize; canary undecided",
                name,
                address,
            )
        return verdict

    # -- requests ----------------------------------------------------------------------------

    def token_ids(self, request: Any, model: str | None = None) -> list[int] | None:
        """The engine's ids for ``request`` (an ``InferenceRequest``: ``path``, ``doc``,
        ``model``), ``model`` being the served name when a route renamed it; None when
        unknown."""
        chat = request_kind(request.path)
        name = model or request.model
        entry = self.models.get(name)
        if chat is None or entry is None:
            return None
        if entry.tokenizer is not None:
            try:
                if chat:
                    return entry.tokenizer.chat_ids(request.doc)
                return entry.tokenizer.completion_ids(request.doc)
            except (NoTokenIds, TemplateRefused) as err:
                log.debug("model %s: no token ids: %s", name, err)
                return None
            except Exception as err:  # whatever a request holds, routing goes on without ids
                log.warning("model %s: tokenizing a request failed: %r", name, err)
                return None
        if not chat and _id_prompt(request.doc):
            return request.doc["prompt"]
        body = tokenize_body(name, request.doc, chat)
        if body is None:
            return None
        ids = self.remote.cached(body)
        if ids is None:
            return self._leading(_runs(entry, body, chat))
        return ids

    def _leading(self, runs: Runs | None) -> LeadingIds | None:
        """The ids of a request's longest leading part whose answer is cached, less the safety
        tail (``prefix.py``); None when there is none."""
        if runs is None:
            return None
        for key, size in zip(runs.keys, runs.sizes, strict=True):
            ids = self.remote.get(key)
            if ids is not None:
                n = kept(ids)
                if not n:
                    return None
                # The whole prompt's tokens, estimated from the part's by their sizes.
                return LeadingIds(ids[:n], -(-len(ids) * runs.size // max(size, 1)))
        return None

    def _part_to_ask(self, runs: Runs, chat: bool) -> int | None:
        """Which of a request's leading parts to ask /tokenize for (None: none): a chat's
        messages but the last; a prompt's longest leading text another recent prompt had
        too (where prompts share a text up to where they part), else its longest one (for a
        prompt that extends it). Not one cached or on its way."""
        i = 0
        if not chat:
            i = next((j for j, key in enumerate(runs.keys) if key in self._seen), 0)
            for key in runs.keys:
                self._seen[key] = None
                self._seen.move_to_end(key)
            while len(self._seen) > SEEN:
                self._seen.popitem(last=False)
        key = runs.keys[i]
        if self.remote.get(key) is not None or self.remote.asking(key):
            return None
        return i

    async def prepare(self, request: Any, model: str | None = None) -> bool:
        """For a model without local files: fetch the engine's ids into the cache that
        ``token_ids`` reads, waiting at most ``prepare_wait`` (the fetch goes on for the next
        request of the same text, bounded by the remote timeout). True when the ids are there
        now; failures leave none. The model's engines answer in turn."""
        chat = request_kind(request.path)
        name = model or request.model
        entry = self.models.get(name)
        if chat is None or entry is None or entry.tokenizer is not None or not entry.addresses:
            return False
        if not chat and _id_prompt(request.doc):
            return False
        body = tokenize_body(name, request.doc, chat)
        if body is None:
            return False
        if self.remote.cached(body) is not None:
            return True
        self._asked += 1
        address = entry.addresses[self._asked % len(entry.addresses)]
        runs = _runs(entry, body, chat)
        leading = self._leading(runs)
        fetch = self._start(self._fetch(name, address, body, chat, leading))
        part = None if runs is None else self._part_to_ask(runs, chat)
        if part is not None:  # a leading part, for the requests that follow
            self._start(self.remote.tokenize(address, runs.body(part), runs.keys[part]))
        if leading is not None:
            return True  # scored with the leading ids now, without waiting
        done, _ = await asyncio.wait((fetch,), timeout=self.prepare_wait)
        if fetch in done and fetch.result() is not None:
            return True
        return self._leading(runs) is not None  # a leading answer came first

    def _start(self, coro: Any) -> asyncio.Future[list[int] | None]:
        """A fetch that runs on after the request stops waiting (cancelled by ``close``)."""
        fetch = asyncio.ensure_future(coro)
        self.fetches.add(fetch)
        fetch.add_done_callback(self.fetches.discard)
        return fetch

    async def _fetch(
        self,
        name: str,
        address: str,
        body: dict[str, Any],
        chat: bool,
        leading: LeadingIds | None,
    ) -> list[int] | None:
        """The whole body's ids, checked against the leading ids the request could use: on a
        mismatch a model's chats use only their system messages' run, then none."""
        ids = await self.remote.tokenize(address, body)
        if ids is not None and leading is not None and ids[: len(leading)] != leading:
            entry = self.models.get(name)
            if entry is not None and entry.prefixes[chat] != "off":
                mode = "system" if chat and entry.prefixes[chat] == "all" else "off"
                entry.prefixes[chat] = mode
                self.prefix_mismatch.labels(name).inc()
                log.warning(
                    "model %s: a request's ids from /tokenize at %s do not start with the ids "
                    "of its leading part (%d ids against %d, first difference at %d): its chat "
                    "template renders earlier messages according to later ones, or its "
                    "tokenizer merges across a cut; %s",
                    name, address, len(ids), len(leading), _parting(leading, ids),
                    "using only the ids of its chats' system messages" if mode == "system"
                    else f"using whole {'chat' if chat else 'completion'} answers only",
                )  # fmt: skip
        return ids

    async def close(self) -> None:
        for fetch in list(self.fetches):
            fetch.cancel()
        if self._learning is not None:
            self._learning.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._learning
            self._learning = None
        await self.remote.close()


def _id_prompt(doc: dict[str, Any]) -> bool:
    prompt = doc.get("prompt")
    return isinstance(prompt, list) and bool(prompt) and all(type(i) is int for i in prompt)


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
