"""The CommitLog: one append-only log of every topic's messages.

Segments are :class:`MappedFile` objects of ``segment_size`` bytes; a record
never spans two segments (the tail of a segment is filled with a BLANK record
instead). The writer is single-threaded under the store's put lock; readers
may read anything below ``write_pos`` concurrently.

Warm-up (sync flush): a segment is preallocated with ``posix_fallocate``, which
on ext4 leaves *unwritten* extents; the first writeback of each block then
converts its extent, a metadata update that every group-commit fdatasync
covering it has to write too (about 3 synchronous writes per fdatasync instead
of one, and several milliseconds under load). :meth:`warm_step` writes real
zeros a little ahead of the writer, one piece at a time, and fdatasyncs them,
so the fdatasyncs that acknowledge puts find their blocks already written and
flush data only. This is RocketMQ's segment warm-up, done incrementally so a
fresh 1 GiB segment does not stall the first put. The zeros are content-neutral
(the log beyond ``write_pos`` is zero anyway), but they must never land on
bytes a put wrote meanwhile: the warmer *claims* the range under the put lock
(:attr:`limit` drops to the claim's start, so a writer reaching it calls
:meth:`make_room`, which waits for the piece) and writes it outside the lock.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path
from typing import Callable, Iterator

from . import record
from .errors import CorruptRecordError, StoreFullError
from .mapped_file import MappedFile, MappedFileQueue, zero_range
from .model import StoredMessage

_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)
_COPY_MAX = 4096  # a batch this small is copied into the mapping (see write_pieces)

_PAGE = 4096
_ZEROS = bytes(1 << 20)
_NEXT_SUFFIX = ".next"
log = logging.getLogger("unimq.store")


class _Claim:
    """A range of the current segment the warmer is zero-filling right now."""

    __slots__ = ("mf", "start", "end", "done")

    def __init__(self, mf: MappedFile, start: int, end: int) -> None:
        self.mf, self.start, self.end = mf, start, end
        self.done = threading.Event()


class CommitLog:
    def __init__(self, directory: Path, segment_size: int) -> None:
        self.files = MappedFileQueue(directory, segment_size)
        self.segment_size = segment_size
        self.write_pos = 0
        self.current: MappedFile | None = None
        # Writers may append below ``limit`` without looking further: the current
        # segment's end, or the start of a range the warmer is zero-filling.
        self.limit = 0
        self.warm_end = 0  # [write_pos, warm_end) of the current segment holds written zeros
        self._claim: _Claim | None = None
        # The segment after the current one, prepared by the flush thread (prepare_next),
        # still under its temporary name, and how many bytes at its head hold written zeros.
        self._next: MappedFile | None = None
        self._next_warm = 0
        self._next_failed = -1  # base whose preparation failed (a full disk): the roll retries it
        # A segment entered the log (created or renamed into place) since the directory was
        # last fsync'ed; the flush fsyncs it before counting anything as durable (sync_dir).
        self._dir_unsynced = False

    # -- lifecycle -----------------------------------------------------------------

    def load(self) -> None:
        d = self.files.dir
        if d.exists():
            for p in d.iterdir():  # a next segment prepared before a crash was never used
                if p.name.endswith(_NEXT_SUFFIX):
                    p.unlink()
        self.files.load()

    @property
    def min_offset(self) -> int:
        return self.files.min_offset if self.files.files else self.write_pos

    def set_write_pos(self, pos: int) -> None:
        """Position the writer after recovery; segments past it are gone already."""
        self.write_pos = pos
        self.current = self.files.find(pos) if self.files.files else None
        if self.current is None and self.files.files and pos == self.files.files[-1].end:
            self.current = self.files.files[-1]
        self.limit = self.current.end if self.current is not None else 0
        self.warm_end = pos

    # -- write path ----------------------------------------------------------------

    def roll(self, needed: int) -> int:
        """Close the current segment with a BLANK filler and open the next one.

        The new segment is created (and its blocks reserved) before the old one is
        touched, so a full disk leaves the log exactly as it was.
        """
        cur = self.current
        if cur is None:
            base = self.write_pos - self.write_pos % self.segment_size if self.write_pos else 0
            self.current = self.files.create(base)
            self._dir_unsynced = True
            self.write_pos = self.warm_end = base
            self.limit = self.current.end
            return base
        nxt = self._take_next(cur.end)
        warm = self._next_warm if nxt is not None else 0
        self._next_warm = 0
        if nxt is None:
            nxt = self.files.create(cur.end)
        self._dir_unsynced = True
        rest = cur.end - self.write_pos
        if rest >= 12:
            off = self.write_pos - cur.base
            cur.mm[off : off + 12] = record.blank(rest)
            cur.dirty = True
        self.current = nxt
        self.write_pos = nxt.base
        self.warm_end = nxt.base + warm
        self.limit = nxt.end
        return nxt.base

    def _take_next(self, base: int) -> MappedFile | None:
        """The prepared segment for ``base``, renamed into place, or None (caller holds the put lock)."""
        nxt = self._next
        if nxt is None:
            return None
        self._next = None
        if nxt.base != base:  # cannot happen (the log grows by whole segments); be safe anyway
            nxt.destroy()
            self._next_warm = 0
            return None
        final = self.files.dir / f"{base:020d}"
        os.rename(nxt.path, final)
        nxt.path = final
        self.files.adopt(nxt)
        return nxt

    def prepare_next(self, lock: threading.Lock, ahead: int) -> bool:
        """Create the next segment once the writer is within ``ahead`` bytes of the current one's end.

        Flush thread only. The file is made (fallocate + mmap) outside the put lock and
        published under it; returns True when it made one. A full disk is not an error
        here: the roll tries again and reports it to the writer.
        """
        cur = self.current  # a look without the lock first: most rounds have nothing to do
        if cur is None or self._next is not None or cur.end - self.write_pos > ahead:
            return False
        with lock:
            cur = self.current
            if cur is None or self._next is not None or cur.end - self.write_pos > ahead or self._next_failed == cur.end:
                return False
            base = cur.end
        path = self.files.dir / f"{base:020d}{_NEXT_SUFFIX}"
        try:
            if path.exists():
                path.unlink()
            mf = MappedFile(path, base, self.segment_size, create=True)
        except (StoreFullError, OSError) as e:
            self._next_failed = base
            log.warning("could not prepare the next commitlog segment (%s); the roll will create it", e)
            return False
        with lock:
            if self.current is cur and self._next is None:
                self._next, self._next_warm = mf, 0
                return True
        mf.destroy()  # the writer rolled meanwhile (and made the segment itself)
        return False

    def make_room(self, size: int) -> int:
        """Room for a ``size``-byte record once ``write_pos + size`` passed :attr:`limit`.

        If only a warm-up claim is in the way, wait for its piece of zeros (a memcpy
        into the page cache, well under a millisecond) and stay in this segment;
        otherwise roll (after the claim is done too). Returns the offset the record goes
        to. Caller holds the put lock.
        """
        claim = self._claim
        if claim is not None:  # also before a roll: its BLANK filler may fall inside the claim
            claim.done.wait()
            self._end_claim(claim)
            if self.write_pos + size <= self.limit:
                return self.write_pos
        return self.roll(size)

    def _end_claim(self, claim: _Claim) -> None:
        """Lift a finished claim (either side may do it, under the put lock)."""
        if self._claim is claim:
            self._claim = None
            if self.current is claim.mf:
                self.limit = claim.mf.end
                if claim.end > self.warm_end:
                    self.warm_end = claim.end
            elif self._next is claim.mf:
                self._next_warm = claim.end - claim.mf.base

    def warm_step(self, lock: threading.Lock, lead: int, piece: int) -> int | None:
        """Zero-fill the next piece ahead of the writer and fdatasync it (flush thread only).

        Does nothing (returns None) when the written zeros already reach ``lead``
        bytes past ``write_pos`` (or the segment's end, and no next segment is
        prepared). Otherwise returns the write position taken with the claim: the
        fdatasync that makes the zeros durable covers every record below it too, so
        the caller may count it as flushed -- or 0 for a piece of the prepared next
        segment, whose fdatasync covers no record.
        """
        with lock:
            cur = self.current
            if cur is None or self._claim is not None:
                return None
            wp = self.write_pos
            start = max(self.warm_end, wp)
            start += -start % _PAGE  # whole pages: the page holding write_pos is the writer's
            if start - wp >= lead:
                return None
            if start < cur.end:
                end = min(cur.end, start + piece)
                claim = self._claim = _Claim(cur, start, end)
                self.limit = start
            else:  # warm to its end: go on with the head of the prepared next segment
                nxt = self._next
                if nxt is None:
                    return None
                start = nxt.base + self._next_warm
                if start >= nxt.end or start - wp >= lead:
                    return None
                end = min(nxt.end, start + piece)
                claim = self._claim = _Claim(nxt, start, end)  # a roll waits for it (make_room)
                wp = 0  # this fdatasync is of the next segment: it makes no record durable
            cur = claim.mf
        try:
            pos = start - cur.base
            stop = end - cur.base
            while pos < stop:
                pos += os.pwrite(cur.fd, _ZEROS[: min(len(_ZEROS), stop - pos)], pos)
        finally:
            claim.done.set()
            with lock:
                self._end_claim(claim)
        os.fdatasync(cur.fd)
        if wp:
            self.sync_dir()
        return wp

    def fits(self, size: int) -> bool:
        return self.current is not None and self.write_pos + size <= self.limit

    def write_at(self, pos: int, data: bytes) -> None:
        """Copy one encoded record at ``pos`` (the write position, or where ``make_room`` moved
        it) into the current segment and publish it. A copy into the mapping: for one small
        record it costs less than a system call."""
        cur = self.current
        off = pos - cur.base  # type: ignore[union-attr]
        end = off + len(data)
        cur.mm[off:end] = data  # type: ignore[union-attr]
        cur.dirty = True  # type: ignore[union-attr]
        self.write_pos = pos + len(data)

    def stage_at(self, pos: int, data: bytes) -> None:
        """Copy bytes at ``pos`` in the current segment *without* publishing them (the write
        position stays): replicated records are checked in place before readers may see them."""
        cur = self.current
        off = pos - cur.base  # type: ignore[union-attr]
        cur.mm[off : off + len(data)] = data  # type: ignore[union-attr]
        cur.dirty = True  # type: ignore[union-attr]

    def write_parts_at(self, pos: int, head: bytes, body: bytes) -> None:
        """:meth:`write_at` of ``head + body`` without building the concatenation (the body is
        the client's and may be large: it is copied once, into the segment)."""
        cur = self.current
        off = pos - cur.base  # type: ignore[union-attr]
        hl = len(head)
        mm = cur.mm  # type: ignore[union-attr]
        mm[off : off + hl] = head
        mm[off + hl : off + hl + len(body)] = body
        cur.dirty = True  # type: ignore[union-attr]
        self.write_pos = pos + hl + len(body)

    def write_pieces(self, segment: MappedFile, start: int, end: int, pieces: list[bytes]) -> None:
        """Write records [start, end), given as consecutive pieces, into ``segment`` and publish.

        ``pwritev`` rather than a copy into the mapping for a batch: the first write into a
        page of a fresh segment through the mapping costs a page fault, several times what
        write(2) costs for the same bytes (see bench/RESULTS.md); one small record (a batch
        of one) is copied, which costs less than the system call.
        """
        off = start - segment.base
        total = end - start
        try:
            if total <= _COPY_MAX:
                segment.mm[off : off + total] = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            else:
                i = 0
                while i < len(pieces):  # IOV_MAX pieces per pwritev
                    chunk = pieces[i : i + _IOV_MAX] if i or len(pieces) > _IOV_MAX else pieces
                    want = sum(map(len, chunk)) if chunk is not pieces else total
                    done = os.pwritev(segment.fd, chunk, off)
                    if done != want:  # a short write: copy the rest through the mapping
                        data = b"".join(chunk)
                        segment.mm[off + done : off + want] = data[done:]
                    off += want
                    i += _IOV_MAX
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError("no space left on the data disk") from e
            raise
        segment.dirty = True
        self.write_pos = end

    # -- read path -----------------------------------------------------------------

    def read(self, offset: int, verify: bool = True) -> StoredMessage:
        mf = self.files.find(offset)
        if mf is None or offset >= self.write_pos:
            raise CorruptRecordError(f"no record at commitlog offset {offset}")
        return record.decode(mf.mm, offset - mf.base, verify)

    def link_origin(self, offset: int) -> tuple[int, int]:
        mf = self.files.find(offset)
        if mf is None:
            raise CorruptRecordError(f"no record at commitlog offset {offset}")
        return record.link_origin(mf.mm, offset - mf.base)

    def header(self, offset: int) -> record.RecordHeader:
        mf = self.files.find(offset)
        if mf is None:
            raise CorruptRecordError(f"no record at commitlog offset {offset}")
        return record.parse_header(mf.mm, offset - mf.base)

    def record_start_before(self, offset: int, max_back: int) -> int | None:
        """The offset of the nearest record starting at or before ``offset``, at most ``max_back``
        bytes back, or None (see :func:`record.record_start_before`; a record never spans two
        segments, so the search stays in ``offset``'s)."""
        mf = self.files.find(offset)
        if mf is None or offset >= self.write_pos:
            return None
        rel = offset - mf.base
        pos = record.record_start_before(mf.mm, rel, max(0, rel - max_back), mf.base)
        return None if pos is None else mf.base + pos

    # -- recovery ------------------------------------------------------------------

    def scan(self, start: int, on_record: Callable[[record.RecordHeader], None] | None = None) -> int:
        """Walk valid records from ``start``; return the offset just past the last one.

        ``start`` must be a record boundary (a checkpointed position or a segment
        base). Stops at the first record whose size, magic or CRC is wrong.
        """
        files = self.files.files
        idx = next((i for i, f in enumerate(files) if f.base <= start < f.end), None)
        if idx is None:
            return start
        pos = start
        while idx < len(files):
            mf = files[idx]
            off = pos - mf.base
            kind, size = record.check(mf.mm, off, mf.size)
            if kind == 1:
                if on_record is not None:
                    on_record(record.parse_header(mf.mm, off))
                pos += size
                if pos == mf.end:
                    idx += 1
                continue
            # A blank ends the segment; so does a tail under 12 bytes, which roll() leaves
            # without a blank (no room for one) -- the log continues in the next segment.
            if kind == 2 or (kind == 0 and mf.end - pos < 12):
                idx += 1
                if idx < len(files):
                    pos = files[idx].base
                    continue
                pos = mf.end
            break
        return pos

    def iter_records(self, start: int) -> Iterator[record.RecordHeader]:
        out: list[record.RecordHeader] = []
        self.scan(start, out.append)
        return iter(out)

    def truncate(self, end: int) -> None:
        """Cut everything from ``end``: zero the rest of its segment, drop later segments."""
        self.files.drop_from(end - end % self.segment_size + self.segment_size if end % self.segment_size else end)
        mf = self.files.find(end)
        if mf is not None:
            zero_range(mf.fd, mf.mm, end - mf.base, mf.size)
            mf.sync()
        self.set_write_pos(end)

    def first_record_offset(self) -> int:
        return self.files.files[0].base if self.files.files else 0

    def sync(self) -> None:
        self.files.sync_dirty()
        self.sync_dir()

    def sync_dir(self) -> None:
        """fsync the segment directory if a segment entered it since the last time (flush thread).

        A prepared segment is renamed into place at the roll; fdatasync of its data does
        not make that rename durable, and after a power cut a segment still under its
        ``.next`` name would be deleted at start. Records in it count as durable only
        once this ran (the caller's flushed position is taken before the call).
        """
        if self._dir_unsynced:
            self._dir_unsynced = False
            fd = os.open(self.files.dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        if self._next is not None:  # prepared but never used: give its space back
            self._next.destroy()
            self._next = None
        self.files.close()
        self.current = None
