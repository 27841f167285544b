"""KV-cache events as engines publish them (vLLM's ``KVEventBatch``), decoded with limits.

Both encodings decode: events as maps tagged by ``"type"`` (vLLM 0.32) and as positional arrays
led by the tag (earlier releases); unknown fields and event types are ignored, so a newer
engine's additions do not break decoding. A publisher is not trusted (``EventLimits``): a
refused payload raises ``BadPayload`` with a reason fit for a metric label, a refused event is
skipped and counted in ``Batch.skipped``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

STORED, REMOVED, CLEARED = "BlockStored", "BlockRemoved", "AllBlocksCleared"
# The KV tier the gateway indexes: the GPU's (vLLM names it so on CPU builds too); blocks
# offloaded elsewhere by a connector are not a prefix hit for the scheduler.
INDEXED_MEDIA = (None, "GPU")
MAX_HASH_BYTES = 64  # vLLM's block hashes: Python ints (8 bytes) or sha256 digests (32)

EngineHash = int | bytes


class BadPayload(ValueError):
    """``reason``: a metric label, never a value from the payload."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class EventLimits:
    """What one message may carry (defaults: 8 MiB, 16,384 events, 8,192 hashes an event:
    a 1M-token prefill at block size 128 is 8,192 blocks)."""

    message_bytes: int = 8 << 20
    events: int = 16_384
    hashes: int = 8_192
    block_size: int = 4_096


@dataclass(slots=True)
class Stored:
    hashes: list[EngineHash]
    parent: EngineHash | None
    token_ids: list[int]
    block_size: int
    lora: str | None = None
    # Per block: what else the engine hashed (multimodal ids, cache salt); None when nothing.
    extra: list[Any] | None = None


@dataclass(slots=True)
class Removed:
    hashes: list[EngineHash]


@dataclass(slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


@dataclass(slots=True)
class Batch:
    ts: float
    events: list[Event] = field(default_factory=list)
    skipped: int = 0  # events refused or not for the indexed tier


# Field order of the positional form (msgspec array_like structs, declaration order).
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


def _hash(value: Any) -> EngineHash:
    if isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < 1 << 64:
        return value
    if isinstance(value, bytes) and 0 < len(value) <= MAX_HASH_BYTES:
        return value
    raise ValueError("block hash")


def _hashes(value: Any, limits: EventLimits) -> list[EngineHash]:
    if not isinstance(value, list) or len(value) > limits.hashes:
        raise ValueError("block_hashes")
    return [_hash(v) for v in value]


def _fields(raw: dict[str, Any] | list[Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The fields of a map-tagged or positional event by name."""
    return raw if isinstance(raw, dict) else dict(zip(names, raw[1:], strict=False))


def _event(raw: Any, limits: EventLimits) -> Event | None:
    """One event, None for one the index does not use; ValueError for a bad one."""
    if isinstance(raw, dict):
        tag = raw.get("type")
    elif isinstance(raw, list) and raw:
        tag = raw[0]
    else:
        raise ValueError("event")
    if tag == STORED:
        f = _fields(raw, _STORED_FIELDS)
        if f.get("medium") not in INDEXED_MEDIA or f.get("group_idx") not in (None, 0):
            return None
        hashes = _hashes(f.get("block_hashes"), limits)
        size, tokens = f.get("block_size"), f.get("token_ids")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= limits.block_size:
            raise ValueError("block_size")
        if not isinstance(tokens, list) or len(tokens) != size * len(hashes):
            raise ValueError("token_ids")
        if not all(type(t) is int and 0 <= t < 1 << 32 for t in tokens):
            raise ValueError("token_ids")
        parent = f.get("parent_block_hash")
        lora = f.get("lora_name")
        if lora is None and f.get("lora_id") is not None:
            lora = f"#{f['lora_id']}"  # older releases name the adapter by id only
        extra = f.get("extra_keys")
        return Stored(
            hashes,
            None if parent is None else _hash(parent),
            tokens,
            size,
            lora if isinstance(lora, str) else None,
            extra if isinstance(extra, list) and len(extra) == len(hashes) else None,
        )
    if tag == REMOVED:
        f = _fields(raw, _REMOVED_FIELDS)
        if f.get("medium") not in INDEXED_MEDIA or f.get("group_idx") not in (None, 0):
            return None
        return Removed(_hashes(f.get("block_hashes"), limits))
    if tag == CLEARED:
        return Cleared()
    return None  # an event type of a newer engine


def decode_batch(payload: bytes, limits: EventLimits = EventLimits()) -> Batch:
    """The batch in one message's payload (``BadPayload`` when it is refused as a whole)."""
    if len(payload) > limits.message_bytes:
        raise BadPayload("oversized", f"{len(payload)} bytes")
    try:
        raw = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=False,
            use_list=True,
            max_str_len=1 << 16,
            max_bin_len=1 << 16,
            max_ext_len=0,
            max_map_len=64,
        )
    except Exception as err:  # msgpack raises several types for bad or over-limit input
        raise BadPayload("malformed", type(err).__name__) from None
    if isinstance(raw, dict):
        ts, events = raw.get("ts"), raw.get("events")
    elif isinstance(raw, list) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
    else:
        raise BadPayload("malformed", "not a batch")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not isinstance(events, list):
        raise BadPayload("malformed", "not a batch")
    if len(events) > limits.events:
        raise BadPayload("too_many_events", str(len(events)))
    batch = Batch(float(ts))
    for raw_event in events:
        try:
            event = _event(raw_event, limits)
        except (ValueError, TypeError, KeyError):
            event = None
        if event is None:
            batch.skipped += 1
        else:
            batch.events.append(event)
    return batch


def encode_batch(ts: float, events: list[Event], positional: bool = False) -> bytes:
    """A batch as vLLM 0.32 encodes it (map-tagged events), or as earlier releases did
    (``positional``): the simulator publishes with this."""
    out: list[Any] = []
    for e in events:
        if isinstance(e, Stored):
            tag, names = STORED, _STORED_FIELDS
            values = [e.hashes, e.parent, e.token_ids, e.block_size, None, "GPU", e.lora, e.extra]
        elif isinstance(e, Removed):
            tag, names, values = REMOVED, _REMOVED_FIELDS, [e.hashes, "GPU"]
        else:
            tag, names, values = CLEARED, (), []
        out.append(
            [tag, *values]
            if positional
            else {"type": tag, **dict(zip(names, values, strict=False))}
        )
    return msgpack.packb([ts, out, 0])
