"""The keys object: a sealed segment's keys and client message ids, so queries find them in the tier.

Why: the local IndexFile (``index_file``) answers a query by key (``topic#key``) or by a
client-chosen message id (``#id#<id>``: MQTT, AMQP and CloudEvents ids), but its entries
go with the local segments they point into. Before a segment leaves local disk the uploader
copies the entries that point into it, as they are (key hash, commitlog offset, store
time), into one object per segment, sorted by hash: a query reads it by binary search
through the tier's block cache (a few ranged GETs the first time, none once cached) and
then reads each candidate record and checks it, as the local query does (hashes collide).

Format: ``ENTRY`` records, 20 bytes each (crc32c of the key string, commitlog offset, store
time in ms), sorted by (hash, offset); no header (the manifest names its length).
"""

from __future__ import annotations

import struct
from typing import Callable

ENTRY = struct.Struct("<Iqq")


def encode(entries: list[tuple[int, int, int]]) -> bytes:
    """The keys object of ``entries`` (already sorted by hash then offset)."""
    buf = bytearray(len(entries) * ENTRY.size)
    for i, e in enumerate(entries):
        ENTRY.pack_into(buf, i * ENTRY.size, *e)
    return bytes(buf)


def lookup(read: Callable[[int, int], bytes], length: int, h: int, begin_ts: int, end_ts: int,
           limit: int) -> list[int]:
    """Commitlog offsets of the entries with hash ``h`` stored in ``[begin_ts, end_ts]``, at most
    ``limit``; ``read(start, end)`` gives bytes of the object (through the block cache)."""
    n = length // ENTRY.size
    lo, hi = 0, n
    while lo < hi:  # the first entry with a hash >= h
        mid = (lo + hi) // 2
        if ENTRY.unpack(read(mid * ENTRY.size, (mid + 1) * ENTRY.size))[0] < h:
            lo = mid + 1
        else:
            hi = mid
    out: list[int] = []
    i = lo
    while i < n and len(out) < limit:
        chunk = read(i * ENTRY.size, min(n, i + 64) * ENTRY.size)
        for eh, phys, ts in ENTRY.iter_unpack(chunk):
            if eh != h:
                return out
            if begin_ts <= ts <= end_ts:
                out.append(phys)
                if len(out) >= limit:
                    return out
        i += 64
    return out
