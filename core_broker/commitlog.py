"""The CommitLog: one append-only log of every topic's messages.

Segments are :class:`MappedFile` objects of ``segment_size`` bytes; a record
never spans two segments (the tail of a segment is filled with a BLANK record
instead). The writer is single-threaded under the store's put lock; readers
may read anything below ``write_pos`` concurrently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

from . import record
from .errors import CorruptRecordError
from .mapped_file import MappedFile, MappedFileQueue, zero_range
from .model import StoredMessage


class CommitLog:
    def __init__(self, directory: Path, segment_size: int) -> None:
        self.files = MappedFileQueue(directory, segment_size)
        self.segment_size = segment_size
        self.write_pos = 0
        self.current: MappedFile | None = None

    # -- lifecycle -----------------------------------------------------------------

    def load(self) -> None:
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
            self.write_pos = base
            return base
        nxt = self.files.create(cur.end)
        rest = cur.end - self.write_pos
        if rest >= 12:
            off = self.write_pos - cur.base
            cur.mm[off : off + 12] = record.blank(rest)
            cur.dirty = True
        self.current = nxt
        self.write_pos = nxt.base
        return nxt.base

    def fits(self, size: int) -> bool:
        cur = self.current
        return cur is not None and self.write_pos + size <= cur.end

    def write(self, data: bytes) -> int:
        """Copy an encoded record at ``write_pos`` (caller checked :meth:`fits`)."""
        cur = self.current
        pos = self.write_pos
        off = pos - cur.base  # type: ignore[union-attr]
        end = off + len(data)
        cur.mm[off:end] = data  # type: ignore[union-attr]
        cur.dirty = True  # type: ignore[union-attr]
        self.write_pos = pos + len(data)
        return pos

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

    def close(self) -> None:
        self.files.close()
        self.current = None
