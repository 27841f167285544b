"""LoRA adapters as a lifecycle: loaded on demand onto a replica chosen by affinity, unloaded
least recently used (the rules: docs/gateway.md, "Routing", LoRA adapters). Off the hot path:
only a request for a declared adapter that no replica holds comes here (``RouteDecision.load``);
loads of one adapter are serialised, so concurrent first requests wait for one load.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

import aiohttp

from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.playgrounds import DeclaredAdapter, adapters_on
from llmplane.gateway.registry import EndpointState
from llmplane.gateway.scraper import MODELS_CHANGED_AT

log = logging.getLogger("llmplane.gateway")

LOAD_TIMEOUT = 120.0  # loading reads the adapter's weights


class Adapters:
    """What this gateway loaded where, and when each was last used."""

    def __init__(self, session: Callable[[], aiohttp.ClientSession]) -> None:
        self._session = session
        self.loaded: dict[str, dict[str, float]] = {}  # address -> adapter -> last use
        self._locks: dict[str, asyncio.Lock] = {}

    def touch(self, address: str, adapter: str) -> None:
        """A request for ``adapter`` was sent to ``address`` (keeps it off the LRU end)."""
        used = self.loaded.get(address)
        if used is not None and adapter in used:
            used[adapter] = time.monotonic()

    def forget(self, address: str) -> None:
        self.loaded.pop(address, None)

    async def ensure(
        self, adapter: DeclaredAdapter, candidates: Sequence[EndpointState]
    ) -> list[EndpointState]:
        """The candidates that hold ``adapter``, loading it onto one of them if none does."""
        if not candidates:
            raise GatewayError(
                503, f"no ready replica of {adapter.base!r} to load adapter {adapter.name!r} onto",
                ErrorCode.NO_READY_ENDPOINT,
            )  # fmt: skip
        lock = self._locks.setdefault(adapter.name, asyncio.Lock())
        async with lock:
            holding = [s for s in candidates if adapter.name in (s.served_models or ())]
            if holding:
                return holding
            target = self.place(candidates)
            await self._make_room(target)
            await self._post(
                target,
                "/v1/load_lora_adapter",
                {"lora_name": adapter.name, "lora_path": adapter.path},
                f"loading LoRA adapter {adapter.name!r}",
                already="already been loaded",  # our model list was behind the engine's
            )
            target.served_models = frozenset({*(target.served_models or ()), adapter.name})
            target.extra[MODELS_CHANGED_AT] = time.monotonic()
            self.loaded.setdefault(target.address, {})[adapter.name] = time.monotonic()
            log.info("loaded LoRA adapter %s on %s", adapter.name, target.address)
            return [target]

    @staticmethod
    def place(candidates: Sequence[EndpointState]) -> EndpointState:
        """LoRA affinity: a free adapter slot first, then the least busy."""

        def key(s: EndpointState) -> tuple[int, float]:
            full = bool(s.max_lora) and len(adapters_on(s)) >= s.max_lora
            return (1 if full else 0, s.inflight + s.waiting + s.running)

        return min(candidates, key=key)

    async def _make_room(self, target: EndpointState) -> None:
        if not target.max_lora or len(adapters_on(target)) < target.max_lora:
            return
        mine = {
            a: t for a, t in self.loaded.get(target.address, {}).items() if a in adapters_on(target)
        }
        busy = target.lora_running | target.lora_waiting
        idle = {a: t for a, t in mine.items() if a not in busy} or mine
        if not idle:
            return  # only adapters it was started with: vLLM evicts from its own cache
        victim = min(idle, key=idle.__getitem__)
        await self._post(
            target,
            "/v1/unload_lora_adapter",
            {"lora_name": victim},
            f"unloading LoRA adapter {victim!r}",
            already="cannot be found",
        )
        self.loaded[target.address].pop(victim, None)
        target.served_models = frozenset(set(target.served_models or ()) - {victim})
        target.extra[MODELS_CHANGED_AT] = time.monotonic()
        log.info("unloaded LoRA adapter %s from %s (least recently used)", victim, target.address)

    async def _post(
        self, target: EndpointState, path: str, body: dict, what: str, already: str = ""
    ) -> None:
        """POST to the engine's adapter API; an error whose text contains ``already`` (the
        engine is already in the wanted state) counts as done."""
        try:
            async with self._session().post(
                f"http://{target.address}{path}",
                json=body,
                timeout=aiohttp.ClientTimeout(total=LOAD_TIMEOUT),
            ) as resp:
                if resp.status >= 400:
                    text = (await resp.content.read(300)).decode(errors="replace")
                    if already and already in text:
                        return
                    raise GatewayError(
                        502, f"{what} on {target.address} failed: HTTP {resp.status} {text}",
                        ErrorCode.ADAPTER_LOAD_FAILED,
                    )  # fmt: skip
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise GatewayError(
                502, f"{what} on {target.address} failed: {err or type(err).__name__}",
                ErrorCode.ADAPTER_LOAD_FAILED,
            ) from None  # fmt: skip
