"""The picker's ext_proc state machine driven message by message, in process, on a real
Gateway routing state (a SQLite store with two registered endpoints; no engine and no Envoy
is needed because the picker never connects to a replica): the destination list with a
fallback, the data plane reporting that the fallback served, in-flight accounting following it,
usage settling at the end of the stream."""

from __future__ import annotations

import aiohttp
import orjson
from envoy.config.core.v3 import base_pb2

from llmplane.epp import protocol
from llmplane.epp.envoy import DESTINATION_HEADER, SERVED_KEY
from llmplane.epp.server import start_picker
from llmplane.gateway import apikeys
from llmplane.gateway.config import GatewayConfig
from llmplane.gateway.discovery.store_endpoints import StoreEndpoints, endpoint_object
from llmplane.store.sqlite import SQLiteStore
from llmplane.testing import eventually

pb = protocol.pb
A, B = "127.0.0.1:1", "127.0.0.1:2"  # never connected to


def _headers(pairs: dict[str, str], end: bool = False) -> pb.HttpHeaders:
    values = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values), end_of_stream=end)


def _request(body: dict, headers: dict[str, str] | None = None) -> list[pb.ProcessingRequest]:
    """A completion request's headers and whole body, as Envoy sends them."""
    return [
        pb.ProcessingRequest(
            request_headers=_headers(
                {":method": "POST", ":path": "/v1/completions", **(headers or {})}
            )
        ),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=orjson.dumps(body), end_of_stream=True)),
    ]


def _served_by(endpoint: str, content_type: str) -> pb.ProcessingRequest:
    """Response headers whose ``envoy.lb`` metadata says ``endpoint`` served the request."""
    served = pb.ProcessingRequest(
        response_headers=_headers({":status": "200", "content-type": content_type})
    )
    served.metadata_context.filter_metadata["envoy.lb"].fields[SERVED_KEY].string_value = endpoint
    return served


async def test_fallback_that_served_takes_the_accounting(tmp_path) -> None:
    store = SQLiteStore(tmp_path / "db.sqlite")
    store.apply(endpoint_object("a", A, "m"))
    store.apply(endpoint_object("b", B, "m"))
    picker = await start_picker(store, StoreEndpoints(store), fallbacks=1)
    try:
        gw = picker.gateway
        await eventually(lambda: len(gw.registry.states) == 2, what="both endpoints")
        states = gw.registry.states
        seen: dict[str, dict[str, int]] = {}

        def inflight() -> dict[str, int]:
            return {a: s.inflight for a, s in states.items()}

        order: list[str] = []

        async def messages():
            for message in _request({"model": "m", "prompt": "hello", "max_tokens": 3}):
                yield message
            seen["picked"] = inflight()
            seen["picked tokens"] = {a: s.prefill_tokens for a, s in states.items()}
            # The data plane tried the first named endpoint, then served from the second.
            yield _served_by(order[1], "application/json")
            seen["served"] = inflight()
            # Not a stream: the response's headers are its first byte.
            seen["served tokens"] = {a: s.prefill_tokens for a, s in states.items()}
            usage = b'{"usage":{"prompt_tokens":2,"completion_tokens":3}}'
            yield pb.ProcessingRequest(response_body=pb.HttpBody(body=usage, end_of_stream=True))

        replies = []
        stream = picker.service.Process(_Feeder(messages(), replies, order), None)
        async for reply in stream:
            replies.append(reply)
        kinds = [r.WhichOneof("response") for r in replies]
        assert kinds == ["request_headers", "request_body", "response_headers", "response_body"]
        first, second = order
        assert seen["picked"] == {first: 1, second: 0}  # counted on the primary
        assert seen["served"] == {first: 0, second: 1}  # moved to the one that served
        assert inflight() == {first: 0, second: 0}  # released at the end of the stream
        assert seen["picked tokens"][first] > 0 and seen["picked tokens"][second] == 0
        assert seen["served tokens"] == {first: 0, second: 0}
        added = {
            h.header.key: h.header.raw_value.decode()
            for h in replies[2].response_headers.response.header_mutation.set_headers
        }
        assert added["x-llmplane-endpoint"] == second
        metrics = gw.metrics.render().decode()
        assert f'endpoint="{second}",model="m"' in metrics and 'status="200"' in metrics
        assert "llmplane_gateway_output_tokens_total" in metrics and "3.0" in metrics
    finally:
        await picker.close(0)
        store.close()


async def test_a_stream_counts_as_prefilling_until_its_first_chunk(tmp_path) -> None:
    """saturationMaxPrefilling through Envoy: the picker counts a stream on its endpoint from
    the pick (moved with the data plane's fallback) until the first response chunk, and that
    chunk pumps flow control (the proxy's hook). Its prompt tokens (the autoscaling signal of
    prefill tokens waiting) are counted and moved the same way."""
    store = SQLiteStore(tmp_path / "db.sqlite")
    store.apply(endpoint_object("a", A, "m"))
    store.apply(endpoint_object("b", B, "m"))
    config = GatewayConfig(saturation_max_prefilling=1)
    picker = await start_picker(store, StoreEndpoints(store), config=config, fallbacks=1)
    try:
        gw = picker.gateway
        await eventually(lambda: len(gw.registry.states) == 2, what="both endpoints")
        states = gw.registry.states
        seen: dict[str, dict[str, int]] = {}
        pumps: list[int] = []
        hook = gw.prefilled
        gw.prefilled = lambda: (pumps.append(1), hook())  # type: ignore[method-assign,func-returns-value]

        def prefilling() -> dict[str, int]:
            return {a: s.prefilling for a, s in states.items()}

        def tokens() -> dict[str, int]:
            return {a: s.prefill_tokens for a, s in states.items()}

        order: list[str] = []
        prompt = "a long prompt " * 40  # 560 bytes: 140 tokens at most, its body's more

        async def messages():
            for message in _request(
                {"model": "m", "prompt": prompt, "max_tokens": 3, "stream": True}
            ):
                yield message
            seen["picked"], seen["picked tokens"] = prefilling(), tokens()
            yield _served_by(order[1], "text/event-stream")
            seen["served"], seen["served tokens"] = prefilling(), tokens()
            chunk = b'data: {"choices":[{"text":" abc"}]}\n\n'
            yield pb.ProcessingRequest(response_body=pb.HttpBody(body=chunk))
            seen["first chunk"], seen["first chunk tokens"] = prefilling(), tokens()
            yield pb.ProcessingRequest(
                response_body=pb.HttpBody(body=b"data: [DONE]\n\n", end_of_stream=True)
            )

        replies = []
        stream = picker.service.Process(_Feeder(messages(), replies, order), None)
        async for reply in stream:
            replies.append(reply)
        first, second = order
        assert seen["picked"] == {first: 1, second: 0}
        assert seen["served"] == {first: 0, second: 1}  # moved to the one that served
        assert seen["first chunk"] == {first: 0, second: 0} and pumps == [1]
        assert prefilling() == {first: 0, second: 0}
        n = seen["picked tokens"][first]
        assert 140 <= n <= 160, n  # the prompt's bytes / 4, or its body's
        assert seen["picked tokens"] == {first: n, second: 0}
        assert seen["served tokens"] == {first: 0, second: n}
        assert seen["first chunk tokens"] == tokens() == {first: 0, second: 0}
    finally:
        await picker.close(0)
        store.close()


class _Feeder:
    """The request stream: notes the picker's destination list as soon as it answers."""

    def __init__(self, messages, replies, order) -> None:
        self.messages, self.replies, self.order = messages, replies, order

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.replies and not self.order:
            common = self.replies[-1].request_body.response
            for h in common.header_mutation.set_headers:
                if h.header.key == DESTINATION_HEADER:
                    self.order.extend(h.header.raw_value.decode().split(","))
        return await self.messages.__anext__()


async def test_the_picker_checks_api_keys_like_the_gateway(tmp_path) -> None:
    """The picker runs the gateway's route stage, authentication included: once a Tenant
    exists, no key gets the OpenAI 401 as Envoy's immediate response, a model outside the
    Tenant's list 403, and the Tenant's key a destination."""
    from llmplane.gateway import apikeys

    made = apikeys.new_key()
    store = SQLiteStore(tmp_path / "db.sqlite")
    store.apply(endpoint_object("a", A, "m"))
    store.apply(endpoint_object("b", B, "other"))
    store.apply(
        {
            "apiVersion": "llmplane.io/v1alpha1",
            "kind": "Tenant",
            "metadata": {"name": "team", "namespace": "default"},
            "spec": {
                "models": ["m"],
                "keys": [{"id": made.id, "salt": made.salt, "hash": made.hash}],
            },
        }
    )
    picker = await start_picker(store, StoreEndpoints(store), fallbacks=1)
    try:
        gw = picker.gateway
        await eventually(lambda: len(gw.registry.states) == 2, what="both endpoints")

        async def answer(headers: dict[str, str], model: str) -> pb.ProcessingResponse:
            async def messages():
                for message in _request(
                    {"model": model, "prompt": "hello", "max_tokens": 3}, headers
                ):
                    yield message

            replies: list[pb.ProcessingResponse] = []
            async for reply in picker.service.Process(_Feeder(messages(), replies, []), None):
                replies.append(reply)
            return replies[-1]

        for headers, model, status, code in (
            ({}, "m", 401, "invalid_api_key"),
            ({"authorization": "Bearer llmp-wrong"}, "m", 401, "invalid_api_key"),
            ({"authorization": f"Bearer {made.key}"}, "other", 403, "model_not_allowed"),
        ):
            reply = await answer(headers, model)
            assert reply.WhichOneof("response") == "immediate_response", reply
            assert reply.immediate_response.status.code == status
            assert orjson.loads(reply.immediate_response.body)["error"]["code"] == code
        reply = await answer({"x-api-key": made.key}, "m")
        assert reply.WhichOneof("response") == "request_body"
        keys = {h.header.key for h in reply.request_body.response.header_mutation.set_headers}
        assert DESTINATION_HEADER in keys
    finally:
        await picker.close(0)
        store.close()


async def test_the_pickers_http_port_keeps_metrics_and_signals_behind_the_admin_key(
    tmp_path,
) -> None:
    """The gateway's /metrics needs the admin key once one is set; the picker's HTTP port
    serves the same pages and must not hand them out without it."""
    made = apikeys.new_key()
    config = GatewayConfig(admin_key_hash=apikeys.admin_setting(made))
    store = SQLiteStore(tmp_path / "db.sqlite")
    picker = await start_picker(store, StoreEndpoints(store), config=config, metrics_port=0)
    base = f"http://127.0.0.1:{picker.metrics_port}"
    try:
        async with aiohttp.ClientSession() as session:
            for path in ("/metrics", "/autoscaling/signals"):
                async with session.get(base + path) as r:
                    assert r.status == 401, path
                auth = {"Authorization": f"Bearer {made.key}"}
                async with session.get(base + path, headers=auth) as r:
                    assert r.status == 200, path
    finally:
        await picker.close(0)
        store.close()
