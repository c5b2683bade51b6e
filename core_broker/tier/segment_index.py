"""The consume-queue entries that point into one sealed segment, copied from the local queues.

Why per segment: once local retention deletes a segment, the local consume-queue
entries that point into it go too, so the tier needs what finds a message in that
segment beside the segment itself. Why copied rather than rebuilt from the
records: rebuilding means parsing every record header in Python on the upload
thread, which for 1 KiB messages costs about as much GIL time as writing them,
and slowed concurrent puts by a third (bench/RESULTS.md, tier); the entries of
one queue that point into one segment are one run of consecutive offsets in the
local queue (entries are appended in log order), found by binary search and
copied as they are. The uploader takes a segment only once a checkpoint covers
it, so its entries are complete; retention cannot drop them meanwhile (it waits
for the upload).

The index object is the concatenation, queue after queue (sorted by topic and
queue id), of those runs in the local format (``consume_queue.ENTRY``, 20 bytes:
commitlog offset, size, tag hash); the manifest names per queue the first and
end offsets and where the run starts in the object. Keys and client message ids
(the local IndexFile) are not copied yet.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import record
from ..consume_queue import ENTRY, ConsumeQueue
from ..light_queue import LightQueue
from ..mapped_file import MappedFile

if TYPE_CHECKING:
    from ..message_store import MessageStore


@dataclass
class SegmentIndex:
    """What the tier needs of one sealed segment besides its bytes."""

    length: int = 0  # bytes from the segment's start to the end of its last record
    size: int = 0  # the segment file's size (what is uploaded: records, filler and zero tail)
    sha256: str = ""  # of the whole file
    first_ts: int = 0  # store timestamps (ms) of its first and last records
    last_ts: int = 0
    queues: list[list] = field(default_factory=list)  # [topic, queue id, first, end, position in data]
    data: bytes = b""  # the index object


def _first_at_or_after(cq: ConsumeQueue, phys: int) -> int:
    """The first queue offset whose entry points at or past commitlog offset ``phys``."""
    lo, hi = cq.min_offset, cq.max_offset
    while lo < hi:
        mid = (lo + hi) // 2
        e = cq.entry(mid)
        if e is not None and e[0] < phys:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _raw_entries(cq: ConsumeQueue, lo: int, hi: int) -> bytes:
    """The entries of offsets ``[lo, hi)`` as stored (they may span queue files)."""
    if isinstance(cq, LightQueue):  # an LMQ's entries are in memory (light_queue.py)
        raw = cq.raw(lo, hi - lo)
        if len(raw) != (hi - lo) * ENTRY.size:
            raise ValueError(f"queue {cq.topic}/{cq.queue_id}: offsets [{lo}, {hi}) are not all held")
        return raw
    out = []
    off = lo
    while off < hi:
        f = cq.files.find(off * ENTRY.size)
        if f is None:
            raise ValueError(f"queue {cq.topic}/{cq.queue_id}: no file holds offset {off}")
        start = off * ENTRY.size - f.base
        stop = min(hi * ENTRY.size - f.base, f.size)
        out.append(bytes(f.mm[start:stop]))
        off = (f.base + stop) // ENTRY.size
    return b"".join(out)


def build_index(store: "MessageStore", mf: MappedFile) -> SegmentIndex:
    """The entries of every local queue that point into the sealed segment ``mf``, its record
    span and timestamps, and its digest (read on the calling thread: the uploader's)."""
    ix = SegmentIndex()
    parts: list[bytes] = []
    pos = 0
    last = mf.base  # commitlog offset of the last record a queue names
    for (topic, qid), cq in sorted(list(store._cqs.items())):  # a snapshot: queues come and go
        try:
            lo = _first_at_or_after(cq, mf.base)
            hi = _first_at_or_after(cq, mf.end)
            if hi <= lo:
                continue
            raw = _raw_entries(cq, lo, hi)
        except ValueError:  # the queue was deleted (its topic dropped) meanwhile
            continue
        last = max(last, ENTRY.unpack_from(raw, len(raw) - ENTRY.size)[0])
        ix.queues.append([topic, qid, lo, hi, pos])
        parts.append(raw)
        pos += len(raw)
    ix.data = b"".join(parts)
    fd = os.open(mf.path, os.O_RDONLY)
    try:
        ix.size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, ix.size, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        # from the last record a queue names to the segment's end (records of no queue, a
        # deleted topic's, may follow it): the record span and the newest timestamp
        p = last - mf.base
        while True:
            kind, n = record.check(mm, p, ix.size)
            if kind != 1:
                break
            ix.last_ts = record.parse_header(mm, p).store_ts
            p += n
        ix.length = p
        if p:
            ix.first_ts = record.parse_header(mm, 0).store_ts
        with memoryview(mm) as mv:
            ix.sha256 = hashlib.sha256(mv).hexdigest()  # releases the GIL
    finally:
        try:
            mm.close()
        except BufferError:
            pass
    return ix

