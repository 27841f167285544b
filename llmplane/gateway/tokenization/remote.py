"""Token ids from the engine itself (vLLM's ``POST /tokenize``), for models whose files the
gateway does not have (a remote Endpoint, a pod on another node).

The answer for one request text is cached (keyed by a hash of the /tokenize body, or by the
caller's key for a request's leading part, ``prefix.py``), so a retried request or a burst of
the same prompt costs one round trip; concurrent asks for the same text share it. Every ask has
a timeout and a bound on the answer's size; whatever goes wrong, the answer is ``None`` ("no
token ids": the precise prefix scorer then contributes nothing), never an error to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp
import orjson
from xxhash import xxh3_128_digest

from llmplane.aio import read_bounded
from llmplane.gateway.tokenization.lru import LRU
from llmplane.gateway.tokenization.model import one_prompt

log = logging.getLogger("llmplane.gateway.tokenization")

MAX_ANSWER = 16 << 20  # bytes of one /tokenize answer
# The fields of a chat or completion request that change its tokens (vLLM's /tokenize schema).
CHAT_FIELDS = (
    "messages", "add_generation_prompt", "continue_final_message", "add_special_tokens",
    "chat_template_kwargs", "tools",
)  # fmt: skip
COMPLETION_FIELDS = ("prompt", "add_special_tokens")


def tokenize_body(model: str, doc: dict[str, Any], chat: bool) -> dict[str, Any] | None:
    """The /tokenize body that gives a chat or completion request's ids; None when /tokenize
    cannot say (a batch of prompts, a chat template sent with the request)."""
    if chat:
        if not isinstance(doc.get("messages"), list) or doc.get("chat_template") is not None:
            return None
        fields = CHAT_FIELDS
    else:
        prompt = one_prompt(doc)
        if not isinstance(prompt, str):
            return None
        doc = {**doc, "prompt": prompt}
        fields = COMPLETION_FIELDS
    # vLLM's defaults written out, so that equal requests make equal bodies (and cache keys).
    body: dict[str, Any] = {"model": model, "add_special_tokens": not chat}
    if chat:
        body.update(add_generation_prompt=True, continue_final_message=False)
    body.update((k, doc[k]) for k in fields if doc.get(k) is not None)
    return body


class RemoteTokenizer:
    """Asks an engine's /tokenize, with a cache of answers."""

    def __init__(
        self, timeout: float = 0.5, max_entries: int = 4096, max_ids: int = 8 << 20
    ) -> None:
        self.timeout = timeout
        # Answers by key (a body's ``key``, or one the caller chose), bounded in ids too.
        self.cache: LRU[bytes, list[int]] = LRU(max_entries, max_ids, lambda _, ids: len(ids))
        self.asks = 0  # round trips made (tests, debugging)
        self.failures = 0
        self.pending: dict[bytes, asyncio.Task[list[int] | None]] = {}  # by key, on their way
        self._session: aiohttp.ClientSession | None = None

    @staticmethod
    def key(body: dict[str, Any]) -> bytes:
        return xxh3_128_digest(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))

    def fetch(
        self, address: str, body: dict[str, Any], key: bytes | None = None
    ) -> asyncio.Task[list[int] | None]:
        """The round trip that caches the ids the engine at ``address`` gives ``body`` under
        ``key`` (by default the body's own), started unless one is on its way. It runs on after
        its askers stop waiting (``close`` cancels it); None on any failure."""
        key = self.key(body) if key is None else key
        task = self.pending.get(key)
        if task is None:
            task = self.pending[key] = asyncio.ensure_future(self._answer(key, address, body))
            task.add_done_callback(lambda _: self.pending.pop(key, None))
        return task

    async def _answer(self, key: bytes, address: str, body: dict[str, Any]) -> list[int] | None:
        ids = await self.ask(address, body)
        if ids is not None:
            self.cache.put(key, ids)
        return ids

    async def ask(self, address: str, body: dict[str, Any]) -> list[int] | None:
        """One /tokenize round trip, uncached."""
        self.asks += 1
        try:
            async with asyncio.timeout(self.timeout):
                async with self._client().post(
                    f"http://{address}/tokenize",
                    data=orjson.dumps(body),
                    headers={"Content-Type": "application/json"},
                ) as resp:
                    data = await read_bounded(resp, MAX_ANSWER)
                    if resp.status != 200:
                        raise ValueError(f"HTTP {resp.status}: {data[:200]!r}")
            tokens = orjson.loads(data).get("tokens")
            if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
                raise ValueError("the answer has no list of token ids")
            return tokens
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError, AttributeError) as err:
            self.failures += 1
            log.debug("tokenize at %s failed: %s", address, err)
            return None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(skip_auto_headers=("User-Agent",))
        return self._session

    async def close(self) -> None:
        tasks = list(self.pending.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            with contextlib.suppress(Exception):
                await self._session.close()
            self._session = None
