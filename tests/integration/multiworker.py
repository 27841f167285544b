"""A multi-worker ``llmplane gateway`` looked at from outside: its worker pids, a session per
worker, one worker left running, its access log lines and in-flight gauge."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from llmplane.testing.pinned import on_worker


def workers_of(pid: int) -> set[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return {int(c) for c in children}


def access_lines(output: str) -> list[dict]:
    return [orjson.loads(line) for line in output.splitlines() if line.startswith('{"method"')]


def inflight_gauge(text: str, address: str) -> float:
    m = re.search(
        rf'^llmplane_gateway_endpoint_inflight{{endpoint="{re.escape(address)}"}} (\S+)$',
        text,
        re.M,
    )
    return float(m.group(1)) if m else -1.0


def session() -> aiohttp.ClientSession:
    # A new connection per request: the kernel hashes each onto one worker's socket.
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


@contextlib.asynccontextmanager
async def per_worker(gateway_pid: int, **kwargs: Any) -> AsyncIterator[dict[int, Any]]:
    """Worker pid -> a session whose every request reaches that worker (a new connection per
    request unless ``kwargs`` say otherwise; ``llmplane/testing/pinned.py``)."""
    among = workers_of(gateway_pid)
    kwargs.setdefault("force_close", True)
    pinned = {pid: on_worker(pid, among, **kwargs) for pid in among}
    try:
        yield pinned
    finally:
        for s in pinned.values():
            await s.close()


async def chat(s: aiohttp.ClientSession, url: str, model: str, tokens: int = 2) -> int:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": tokens,
        "ignore_eos": True,
    }
    async with s.post(f"{url}/v1/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status


@contextlib.contextmanager
def only_among(keep: int, among: set[int]) -> Iterator[None]:
    """Every process in ``among`` but ``keep`` stopped (SIGSTOP): nothing but ``keep`` moves.
    Open connections to ``keep`` first (``per_worker``): a new connection the kernel hashes
    onto a stopped worker's socket waits in its backlog until the worker runs again."""
    others = among - {keep}
    for pid in others:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in others:
            os.kill(pid, signal.SIGCONT)
