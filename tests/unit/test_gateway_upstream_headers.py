"""Upstream response headers are relayed as the bytes that came (less hop-by-hop lines) and
decoded only when looked up."""

from __future__ import annotations

from llmplane.gateway.upstream_client import RawHeaders


def test_forward_keeps_bytes_and_drops_skipped_names_in_any_case():
    lines = [
        b"Content-Type: application/json; charset=utf-8",
        b"content-length: 12",
        b"X-Request-Id:  abc ",
        b"Transfer-Encoding: chunked",
        b"Set-Cookie: a=1",
        b"Set-Cookie: b=2",
        b"X-Caf\xc3\xa9: ol\xc3\xa9",
    ]
    raw = RawHeaders(lines)
    out = raw.forward(frozenset({b"content-length", b"transfer-encoding"}))
    assert out == (
        b"Content-Type: application/json; charset=utf-8\r\n"
        b"X-Request-Id:  abc \r\n"
        b"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\n"
        b"X-Caf\xc3\xa9: ol\xc3\xa9\r\n"
    )
    assert RawHeaders([]).forward(frozenset()) == b""
    # Lookups: case-insensitive, stripped, every value of a repeated header kept.
    assert raw["content-type"] == "application/json; charset=utf-8"
    assert raw.get("x-request-id") == "abc"
    assert raw._decoded().getall("set-cookie") == ["a=1", "b=2"]
    assert raw.get("missing") is None and len(raw) == 7
