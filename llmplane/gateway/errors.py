"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the right
status (``param`` is always there, null unless one request field is at fault, as OpenAI sends
it)."""

from __future__ import annotations

from enum import StrEnum

from llmplane.gateway.http_server import Response, error_body

_TYPES = dict.fromkeys((400, 401, 403, 404, 405, 413, 415), "invalid_request_error") | {
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ErrorCode(StrEnum):
    """The ``code`` of an error body: a member is its wire string."""

    ADAPTER_LOAD_FAILED = "adapter_load_failed"
    BAD_GATEWAY = "bad_gateway"
    CONSOLE_UNAVAILABLE = "console_unavailable"
    HOST_NOT_ALLOWED = "host_not_allowed"
    INVALID_API_KEY = "invalid_api_key"
    INVALID_JSON = "invalid_json"
    INVALID_TYPE = "invalid_type"
    MISSING_MODEL = "missing_model"
    MODEL_NOT_ALLOWED = "model_not_allowed"
    MODEL_NOT_FOUND = "model_not_found"
    NO_BACKEND = "no_backend"
    NO_MATCHING_ROUTE = "no_matching_route"
    NO_READY_ENDPOINT = "no_ready_endpoint"
    NOT_FOUND = "not_found"
    ORIGIN_NOT_ALLOWED = "origin_not_allowed"
    OUT_OF_RESOURCES = "out_of_resources"  # the gateway's own descriptors or memory ran out
    OVERLOADED = "overloaded"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    RATE_LIMIT_UNAVAILABLE = "rate_limit_unavailable"
    REPLICA_LOST = "replica_lost"  # the replica broke off the request and none other took it
    REQUEST_TOO_LARGE = "request_too_large"
    RESPONSE_TOO_LARGE = "response_too_large"  # an upstream answer over maxResponseBytes
    STREAM_LOST = "stream_lost"  # a stream lost mid-way that no replica could continue
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    UNSUPPORTED_PATH = "unsupported_path"
    UPSTREAM_STALLED = "upstream_stalled"
    UPSTREAM_TIMEOUT = "upstream_timeout"


class GatewayError(Exception):
    """A request the gateway answers itself, with an OpenAI-style error body."""

    def __init__(
        self,
        status: int,
        message: str,
        code: ErrorCode,
        *,
        retry_after: float | None = None,
        endpoint: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.retry_after = retry_after
        self.endpoint = endpoint
        self.param = param

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "error")

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)

    def response(self) -> Response:
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, round(self.retry_after)))
        if self.endpoint:
            headers["x-llmplane-endpoint"] = self.endpoint
        return Response(
            status=self.status,
            body=self.body(),
            content_type="application/json",
            headers=headers,
        )


class ModelNotFound(GatewayError):
    """404: no route, model or adapter of this name (a key is told only about its own)."""

    def __init__(self, message: str) -> None:
        super().__init__(404, message, ErrorCode.MODEL_NOT_FOUND)


def missing_model() -> GatewayError:
    """400: the request names no model (or not as a string) and no catch-all routes it."""
    return GatewayError(
        400, 'the request has no model: set "model" to a model name', ErrorCode.MISSING_MODEL
    )


def too_large(limit: int, length: int | None = None) -> GatewayError:
    """413: a request body over the gateway's limit (``maxBodyBytes``)."""
    size = f" ({length} bytes)" if length is not None else ""
    return GatewayError(
        413,
        f"the request body{size} is over the limit of {limit} bytes",
        ErrorCode.REQUEST_TOO_LARGE,
    )


class NotReady(GatewayError):
    """503: the model exists but has no ready replica (yet: the activator may hold it)."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message, ErrorCode.NO_READY_ENDPOINT)


class Overloaded(GatewayError):
    """Shed: every candidate is saturated (429, Sheddable) or flow control gave up (503)."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(status, message, ErrorCode.OVERLOADED, retry_after=retry_after)
