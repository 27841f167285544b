"""Smoke checks of the fake protocol servers themselves (``loader_servers.py``)."""

from __future__ import annotations

from tests.integration.loader_servers import parse_range


def test_send_bytes_range_parsing() -> None:
    assert parse_range("bytes=5-", 10) == (5, 9)
    assert parse_range("bytes=2-3", 10) == (2, 3)
    assert parse_range(None, 10) is None
