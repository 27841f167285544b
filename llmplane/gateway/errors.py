"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the right
status (``param`` is always there, null unless one request field is at fault, as OpenAI sends
it)."""

from __future__ import annotations

import orjson

from llmplane.gateway.http_server import Response

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class GatewayError(Exception):
    """A request the gateway answers itself, with an OpenAI-style error body."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
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
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": self.type,
                    "param": self.param,
                    "code": self.code,
                }
            }
        )

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
