"""The ext_proc messages the picker sends, built from the generated stubs PyPI ``xds-protos``
ships (``envoy.service.ext_proc.v3``); nothing here is hand-written protobuf.

The endpoint-picker protocol (Gateway API Inference Extension): the chosen ``ip:port`` (then
any fallbacks, comma-separated) goes to the data plane twice, with the same value, in the
``x-gateway-destination-endpoint`` request header and in the dynamic metadata namespace
``envoy.lb`` under that key. A request the picker refuses gets an immediate response (429 shed,
503 nothing ready, 404 unknown model ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from envoy.config.core.v3 import base_pb2  # type: ignore[import-not-found]
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import (  # type: ignore[import-not-found]
    ProcessingMode,
)
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb  # type: ignore[import-not-found]
from envoy.type.v3 import http_status_pb2  # type: ignore[import-not-found]
from google.protobuf import struct_pb2

from llmplane.epp.envoy import (
    DESTINATION_HEADER,
    METADATA_NAMESPACE,
    SERVED_KEY,
    SUBSET_KEY,
    SUBSET_NAMESPACE,
)
from llmplane.gateway.errors import GatewayError
from llmplane.gateway.protocols import error_response

ProcessingRequest = pb.ProcessingRequest
ProcessingResponse = pb.ProcessingResponse

# Replies that carry nothing: the same immutable-in-practice objects every time.
CONTINUE_REQUEST_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
CONTINUE_REQUEST_BODY = pb.ProcessingResponse(request_body=pb.BodyResponse())
CONTINUE_RESPONSE_HEADERS = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
CONTINUE_RESPONSE_BODY = pb.ProcessingResponse(response_body=pb.BodyResponse())
CONTINUE_REQUEST_TRAILERS = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
CONTINUE_RESPONSE_TRAILERS = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def headers_of(message: pb.HttpHeaders) -> dict[str, str]:
    """Header name (lower-case, as Envoy sends them) -> value; pseudo-headers included
    (``:path``, ``:method``, ``:status``)."""
    out: dict[str, str] = {}
    for h in message.headers.headers:
        value = h.raw_value.decode("latin-1") if h.raw_value else h.value
        out[h.key] = value
    return out


def full_duplex(message: pb.ProcessingRequest) -> tuple[bool, bool]:
    """Whether the request and the response body come FULL_DUPLEX_STREAMED (the mode the
    Inference Extension's Gateway implementations configure), from the protocol configuration
    Envoy sends with the first message (absent before Envoy 1.3x: not full duplex)."""
    if not message.HasField("protocol_config"):
        return False, False
    config = message.protocol_config
    duplex = ProcessingMode.FULL_DUPLEX_STREAMED
    return config.request_body_mode == duplex, config.response_body_mode == duplex


def subset_hint(message: pb.ProcessingRequest) -> frozenset[str] | None:
    """The ``ip:port`` endpoints the data plane allows for this request (filter metadata
    ``envoy.lb.subset_hint`` / ``x-gateway-destination-endpoint-subset``), None if it set
    none."""
    namespaces = message.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in namespaces:
        return None
    fields = namespaces[SUBSET_NAMESPACE].fields
    if SUBSET_KEY not in fields:
        return None
    value = fields[SUBSET_KEY]
    if value.WhichOneof("kind") == "list_value":
        return frozenset(v.string_value for v in value.list_value.values if v.string_value)
    if value.WhichOneof("kind") == "string_value":  # tolerated: "ip:port,ip:port"
        return frozenset(a.strip() for a in value.string_value.split(",") if a.strip())
    return frozenset()


def served_endpoint(message: pb.ProcessingRequest) -> str | None:
    """The endpoint the data plane says served the request (``envoy.lb`` /
    ``x-gateway-destination-endpoint-served``, with the response), None if it does not say."""
    namespaces = message.metadata_context.filter_metadata
    if METADATA_NAMESPACE not in namespaces:
        return None
    value = namespaces[METADATA_NAMESPACE].fields.get(SERVED_KEY)
    return value.string_value or None if value is not None else None


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode("latin-1"))
    )


def _mutation(headers: Iterable[tuple[str, str]]) -> pb.HeaderMutation:
    return pb.HeaderMutation(set_headers=[_header(k, v) for k, v in headers])


def _destination_metadata(value: str) -> struct_pb2.Struct:
    metadata = struct_pb2.Struct()
    metadata.fields[METADATA_NAMESPACE].struct_value.fields[DESTINATION_HEADER].string_value = value
    return metadata


def route_to(endpoints: Sequence[str], body: bytes | None) -> pb.ProcessingResponse:
    """The answer to the BUFFERED request body: where to send it, and the body to send when
    the picker changed it (model rewrite, ``stream_options``)."""
    value = ",".join(endpoints)
    headers = [(DESTINATION_HEADER, value)]
    common = pb.CommonResponse(clear_route_cache=True)
    if body is not None:
        headers.append(("content-length", str(len(body))))
        common.body_mutation.body = body
    common.header_mutation.CopyFrom(_mutation(headers))
    return pb.ProcessingResponse(
        request_body=pb.BodyResponse(response=common),
        dynamic_metadata=_destination_metadata(value),
    )


def route_to_streamed(endpoints: Sequence[str], body: bytes) -> list[pb.ProcessingResponse]:
    """The answers in FULL_DUPLEX_STREAMED mode, sent once the whole body is in: the held
    request-headers answer with the destination, then the body (Envoy forwards only what the
    picker sends back; it drops ``content-length`` and sends the body chunked)."""
    value = ",".join(endpoints)
    head = pb.CommonResponse(clear_route_cache=True)
    head.header_mutation.CopyFrom(_mutation([(DESTINATION_HEADER, value)]))
    return [
        pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(response=head),
            dynamic_metadata=_destination_metadata(value),
        ),
        pb.ProcessingResponse(request_body=streamed_chunk(body, True)),
    ]


def streamed_chunk(body: bytes, end: bool) -> pb.BodyResponse:
    """A body chunk sent back in FULL_DUPLEX_STREAMED mode."""
    common = pb.CommonResponse()
    common.body_mutation.streamed_response.body = body
    common.body_mutation.streamed_response.end_of_stream = end
    return pb.BodyResponse(response=common)


def response_headers(extra: Mapping[str, str]) -> pb.ProcessingResponse:
    """The answer to the response headers, adding ``extra`` (endpoint, rate-limit headers)."""
    if not extra:
        return CONTINUE_RESPONSE_HEADERS
    return pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(
            response=pb.CommonResponse(header_mutation=_mutation(extra.items()))
        )
    )


def response_chunk(body: bytes) -> pb.ProcessingResponse:
    """The answer to one STREAMED response chunk, replacing it with ``body``."""
    common = pb.CommonResponse()
    common.body_mutation.body = body
    return pb.ProcessingResponse(response_body=pb.BodyResponse(response=common))


def immediate(err: GatewayError, path: str = "") -> pb.ProcessingResponse:
    """Answer the client directly (the request never reaches a replica), in the shape of the
    API at ``path`` (Anthropic's for ``/v1/messages``, OpenAI's otherwise), as the gateway
    answers."""
    headers = [("content-type", "application/json")]
    if err.retry_after is not None:
        headers.append(("retry-after", str(max(1, round(err.retry_after)))))
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=err.status),
            headers=_mutation(headers),
            body=error_response(path, err).body,
            details=err.code,
        )
    )
