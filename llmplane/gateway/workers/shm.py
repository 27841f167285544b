"""Shared-memory building blocks for the gateway's workers: anonymous ``MAP_SHARED`` mappings
made before the fork (every worker and replacement sees the same pages, nothing to name or
clean up), and record locks (``fcntl.lockf``) on one unlinked file, which the kernel drops
when their holder dies, so a killed worker never leaves one held."""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import tempfile

# Byte offsets in the lock file, one per thing a lock protects.
LOCK_ENDPOINTS = 0
LOCK_BUCKET_KEYS = 1
LOCK_BUCKETS = 2


class Locks:
    """Record locks on one unlinked file; ``held(byte)`` excludes every other process."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile(prefix="llmplane-locks-")  # noqa: SIM115 (kept open)
        self.fd = self.file.fileno()

    def held(self, byte: int) -> RecordLock:
        return RecordLock(self, byte)


class RecordLock:
    """A reusable ``with`` block holding a lock on one byte of the lock file."""

    __slots__ = ("byte", "fd", "locks")

    def __init__(self, locks: Locks, byte: int) -> None:
        self.locks = locks  # keeps the file open
        self.fd = locks.fd
        self.byte = byte

    def __enter__(self) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, self.byte, os.SEEK_SET)

    def __exit__(self, *exc: object) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, self.byte, os.SEEK_SET)


def region(size: int) -> mmap.mmap:
    """``size`` zeroed bytes shared with every process forked after this call."""
    return mmap.mmap(-1, max(size, mmap.PAGESIZE))


def cells(count: int, kind: str = "q") -> memoryview:
    """``count`` zeroed shared cells of 8 bytes (``kind``: "q" int64, "Q" uint64, "d" float64),
    each one written only whole, so a reader never sees half of a store."""
    return memoryview(region(count * 8)).cast(kind)[:count]


_DOC_HEAD = 16  # sequence, length


class Document:
    """One byte string in shared memory behind a seqlock, for one writer at a time and any
    number of readers: the writer makes the sequence odd, writes the length and the bytes,
    makes it even; a reader keeps its copy only if the sequence was even and unchanged
    around it. Nobody waits; a reader that sees nothing new pays one 8-byte read. Pages
    are touched only as written, so ``size`` may be generous. Given ``mem``, the document is
    its ``size`` bytes from ``offset`` on (one row of a table of them)."""

    def __init__(self, size: int, mem: mmap.mmap | None = None, offset: int = 0) -> None:
        self.size = size
        self.mem = memoryview(region(size) if mem is None else mem)[offset : offset + size]
        self.words = self.mem.cast("q")

    def write(self, data: bytes) -> bool:
        """Publish ``data``; False (nothing written) if it does not fit."""
        if len(data) > self.size - _DOC_HEAD:
            return False
        words = self.words
        seq = words[0]
        begin = seq + 1 if seq % 2 == 0 else seq + 2  # a writer that died left it odd
        words[0] = begin
        words[1] = len(data)
        self.mem[_DOC_HEAD : _DOC_HEAD + len(data)] = data
        words[0] = begin + 1
        return True

    def read(self, seen: int) -> tuple[int, bytes] | None:
        """(sequence, bytes) if written since ``seen``; None otherwise or while it is being
        written."""
        words = self.words
        seq = words[0]
        if seq == seen or seq % 2:
            return None
        length = min(max(words[1], 0), self.size - _DOC_HEAD)
        data = self.mem[_DOC_HEAD : _DOC_HEAD + length].tobytes()
        if words[0] != seq:
            return None
        return seq, data


class Directory:
    """Key -> row number, the same in every process: an open-addressing table of key hashes
    in shared memory. A look-up takes ``lock`` (it happens when an endpoint or a bucket
    appears, never per request); rows are never freed (``capacity`` bounds the keys a
    gateway run can see; past it ``row`` returns None and the caller keeps a local one)."""

    def __init__(self, capacity: int, lock: RecordLock) -> None:
        self.capacity = capacity
        self.hashes = cells(capacity, "Q")
        self.lock = lock

    def row(self, key: str) -> tuple[int, bool] | None:
        """(row, True if this call added the key), or None when the table is full."""
        # A 64-bit hash, the same in every process, never 0 (a free row).
        h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") | 1
        hashes = self.hashes
        cap = self.capacity
        with self.lock:
            i = h % cap
            for _ in range(cap):
                v = hashes[i]
                if v == h:
                    return i, False
                if v == 0:
                    hashes[i] = h
                    return i, True
                i = (i + 1) % cap
        return None
