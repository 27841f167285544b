"""Decoding KV-event payloads as vLLM encodes them (both wire forms) and refusing hostile ones.

The payloads are built with msgpack in vLLM's layouts: msgspec encodes a ``tag=True`` struct
as a map with a ``"type"`` key (0.32) or, with ``array_like=True`` (earlier releases), as an
array led by the tag with the fields in declaration order; ``EventBatch`` as ``[ts, events,
dp_rank]`` (array_like) or a map.
"""

from __future__ import annotations

import msgpack
import pytest

from llmplane.gateway.kvcache.events import (
    BadPayload,
    Cleared,
    EventLimits,
    Removed,
    Stored,
    decode_batch,
    encode_batch,
)

TOKENS = list(range(8))


def stored_map(**extra):
    event = {
        "type": "BlockStored",
        "block_hashes": [11, 22],
        "parent_block_hash": None,
        "token_ids": TOKENS,
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    event.update(extra)
    return event


def test_map_tagged_events_decode_with_unknown_fields_ignored() -> None:
    payload = msgpack.packb(
        [
            1700000000.5,
            [
                stored_map(extra_keys=None, group_idx=0, kv_cache_spec_kind="full", future=1),
                {"type": "BlockRemoved", "block_hashes": [22], "medium": "GPU", "x": [1]},
                {"type": "AllBlocksCleared"},
                {"type": "BlockAccessed", "block_hashes": [1]},  # a newer engine's type
            ],
            0,
        ]
    )
    batch = decode_batch(payload)
    assert batch.ts == 1700000000.5
    assert batch.events == [
        Stored([11, 22], None, TOKENS, 4, None, None),
        Removed([22]),
        Cleared(),
    ]
    assert batch.skipped == 1


def test_positional_events_decode() -> None:
    digest = bytes(range(32))  # newer vLLM: sha256 block hashes as bytes
    payload = msgpack.packb(
        [
            2.0,
            [
                ["BlockStored", [digest], 7, TOKENS[:4], 4, 3, "GPU"],  # lora_id 3, no name
                ["BlockRemoved", [digest, 9], "GPU"],
                ["AllBlocksCleared"],
            ],
        ]
    )
    batch = decode_batch(payload)
    assert batch.events == [
        Stored([digest], 7, TOKENS[:4], 4, "#3", None),
        Removed([digest, 9]),
        Cleared(),
    ]


def test_map_batch_and_round_trip_of_our_encoder() -> None:
    payload = msgpack.packb({"ts": 3, "events": [stored_map()], "data_parallel_rank": 0})
    assert decode_batch(payload).events == [Stored([11, 22], None, TOKENS, 4)]
    events = [Stored([1, 2], 5, TOKENS, 4, "ad"), Removed([1]), Cleared()]
    for positional in (False, True):
        assert decode_batch(encode_batch(9.0, events, positional)).events == events


def test_other_tiers_and_kv_groups_are_skipped() -> None:
    payload = msgpack.packb([0, [stored_map(medium="CPU"), stored_map(group_idx=1), stored_map()]])
    batch = decode_batch(payload)
    assert len(batch.events) == 1 and batch.skipped == 2


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\x00" * (128 * 1024 + 1), "oversized"),
        (b"\xc1", "malformed"),  # msgpack's never-used byte
        (b"\x92\xcb", "malformed"),  # truncated
        (msgpack.packb("text"), "malformed"),
        (msgpack.packb([1.0, "not a list"]), "malformed"),
        (msgpack.packb(["ts", []]), "malformed"),
        (msgpack.packb([1.0, [{"type": "AllBlocksCleared"}] * 101]), "too_many_events"),
        (msgpack.packb({"ts": 1.0}), "malformed"),
        (b"\x91" * 5000 + b"\xc0", "malformed"),  # nested 5,000 deep
        (b"\xdd\xff\xff\xff\xff", "malformed"),  # an array claiming 4G elements
        (msgpack.packb([1.0, [], {"k" * 70_000: 1}]), "malformed"),  # string over the cap
    ],
    ids=lambda v: v if isinstance(v, str) else f"{len(v)}-bytes",
)
def test_hostile_payloads_are_refused_with_a_reason(payload: bytes, reason: str) -> None:
    limits = EventLimits(message_bytes=128 * 1024, events=100, hashes=16)
    with pytest.raises(BadPayload) as err:
        decode_batch(payload, limits)
    assert err.value.reason == reason


@pytest.mark.parametrize(
    "event",
    [
        stored_map(block_hashes=list(range(17))),  # over the hashes limit
        stored_map(token_ids=TOKENS[:7]),  # tokens do not fill the blocks
        stored_map(token_ids=[*TOKENS[:7], -1]),
        stored_map(token_ids=[*TOKENS[:7], "x"]),
        stored_map(block_size=0),
        stored_map(block_size=True),
        stored_map(block_hashes=[1.5, 2]),
        stored_map(block_hashes=[b"x" * 65, 2]),
        stored_map(parent_block_hash=[1]),
        {"type": "BlockRemoved", "block_hashes": "abc"},
        {"type": "BlockRemoved", "block_hashes": [None]},
        ["BlockStored"],
        [],
        7,
        None,
    ],
)
def test_bad_events_are_skipped_and_the_rest_kept(event: object) -> None:
    limits = EventLimits(hashes=16)
    batch = decode_batch(msgpack.packb([0, [event, {"type": "AllBlocksCleared"}]]), limits)
    assert batch.events == [Cleared()]
    assert batch.skipped == 1
