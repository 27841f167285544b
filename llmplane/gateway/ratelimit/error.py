"""The 429 of a token rate limit, in OpenAI's shape."""

from __future__ import annotations

import math

from llmplane.gateway.errors import ErrorCode, GatewayError
from llmplane.gateway.http_server import Response


class RateLimitError(GatewayError):
    """429 in OpenAI's shape: ``{"error": {"message", "type": "tokens" | "requests",
    "param": null, "code": "rate_limit_exceeded"}}`` with ``Retry-After`` (whole seconds,
    rounded up) and the ``x-ratelimit-*`` headers."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None,
        headers: dict[str, str],
        kind: str = "tokens",
    ) -> None:
        super().__init__(429, message, ErrorCode.RATE_LIMIT_EXCEEDED, retry_after=retry_after)
        self.headers = headers
        self.kind = kind

    @property
    def type(self) -> str:
        return self.kind

    def response(self) -> Response:
        response = super().response()
        response.headers.update(self.headers)
        if self.retry_after is not None:
            response.headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        return response
