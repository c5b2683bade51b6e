"""BatchConsumeQueue: the consume queue of a batch topic, one entry per stored record.

Why a second queue format: a producer's batch is one commitlog record and is indexed
once, yet queue offsets must still count messages (a consumer commits, pops and
acks single messages). RocketMQ's batch consume queue answers this with entries
that carry their first logical offset and message count; so does this one::

    commitlog offset i64 | record size i32 | tag hash i64 | first queue offset i64 | count i32

32 bytes, entry k at byte 32*k of the queue's files (``batchqueue/<topic>/<queue>/``,
beside the classic ``consumequeue/``: a store written before batch topics existed
has no such directory, and its classic queues are read exactly as before). A
plain message on a batch topic is an entry of count 1. Finding queue offset N is
a binary search over the entries' first offsets (they grow with k).

The interface is the classic :class:`~core_broker.consume_queue.ConsumeQueue`'s
(``max_offset``/``min_offset`` count messages; ``entry``/``get`` answer per
queue offset the (commitlog offset, size, tag hash) of the record holding it), so
the appender, retention and recovery use either alike; :meth:`locate` adds the
message's index inside its record, which is what the store's read path needs.
"""

from __future__ import annotations

import struct
from pathlib import Path

from .consume_queue import ENTRY as CQ_ENTRY, _safe
from .mapped_file import MappedFileQueue

ENTRY = struct.Struct("<qiqqi")
ENTRY_SIZE = ENTRY.size
_pack_into = ENTRY.pack_into
_unpack_from = ENTRY.unpack_from
#: The directory under the store's root holding every batch queue.
ROOT = "batchqueue"


class BatchConsumeQueue:
    """Entries (phys, size, tag hash, first offset, count); offsets count messages."""

    batch = True
    limit = 0  # the appender's fast path never applies: it calls ensure() before each put

    def __init__(self, root: Path, topic: str, queue_id: int, entries_per_file: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self._file_bytes = entries_per_file * ENTRY_SIZE
        self.files = MappedFileQueue(root / _safe(topic) / str(queue_id), self._file_bytes, keep_fd=False)
        self.max_offset = 0  # next queue offset to assign (a message count)
        self.min_offset = 0
        self.entries = 0  # next entry index to write
        self.min_entry = 0

    # -- entries by index ----------------------------------------------------------

    def _read(self, k: int) -> tuple[int, int, int, int, int] | None:
        mf = self.files.find(k * ENTRY_SIZE)
        if mf is None:
            return None
        return _unpack_from(mf.mm, k * ENTRY_SIZE - mf.base)

    def _write(self, k: int, phys: int, size: int, th: int, first: int, count: int) -> None:
        pos = k * ENTRY_SIZE
        mf = self.files.find(pos)
        if mf is None:
            mf = self.files.create(pos - pos % self._file_bytes)
        _pack_into(mf.mm, pos - mf.base, phys, size, th, first, count)
        mf.dirty = True

    def entry_at(self, k: int) -> tuple[int, int, int, int, int] | None:
        """Entry ``k`` (the ``k``-th record of the queue) as (phys, size, tag hash, first offset, count);
        the tier's segment index copies entries by index."""
        return self._read(k) if self.min_entry <= k < self.entries else None

    def load(self) -> None:
        """Find the last written entry (count > 0) by binary search over the last file with one."""
        self.files.load()
        files = self.files.files
        if not files:
            return
        self.min_entry = files[0].base // ENTRY_SIZE
        for last in reversed(files):
            lo, hi = 0, last.size // ENTRY_SIZE
            while lo < hi:
                mid = (lo + hi) // 2
                if _unpack_from(last.mm, mid * ENTRY_SIZE)[4] != 0:
                    lo = mid + 1
                else:
                    hi = mid
            self.entries = last.base // ENTRY_SIZE + lo
            if lo or last is files[0]:
                break
        self._bounds()

    def _bounds(self) -> None:
        e = self._read(self.entries - 1) if self.entries > self.min_entry else None
        self.max_offset = e[3] + e[4] if e else self.max_offset
        f = self._read(self.min_entry) if self.entries > self.min_entry else None
        self.min_offset = f[3] if f else self.max_offset

    def find_entry(self, queue_offset: int) -> int | None:
        """Index of the entry holding ``queue_offset``, or None if it is not in the queue."""
        if not (self.min_offset <= queue_offset < self.max_offset):
            return None
        lo, hi = self.min_entry, self.entries - 1
        while lo < hi:  # the last entry whose first offset <= queue_offset
            mid = (lo + hi + 1) // 2
            e = self._read(mid)
            if e is None or e[3] > queue_offset:
                hi = mid - 1
            else:
                lo = mid
        return lo

    def locate(self, queue_offset: int) -> tuple[int, int, int, int, int] | None:
        """(phys, size, tag hash, first offset, count) of the record holding ``queue_offset``."""
        k = self.find_entry(queue_offset)
        return None if k is None else self._read(k)

    def batches(self, queue_offset: int, count: int) -> list[tuple[int, int, int, int, int]]:
        """The entries covering queue offsets [queue_offset, queue_offset + count), in order."""
        k = self.find_entry(queue_offset)
        out: list[tuple[int, int, int, int, int]] = []
        end = min(queue_offset + count, self.max_offset)
        while k is not None and k < self.entries:
            e = self._read(k)
            if e is None or e[3] >= end:
                break
            out.append(e)
            k += 1
        return out

    # -- the ConsumeQueue interface ---------------------------------------------------

    def ensure(self, queue_offset: int) -> None:
        """Make room for the next entry (may raise StoreFullError before the commitlog write)."""
        pos = self.entries * ENTRY_SIZE
        if self.files.find(pos) is None:
            self.files.create(pos - pos % self._file_bytes)

    def put_batch(self, first: int, count: int, phys: int, size: int, th: int) -> None:
        """The entry of a record holding queue offsets [first, first + count)."""
        if first < self.max_offset:  # recovery re-dispatching what is already indexed
            return
        if self.entries == self.min_entry:
            self.min_offset = first
        self._write(self.entries, phys, size, th, first, count)
        self.entries += 1
        self.max_offset = first + count

    def put(self, queue_offset: int, phys: int, size: int, tag_hash: int) -> None:
        self.put_batch(queue_offset, 1, phys, size, tag_hash)

    append = put

    def append_entries(self, first: int, entries: list[bytes]) -> None:
        """Classic packed entries of offsets first, first + 1, ... (the appender's batch path)."""
        for i, e in enumerate(entries):
            phys, size, th = CQ_ENTRY.unpack(e)
            self.ensure(first + i)
            self.put_batch(first + i, 1, phys, size, th)

    def entry(self, queue_offset: int) -> tuple[int, int, int] | None:
        e = self.locate(queue_offset)
        return None if e is None else (e[0], e[1], e[2])

    def get(self, queue_offset: int, count: int) -> list[tuple[int, int, int]]:
        """One (phys, size, tag hash) per queue offset (a batch's offsets share its record)."""
        out = []
        end = min(queue_offset + count, self.max_offset)
        for phys, size, th, first, n in self.batches(queue_offset, count):
            for _ in range(max(first, queue_offset), min(first + n, end)):
                out.append((phys, size, th))
        return out

    def truncate_beyond_phys(self, phys_end: int) -> None:
        """Drop tail entries whose record is not whole below ``phys_end`` (torn commitlog tail)."""
        cut = False
        while self.entries > self.min_entry:
            e = self._read(self.entries - 1)
            if e is None or (e[4] != 0 and e[0] + e[1] <= phys_end):
                break
            self._write(self.entries - 1, 0, 0, 0, 0, 0)
            self.entries -= 1
            cut = True
        if cut:
            self.files.drop_from(-(-self.entries * ENTRY_SIZE // self._file_bytes) * self._file_bytes)
            self.max_offset = 0
            self._bounds()

    def drop_before_phys(self, phys_min: int) -> None:
        """Retention: whole files whose every record lies below ``phys_min``, then entries."""
        files = self.files.files
        n = 0
        for mf in files[:-1]:
            last = _unpack_from(mf.mm, mf.size - ENTRY_SIZE)
            if last[4] and last[0] < phys_min:
                n += 1
            else:
                break
        if n:
            self.files.drop_head(n)
            self.min_entry = self.files.files[0].base // ENTRY_SIZE
        while self.min_entry < self.entries:
            e = self._read(self.min_entry)
            if e is None or e[0] >= phys_min:
                break
            self.min_entry += 1
        self._bounds()

    def sync(self) -> None:
        self.files.sync_dirty()

    def close(self) -> None:
        self.files.close()

    def destroy(self) -> None:
        self.files.destroy()
