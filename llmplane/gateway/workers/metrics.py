"""The workers' private Unix sockets: each answers its peers' commands (its /metrics text, its
part of ``/autoscaling/signals``, ``Seat.handlers``), and the worker that answers a scrape adds
its peers' texts to its own (docs/gateway.md, "Workers": /metrics). A peer that does not
answer within ``timeout`` is left out (Prometheus reads the dip as a counter reset)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("llmplane.gateway")

_SHARED_GAUGE_PREFIXES = ("llmplane_gateway_endpoint_", "llmplane_gateway_model_endpoints")


class MetricsPeer:
    """Worker ``index``'s side of the workers' sockets (``paths``, one per worker): answer on
    its own, ask on the others'."""

    def __init__(self, paths: Sequence[str], index: int, timeout: float = 2.0) -> None:
        self.paths = list(paths)
        self.path = paths[index]
        self.peers = [i for i in range(len(paths)) if i != index]
        self.timeout = timeout
        self._server: asyncio.AbstractServer | None = None

    async def start(
        self,
        render: Callable[[], bytes],
        signals: Callable[[], object] | None = None,
        handlers: dict[bytes, Callable[[bytes], Awaitable[bytes]]] | None = None,
    ) -> None:
        """Answer peers: ``metrics`` -> ``render()`` (Prometheus text), ``signals`` ->
        ``signals()`` as JSON (this worker's part of the autoscaling signals); any other
        command in ``handlers`` gets the rest of the request (up to EOF) and answers."""

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                what = (await reader.readline()).strip()
                handler = (handlers or {}).get(what)
                if handler is not None:
                    writer.write(await handler(await reader.read()))
                elif what == b"signals" and signals is not None:
                    writer.write(orjson.dumps(signals()))
                else:
                    writer.write(render())
                await writer.drain()
            except Exception:
                log.exception("answering a peer worker failed")
            finally:
                writer.close()

        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a replaced worker's socket file
        self._server = await asyncio.start_unix_server(answer, self.path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def ask(
        self, index: int, what: bytes, payload: bytes = b"", quiet: bool = False
    ) -> bytes | None:
        """Send ``what`` and ``payload`` to worker ``index``; its answer (None, logged unless
        ``quiet``, if it did not answer within ``timeout``)."""
        path = self.paths[index]
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_unix_connection(path)
                try:
                    writer.write(what + b"\n" + payload)
                    writer.write_eof()
                    return await reader.read()
                finally:
                    writer.close()
        except (OSError, TimeoutError) as err:
            (log.debug if quiet else log.warning)(
                "worker socket %s: %s", path, err or type(err).__name__
            )
            return None

    async def aggregate(self, own: bytes) -> bytes:
        """Our /metrics text with the peers' added (``merge``)."""
        answers = await asyncio.gather(*(self.ask(i, b"metrics", quiet=True) for i in self.peers))
        texts = [own, *(text for text in answers if text)]
        return merge(texts) if len(texts) > 1 else own

    async def signals(self) -> list[dict[str, Any]]:
        """The peers' parts of the autoscaling signals (``GatewaySignals.parts``)."""
        answers = await asyncio.gather(*(self.ask(i, b"signals", quiet=True) for i in self.peers))
        return [orjson.loads(a) for a in answers if a]


def merge(texts: Sequence[bytes]) -> bytes:
    """Prometheus texts added up: counters, histograms, summaries and gauges summed, except
    the gauges every worker computes from the shared routing state (per-endpoint gauges,
    endpoints per model), taken from the first text alone."""
    families: dict[str, tuple[Any, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for index, text in enumerate(texts):
        for family in text_string_to_metric_families(text.decode()):
            first, samples = families.setdefault(family.name, (family, {}))
            if index and first.type == "gauge" and first.name.startswith(_SHARED_GAUGE_PREFIXES):
                continue
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in samples:
                    samples[key] = sample.value
                elif sample.name.endswith("_created"):
                    samples[key] = min(samples[key], sample.value)
                else:
                    samples[key] += sample.value
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(families))  # type: ignore[arg-type]
    return generate_latest(registry)


class _Merged:
    def __init__(self, families: dict[str, Any]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for first, samples in self.families.values():
            metric = Metric(first.name, first.documentation, first.type, first.unit)
            for (name, labels), value in samples.items():
                metric.add_sample(name, dict(labels), value)
            yield metric
