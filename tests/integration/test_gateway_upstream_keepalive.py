"""Upstreams that close idle keep-alive connections (vLLM's uvicorn after 5 s): a request never
fails because the connection it was written on was being closed. Real upstream processes
(``llmplane/testing/upstream.py --keepalive-timeout``: aiohttp's server closing idle connections);
the gateway's pool keeps its idle connections longer than the upstream on purpose, so that
requests meet connections the upstream has closed or is closing."""

from __future__ import annotations

import asyncio
import re
import select

from llmplane.controlplane.plan import MODEL_NAME_LABEL
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery import Endpoint, StaticDiscovery
from llmplane.gateway.upstream_client import KEEPALIVE_TIMEOUT, UpstreamPool, encode_request

UPSTREAM_IDLE = 0.2  # seconds the upstream keeps an idle connection


def completion(address: str) -> bytes:
    body = b'{"model": "m", "prompt": "hi"}'
    return encode_request("POST", "/v1/completions", address, {}, body)


async def test_a_request_on_a_connection_the_upstream_closed_goes_again_on_a_new_one(processes):
    upstream = processes.upstream("m", "--keepalive-timeout", str(UPSTREAM_IDLE))
    resent: list[str] = []
    pool = UpstreamPool(keepalive_timeout=60.0, on_resend=resent.append)
    try:
        status, _, _ = await pool.request(upstream.address, completion(upstream.address), 10)
        assert status == 200 and pool.connections(upstream.address) == 1
        [conn] = pool._idle[upstream.address]
        assert conn.transport is not None
        sock = conn.transport.get_extra_info("socket")
        # The race, made certain: the upstream has closed the idle connection (its FIN is
        # here) but this event loop has not read it yet (blocking wait, the loop does not
        # run), so the pool still takes the connection for the next request.
        readable, _, _ = select.select([sock.fileno()], [], [], 10)
        assert readable, "the upstream did not close the idle connection within 10 s"
        status, _, body = await pool.request(upstream.address, completion(upstream.address), 10)
        assert status == 200 and b"text_completion" in body
        assert resent == [upstream.address]
    finally:
        await pool.close()


async def test_requests_spaced_around_the_upstreams_idle_close_never_fail(
    processes, gateways, client
):
    upstream = processes.upstream("m", "--keepalive-timeout", str(UPSTREAM_IDLE))
    discovery = StaticDiscovery(
        [Endpoint(upstream.address, {MODEL_NAME_LABEL: "m"}, "m", fixed_port=True)]
    )
    # The pool keeps idle connections longer than the upstream (the default is below the
    # engines' 5 s): every request below meets a connection the upstream closed or is closing.
    gw = await gateways(None, discovery, config=GatewayConfig(keepalive_timeout=60.0))
    url = f"http://127.0.0.1:{gw.port}/v1/completions"
    statuses = []
    for i in range(12):  # gaps from 0.15 to 0.26 s around the upstream's 0.2 s
        await asyncio.sleep(UPSTREAM_IDLE - 0.05 + i * 0.01)
        body = {"model": "m", "prompt": f"hello {i}", "stream": i % 2 == 1}
        async with client.post(url, json=body) as resp:
            await resp.read()
            statuses.append(resp.status)
    assert statuses == [200] * 12
    # The retries the route allows were not needed: each request went once to the endpoint.
    text = gw.metrics.render().decode()
    assert not re.search(r"^llmplane_gateway_retries_total\{.*\} [1-9]", text, re.M), text


def test_the_default_idle_limit_is_below_the_engines_keep_alive() -> None:
    # vLLM (uvicorn) and llama.cpp's server (cpp-httplib) close idle connections after 5 s.
    assert GatewayConfig().keepalive_timeout == KEEPALIVE_TIMEOUT < 5.0
