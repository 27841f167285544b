"""Fixtures shared by the integration tests: a store, an HTTP client, child processes,
gateways and a redis-server that are always stopped (also when the test fails)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmplane.gateway.discovery.store_endpoints import StoreEndpoints
from llmplane.gateway.server import Gateway, start_gateway
from llmplane.store.sqlite import SQLiteStore
from llmplane.testing import Processes
from tests.integration.redisserver import RedisServer


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    """An empty SQLite store in the test's directory."""
    s = SQLiteStore(tmp_path / "db.sqlite")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def processes() -> Iterator[Processes]:
    """Start sims, upstreams and ``up`` with ``processes.sim(...)`` etc.; all end with the test."""
    with Processes() as group:
        yield group


@pytest.fixture
async def gateways() -> AsyncIterator[Callable[..., Awaitable[Gateway]]]:
    """``await gateways(store, discovery=None, **kw)``: an in-process gateway (discovery from
    the store's Endpoint objects unless given), closed with the test."""
    started: list[Gateway] = []

    async def start(store: Any = None, discovery: Any = None, **kw: Any) -> Gateway:
        if discovery is None and store is not None:
            discovery = StoreEndpoints(store)
        gw = await start_gateway(store, discovery, **kw)
        started.append(gw)
        return gw

    try:
        yield start
    finally:
        for gw in reversed(started):
            await gw.close()


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A short directory for ipc sockets (a Unix socket path has at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="kv", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A ``redis-server`` on a loopback port for the module's tests (restartable on that port)."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.kill()
