"""The queue entries and keys of one sealed segment, built from its records alone.

Why per segment and from the records: once a segment leaves the local disk, the
local consume queues and index files that point into it go too (retention drops
them with it), so the tier needs what finds a message in that segment beside the
segment itself. Every record names its queue offsets (and its extra dispatch
targets), so one scan of the segment rebuilds exactly the consume-queue entries
and index keys that point into it, the way crash recovery does; no local queue
file has to be read or kept in step.

Encoding (little-endian): ``u32`` queue count, then per queue ``u16`` topic
length, topic (UTF-8), ``i32`` queue id, ``u32`` entry count and that many
``(i64 queue offset, i64 commitlog offset, i32 size, i64 tag hash)``; then
``u32`` key count and per key ``u16`` length, key (UTF-8: ``topic#key`` or
``#id#message-id`` as the local index), ``i64`` commitlog offset, ``i64`` store
timestamp.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .. import record
from ..appender import tag_hash

ENTRY = struct.Struct("<qqiq")  # queue offset, commitlog offset, size, tag hash (28 bytes)
_KEY = struct.Struct("<qq")  # commitlog offset, store timestamp
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")

Entry = tuple[int, int, int, int]  # queue offset, commitlog offset, size, tag hash


@dataclass
class SegmentIndex:
    """What one scan of a sealed segment found."""

    length: int = 0  # bytes from the segment's start to the end of its last record
    size: int = 0  # the segment file's size (what is uploaded: records, filler and zero tail)
    sha256: str = ""  # of the whole file
    first_ts: int = 0
    last_ts: int = 0
    queues: dict[tuple[str, int], list[Entry]] = field(default_factory=dict)
    keys: list[tuple[str, int, int]] = field(default_factory=list)

    def encode(self) -> tuple[bytes, dict[tuple[str, int], int]]:
        """The index object, and where each queue's first entry starts in it (the manifest
        records it, so a reader fetches a queue's entries with one ranged GET)."""
        out = [_U32.pack(len(self.queues))]
        pos = _U32.size
        where: dict[tuple[str, int], int] = {}
        for (topic, qid), entries in sorted(self.queues.items()):
            tb = topic.encode()
            out += [_U16.pack(len(tb)), tb, _I32.pack(qid), _U32.pack(len(entries))]
            pos += 2 + len(tb) + 8
            where[(topic, qid)] = pos
            out += [ENTRY.pack(*e) for e in entries]
            pos += len(entries) * ENTRY.size
        out.append(_U32.pack(len(self.keys)))
        for key, phys, ts in self.keys:
            kb = key.encode()
            out += [_U16.pack(len(kb)), kb, _KEY.pack(phys, ts)]
        return b"".join(out), where

    def queue_ranges(self, where: dict[tuple[str, int], int]) -> list[list]:
        """``[topic, queue id, first offset, end offset, entries' position in the index]`` per
        queue; a queue's entries in one segment have consecutive offsets."""
        return [[t, q, e[0][0], e[-1][0] + 1, where[(t, q)]] for (t, q), e in sorted(self.queues.items()) if e]

    @classmethod
    def decode(cls, data: bytes) -> "SegmentIndex":
        ix = cls()
        p = 0
        (nq,) = _U32.unpack_from(data, p)
        p += 4
        for _ in range(nq):
            (tl,) = _U16.unpack_from(data, p)
            topic = data[p + 2 : p + 2 + tl].decode()
            p += 2 + tl
            (qid,) = _I32.unpack_from(data, p)
            (n,) = _U32.unpack_from(data, p + 4)
            p += 8
            ix.queues[(topic, qid)] = [ENTRY.unpack_from(data, p + i * ENTRY.size) for i in range(n)]
            p += n * ENTRY.size
        (nk,) = _U32.unpack_from(data, p)
        p += 4
        for _ in range(nk):
            (kl,) = _U16.unpack_from(data, p)
            key = data[p + 2 : p + 2 + kl].decode()
            p += 2 + kl
            phys, ts = _KEY.unpack_from(data, p)
            p += _KEY.size
            ix.keys.append((key, phys, ts))
        return ix


def scan_segment(path: Path, base: int) -> SegmentIndex:
    """Read a sealed segment file once: its records' queue entries and keys, length, digest.

    The whole file is what the tier stores (its tail after the last record is one
    BLANK filler, at most a message's size, and zeros): it can then go up straight
    from the file, and a ranged GET at a record's segment position needs no mapping.

    The file is mapped read-only by this call (not the store's mapping), on the uploader's
    thread; a sealed segment's bytes never change.
    """
    ix = SegmentIndex()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        pos = 0
        while True:
            kind, n = record.check(mm, pos, size)
            if kind != 1:
                break  # a BLANK filler, the zero tail or the segment's end
            h = record.parse_header(mm, pos)
            th = tag_hash(h.tag)
            _add(ix.queues, h.topic, h.queue_id, (h.queue_offset, base + pos, h.size, th))
            for topic, qid, qo in h.dispatch:
                _add(ix.queues, topic, qid, (qo, base + pos, h.size, th))
            if h.origin_offset < 0:
                ix.keys += [(f"{h.topic}#{k}", base + pos, h.store_ts) for k in h.keys]
                if h.message_id:
                    ix.keys.append(("#id#" + h.message_id, base + pos, h.store_ts))
            if not ix.first_ts:
                ix.first_ts = h.store_ts
            ix.last_ts = h.store_ts
            pos += n
        ix.length = pos
        ix.size = size
        with memoryview(mm) as mv:
            ix.sha256 = hashlib.sha256(mv).hexdigest()
    finally:
        try:
            mm.close()
        except BufferError:
            pass
    return ix


def _add(queues: dict[tuple[str, int], list[Entry]], topic: str, qid: int, entry: Entry) -> None:
    """Append a queue entry, keeping each queue's entries one run of consecutive offsets.

    Offsets go back only when a topic was deleted and created again while this segment
    was written (its queue restarts at 0): the local queue then holds the new run alone,
    and so does the tier.
    """
    entries = queues.setdefault((topic, qid), [])
    if entries and entry[0] != entries[-1][0] + 1:
        entries.clear()
    entries.append(entry)
