"""``gateway/clip.py``: what of a client's string reaches a log line or an error message."""

from __future__ import annotations

from llmplane.gateway.clip import MAX_SHOWN, clip, shown


def test_short_strings_are_kept_and_long_ones_clipped_with_their_length() -> None:
    assert clip("llama") == "llama"
    assert clip("x" * MAX_SHOWN) == "x" * MAX_SHOWN
    long = "é" * (8 * 1024 * 1024)
    assert clip(long) == "é" * MAX_SHOWN + f"... ({len(long)} characters)"
    assert shown("m" * 1000) == repr("m" * MAX_SHOWN + "... (1000 characters)")
    assert shown("ok") == "'ok'" and shown(3) == "3" and shown(None) == "None"


def test_large_values_are_shown_in_a_bounded_text() -> None:
    values = [list(range(5_000_000)), {"text": "x" * 50_000_000}, [["y" * 1000] * 1000] * 1000]
    for value in values:
        text = shown(value)
        assert len(text) <= MAX_SHOWN + 40, text[:80]
