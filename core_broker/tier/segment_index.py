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
queue id), of those runs in the local format: ``consume_queue.ENTRY`` (20 bytes:
commitlog offset, size, tag hash) for a classic queue, ``batch_queue.ENTRY`` (32
bytes: the same three, then the record's first queue offset and message count)
for a batch topic's queue, whose entries are per record, not per offset. Both
begin with the same 20 bytes, so what needs only the record's place reads either
alike. The manifest names per queue the first and end offsets, where the run
starts in the object and its entry size (``layout.Manifest.queues``).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import record
from ..batch_queue import ENTRY as BATCH_ENTRY, BatchConsumeQueue
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
    first_ts: int = 0  # store timestamps (ms) of its first and last records
    last_ts: int = 0
    queues: list[list] = field(default_factory=list)  # [topic, queue id, first, end, position in data, entry size]
    data: bytes = b""  # the index object


def _slots(cq: ConsumeQueue | BatchConsumeQueue) -> tuple[int, int, int]:
    """(first entry, end entry, entry size) of a queue: a classic queue's entries are its offsets,
    a batch queue's are its records (each holding one or more offsets)."""
    if isinstance(cq, BatchConsumeQueue):
        return cq.min_entry, cq.entries, BATCH_ENTRY.size
    return cq.min_offset, cq.max_offset, ENTRY.size


def _phys_of(cq: ConsumeQueue | BatchConsumeQueue, k: int) -> int | None:
    """The commitlog offset entry ``k`` points at (None: not held)."""
    e = cq.entry_at(k) if isinstance(cq, BatchConsumeQueue) else cq.entry(k)
    return None if e is None else e[0]


def _first_at_or_after(cq: ConsumeQueue | BatchConsumeQueue, phys: int) -> int:
    """The first entry that points at or past commitlog offset ``phys``."""
    lo, hi, _ = _slots(cq)
    while lo < hi:
        mid = (lo + hi) // 2
        p = _phys_of(cq, mid)
        if p is not None and p < phys:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _raw_entries(cq: ConsumeQueue | BatchConsumeQueue, lo: int, hi: int, size: int) -> bytes:
    """Entries ``[lo, hi)`` (``size`` bytes each) as stored (they may span queue files)."""
    if isinstance(cq, LightQueue):  # an LMQ's entries are in memory (light_queue.py)
        raw = cq.raw(lo, hi - lo)
        if len(raw) != (hi - lo) * size:
            raise ValueError(f"queue {cq.topic}/{cq.queue_id}: offsets [{lo}, {hi}) are not all held")
        return raw
    out = []
    off = lo
    while off < hi:
        f = cq.files.find(off * size)
        if f is None:
            raise ValueError(f"queue {cq.topic}/{cq.queue_id}: no file holds entry {off}")
        start = off * size - f.base
        stop = min(hi * size - f.base, f.size)
        if stop <= start:
            raise ValueError(f"queue {cq.topic}/{cq.queue_id}: entry {off} lies past its file")
        out.append(bytes(f.mm[start:stop]))
        off = (f.base + stop) // size
    return b"".join(out)


def _offsets(raw: bytes, lo: int, hi: int, size: int) -> tuple[int, int]:
    """The queue offsets ``[first, end)`` that entries ``[lo, hi)`` (``raw``) hold."""
    if size == ENTRY.size:
        return lo, hi
    first = BATCH_ENTRY.unpack_from(raw, 0)[3]
    _, _, _, last_first, count = BATCH_ENTRY.unpack_from(raw, len(raw) - size)
    return first, last_first + count


def build_index(store: "MessageStore", mf: MappedFile) -> SegmentIndex:
    """The entries of every local queue that point into the sealed segment ``mf``, its record
    span and timestamps (read on the calling thread: the uploader's; the upload process, which
    reads the whole file anyway, computes its digest)."""
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
            size = _slots(cq)[2]
            raw = _raw_entries(cq, lo, hi, size)
        except ValueError:  # the queue was deleted (its topic dropped) meanwhile
            continue
        last = max(last, ENTRY.unpack_from(raw, len(raw) - size)[0])
        ix.queues.append([topic, qid, *_offsets(raw, lo, hi, size), pos, size])
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
    finally:
        try:
            mm.close()
        except BufferError:
            pass
    return ix

