"""The commitlog as bytes to copy: what replication reads on a master and writes on a replica.

A replicated broker group keeps *identical* commitlogs: the same bytes at the same
offsets, segments rolling at the same places. That makes everything derived from
the log (consume queues, the index, server-assigned message ids, which encode a
record's offset, and the broker journal with consumer offsets, pop state and door
state) the same on every member, so a replica that becomes master serves exactly
what the old master acknowledged. RocketMQ's HA does the same (it ships commitlog
bytes, never messages).

- :func:`read_log` (master): whole records from ``start``, never past the write
  position, never across a segment end. A segment's unusable tail (its BLANK
  filler) is not sent: the answer then starts at the next segment, and the
  replica's own roll writes the same filler.
- :func:`append_replicated` (replica): the bytes verbatim at the same offsets,
  each record checked (size, magic, CRC) and dispatched into consume queues and
  the index exactly as a local put's would be.
- :func:`truncate_to`: cut the log back to a record boundary (a deposed master's
  unacknowledged tail, a replica rejoining after an epoch change). Crash-safe: an
  intent file is fsynced first and a restart that finds it truncates again before
  serving anything (:func:`resume_truncation`), so no reader ever sees bytes that
  were being cut.

Written by hand: this is the store's own layout; no library knows it.
"""

from __future__ import annotations

import os
import struct
from typing import TYPE_CHECKING

from . import record
from .errors import ReplicaOffsetMismatchError
from .json_file import read_json, write_json_atomic

if TYPE_CHECKING:
    from .message_store import MessageStore

__all__ = ["read_log", "append_replicated", "truncate_to", "resume_truncation", "INTENT_FILE"]

INTENT_FILE = "truncate.intent"
_PREFIX = struct.Struct("<II")  # size, magic of a record's prefix


def read_log(store: MessageStore, start: int, max_bytes: int) -> tuple[int, bytes]:
    """(offset, bytes) of whole records from ``start`` (b"" when ``start`` is the end).

    The offset is ``start``, or the next segment's base when ``start`` is in a
    segment's filler. Raises ReplicaOffsetMismatchError for an offset this log
    does not hold (below its first segment, past its end).
    """
    cl = store.commitlog
    with store._lock:  # a consistent (write position, segment list) pair
        wp = cl.write_pos
        mf = cl.files.find(start) if start < wp else None
    if start == wp:
        return start, b""
    if mf is None or start > wp:
        raise ReplicaOffsetMismatchError(
            f"offset {start} is outside this log [{cl.min_offset}, {wp})"
        )
    mm = mf.mm
    off = start - mf.base
    seg_end = mf.end
    if seg_end - start < 12 or _PREFIX.unpack_from(mm, off)[1] == record.MAGIC_BLANK:
        if seg_end >= wp:  # the roll is under way: nothing past the filler yet
            return start, b""
        return read_log(store, seg_end, max_bytes)
    limit = min(wp, seg_end)
    pos = start
    unpack = _PREFIX.unpack_from
    base = mf.base
    # A tail under a record prefix (12 bytes) closes a segment without a BLANK record (see
    # CommitLog.make_room): stop there, never read a prefix across the segment's end.
    while limit - pos >= record.PREFIX.size:
        size, magic = unpack(mm, pos - base)
        if magic == record.MAGIC_BLANK or size <= 0:
            break
        if pos + size - start > max_bytes and pos > start:
            break
        pos += size
    return start, bytes(mm[off : pos - base])


def append_replicated(store: MessageStore, start: int, data: bytes) -> int:
    """Write a master's bytes at ``start`` (this log's end, or the next segment's base).

    Returns the new write position. The bytes must be whole valid records (checked
    one by one before anything becomes visible: a bad record refuses the whole chunk).
    """
    cl = store.commitlog
    n = len(data)
    with store._lock:
        wp = cl.write_pos
        seg = cl.segment_size
        if start != wp:
            cur = cl.current
            rolling = cur is not None and start == cur.end and start % seg == 0
            empty = cur is None and not cl.files.files
            if not (rolling or empty):
                raise ReplicaOffsetMismatchError(f"replicated bytes start at {start}, this log ends at {wp}")
            if empty:
                cl.set_write_pos(start)
        if not n:
            return cl.write_pos
        if cl.current is None or cl.write_pos + n > cl.limit:
            pos = cl.make_room(n)  # a warm-up claim in the way, or the roll to the next segment
            if pos != start:
                raise ReplicaOffsetMismatchError(f"replicated bytes start at {start}, the log rolled to {pos}")
        cl.stage_at(start, data)  # not yet visible: the write position moves below
        cur = cl.current
        off = start - cur.base  # type: ignore[union-attr]
        # One pass checks each record (size, magic, CRC) and dispatches it; the write position
        # moves only past what it accepted, so readers never see a bad record. A chunk with a
        # bad record in it (it cannot happen between two unimq brokers: the master sends only
        # records it checked... except through a corrupting network) is cut where it turns bad.
        end = min(cl.scan(start, store._dispatch_header), start + n)  # (a scan may step to a next segment's base)
        if end < start + n:
            from .mapped_file import zero_range

            zero_range(cur.fd, cur.mm, end - cur.base, off + n)  # type: ignore[union-attr]
            cl.write_pos = end
            raise ReplicaOffsetMismatchError(f"replicated bytes hold no valid record at {end}")
        cl.write_pos = end
        return end


def truncate_to(store: MessageStore, offset: int) -> None:
    """Cut every record at or after ``offset`` (a record boundary), crash-safely."""
    intent = store.root / INTENT_FILE
    write_json_atomic(intent, {"to": offset})
    _truncate(store, offset)
    os.unlink(intent)


def resume_truncation(store: MessageStore) -> int | None:
    """At start, before recovery: finish a truncation a crash interrupted. Returns its offset."""
    intent = store.root / INTENT_FILE
    if not intent.exists():
        return None
    to = int(read_json(intent, {}).get("to", 0))
    _truncate(store, to)
    os.unlink(intent)
    return to


def _truncate(store: MessageStore, offset: int) -> None:
    # The checkpoint first: recovery must never trust a "safe" position past the cut,
    # nor a clean end (the cut log is rescanned from the checkpoint as after a crash).
    cp = read_json(store.checkpoint_path, {})
    safe = min(int(cp.get("safe", 0)), offset)
    write_json_atomic(store.checkpoint_path, {"safe": safe, "ts": cp.get("ts", 0)})
    cl = store.commitlog
    with store._lock:
        if cl.files.files:
            cl.truncate(offset)
        else:
            cl.set_write_pos(offset)
        flush = store._flush
        if flush is not None and flush.flushed > offset:  # later bytes there are not flushed yet
            flush.flushed = offset
        for cq in store._cqs.values():
            cq.truncate_beyond_phys(offset)
            cq.sync()
