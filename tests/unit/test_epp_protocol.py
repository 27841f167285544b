"""The ext_proc messages of the endpoint picker (llmplane/epp/protocol.py) and its subset rule,
on the generated stubs from PyPI xds-protos (no Envoy needed; the Envoy tests are in
tests/integration/test_epp_envoy.py)."""

from __future__ import annotations

import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from google.protobuf import struct_pb2

from llmplane.epp import protocol
from llmplane.epp.envoy import DESTINATION_HEADER, SUBSET_KEY, SUBSET_NAMESPACE
from llmplane.epp.picker import in_subset
from llmplane.gateway.errors import GatewayError

pb = protocol.pb


def _headers(pairs: dict[str, str], raw: bool = True) -> pb.HttpHeaders:
    values = [
        base_pb2.HeaderValue(key=k, raw_value=v.encode())
        if raw
        else base_pb2.HeaderValue(key=k, value=v)
        for k, v in pairs.items()
    ]
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values))


def test_headers_of_reads_raw_and_plain_values() -> None:
    assert protocol.headers_of(_headers({":path": "/v1/completions", "x-a": "1"})) == {
        ":path": "/v1/completions",
        "x-a": "1",
    }
    assert protocol.headers_of(_headers({"x-b": "2"}, raw=False)) == {"x-b": "2"}


def test_route_to_puts_the_same_destination_in_the_header_and_the_metadata() -> None:
    reply = protocol.route_to(["10.0.0.1:8000", "10.0.0.2:8000"], None)
    common = reply.request_body.response
    assert common.clear_route_cache
    headers = {
        h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers
    }
    assert headers == {DESTINATION_HEADER: "10.0.0.1:8000,10.0.0.2:8000"}
    assert not common.HasField("body_mutation")
    lb = reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    assert lb[DESTINATION_HEADER].string_value == headers[DESTINATION_HEADER]


def test_route_to_with_a_new_body_sets_its_length() -> None:
    body = b'{"model":"llama-a"}'
    common = protocol.route_to(["10.0.0.1:8000"], body).request_body.response
    assert common.body_mutation.body == body
    headers = {
        h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers
    }
    assert headers["content-length"] == str(len(body))


def test_immediate_response_is_the_gateway_error() -> None:
    err = GatewayError(429, "busy", "overloaded", retry_after=2.4)
    reply = protocol.immediate(err).immediate_response
    assert reply.status.code == 429
    assert orjson.loads(reply.body)["error"]["code"] == "overloaded"
    headers = {h.header.key: h.header.raw_value.decode() for h in reply.headers.set_headers}
    assert headers == {"content-type": "application/json", "retry-after": "2"}
    # In the shape of the API called: Anthropic's for the Messages API.
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        body = orjson.loads(protocol.immediate(err, path).immediate_response.body)
        assert body == {"type": "error", "error": {"type": "rate_limit_error", "message": "busy"}}
    openai_shape = orjson.loads(protocol.immediate(err, "/v1/responses").immediate_response.body)
    assert openai_shape["error"]["code"] == "overloaded"


def _with_subset(value: struct_pb2.Value | None, namespace: str = SUBSET_NAMESPACE):
    message = pb.ProcessingRequest(request_headers=pb.HttpHeaders())
    fields = message.metadata_context.filter_metadata[namespace].fields
    if value is not None:
        fields[SUBSET_KEY].CopyFrom(value)
    return message


def test_subset_hint() -> None:
    assert protocol.subset_hint(pb.ProcessingRequest(request_headers=pb.HttpHeaders())) is None
    assert protocol.subset_hint(_with_subset(None)) is None  # the namespace without the key
    assert protocol.subset_hint(_with_subset(None, "other")) is None
    listed = struct_pb2.Value()
    listed.list_value.values.add().string_value = "10.0.0.1:8000"
    listed.list_value.values.add().string_value = "10.0.0.2:8000"
    assert protocol.subset_hint(_with_subset(listed)) == {"10.0.0.1:8000", "10.0.0.2:8000"}
    text = struct_pb2.Value(string_value="10.0.0.1:8000, 10.0.0.3:8000")
    assert protocol.subset_hint(_with_subset(text)) == {"10.0.0.1:8000", "10.0.0.3:8000"}
    # Anything else allows nothing (503 later), never everything.
    assert protocol.subset_hint(_with_subset(struct_pb2.Value(number_value=1))) == frozenset()


def test_in_subset_keeps_the_allowed_and_refuses_an_empty_result() -> None:
    def address(s: str) -> str:
        return s

    assert in_subset(["a:1", "b:1"], frozenset({"b:1"}), address) == ["b:1"]  # type: ignore[arg-type]
    with pytest.raises(GatewayError) as err:
        in_subset(["a:1"], frozenset({"c:1"}), address)  # type: ignore[arg-type]
    assert err.value.status == 503


def test_full_duplex_comes_from_the_protocol_configuration() -> None:
    from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode

    plain = pb.ProcessingRequest(request_headers=pb.HttpHeaders())
    assert protocol.full_duplex(plain) == (False, False)  # an Envoy that does not say
    message = pb.ProcessingRequest(request_headers=pb.HttpHeaders())
    message.protocol_config.request_body_mode = ProcessingMode.FULL_DUPLEX_STREAMED
    message.protocol_config.response_body_mode = ProcessingMode.STREAMED
    assert protocol.full_duplex(message) == (True, False)


def test_streamed_routing_holds_the_destination_for_the_headers_and_sends_the_body() -> None:
    head, body = protocol.route_to_streamed(["10.0.0.1:8000"], b'{"model":"m"}')
    headers = head.request_headers.response.header_mutation.set_headers
    assert [(h.header.key, h.header.raw_value) for h in headers] == [
        (DESTINATION_HEADER, b"10.0.0.1:8000")
    ]
    assert head.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DESTINATION_HEADER]
    streamed = body.request_body.response.body_mutation.streamed_response
    assert (streamed.body, streamed.end_of_stream) == (b'{"model":"m"}', True)
