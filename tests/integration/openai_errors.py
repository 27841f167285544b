"""What an OpenAI error body from the gateway must look like, for every error it produces.

OpenAI answers ``{"error": {"message", "type", "param", "code"}}``: ``param`` always present
(null unless one request field is at fault), ``type`` ``invalid_request_error`` for what the
client got wrong, ``server_error`` for a 500, and for rate limits ``tokens`` or ``requests``
(which limit refused) with code ``rate_limit_exceeded``. Gateway-only conditions (no upstream, upstream timeout, ...) have no
OpenAI equivalent; their types are the gateway's own, fixed here so they do not drift."""

from __future__ import annotations

from typing import Any

import orjson

TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    417: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}
# (status, code) whose type differs from the status's.
SPECIAL = {(429, "rate_limit_exceeded"): ("tokens", "requests")}


def assert_openai_error(
    status: int,
    body: bytes | dict[str, Any],
    expected_status: int,
    code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """Check ``body`` is the gateway's OpenAI error for ``expected_status`` (and ``code``, if
    given); return the ``error`` object."""
    assert status == expected_status, body
    doc = orjson.loads(body) if isinstance(body, bytes) else body
    assert set(doc) == {"error"}, doc
    error = doc["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    if code is not None:
        assert error["code"] == code, error
    expected = SPECIAL.get((expected_status, error["code"]), (TYPES[expected_status],))
    assert error["type"] in expected, error
    assert error["param"] == param, error
    return error
