"""IndexFile: an on-disk hash index from message keys and ids to commitlog offsets.

A file holds a header, ``slots`` hash buckets (u32 index of the newest entry in
the bucket, 0 meaning empty) and up to ``entries`` 24-byte entries chained to
the previous entry of the same bucket (hash u32, commitlog offset i64, store
timestamp i64, previous u32). Lookups walk one chain per file, newest file
first, and filter by time range; hashes may collide, so callers confirm the
key on the decoded message. Being a hash chain in a mapped file (the RocketMQ
design) it costs a few microseconds per key and no memory per message, which a
Python dict of every key could not promise.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

from crc32c import crc32c

from .mapped_file import MappedFile

HEADER = struct.Struct("<qqqqII")  # begin_ts, end_ts, begin_phys, end_phys, used slots, entry count
SLOT = struct.Struct("<I")
ENTRY = struct.Struct("<IqqI")


def key_hash(key: str) -> int:
    return crc32c(key.encode())


class IndexFile:
    def __init__(self, path: Path, slots: int, entries: int, create: bool) -> None:
        self.slots = slots
        self.entries = entries
        size = HEADER.size + slots * SLOT.size + (entries + 1) * ENTRY.size
        self.mf = MappedFile(path, 0, size, create)
        self.mm = self.mf.mm
        h = HEADER.unpack_from(self.mm, 0)
        self.begin_ts, self.end_ts, self.begin_phys, self.end_phys, self.used, self.count = h
        self._entries_base = HEADER.size + slots * SLOT.size
        # Entries are appended in log order, so their offsets only grow, except in a file that
        # was open across a restart (recovery indexes the tail after the checkpoint again):
        # only a file made and filled by this process is known to be in order.
        self.in_order = create

    @property
    def full(self) -> bool:
        return self.count >= self.entries

    def put(self, h: int, phys: int, ts: int) -> None:
        slot_pos = HEADER.size + (h % self.slots) * SLOT.size
        prev = SLOT.unpack_from(self.mm, slot_pos)[0]
        self.count += 1
        idx = self.count  # entries are 1-based so 0 can mean "empty"
        ENTRY.pack_into(self.mm, self._entries_base + idx * ENTRY.size, h, phys, ts, prev)
        if phys < self.end_phys:
            self.in_order = False
        if self.begin_ts == 0:
            self.begin_ts, self.begin_phys = ts, phys
        self.end_ts = max(self.end_ts, ts)
        self.end_phys = max(self.end_phys, phys)
        HEADER.pack_into(self.mm, 0, self.begin_ts, self.end_ts, self.begin_phys, self.end_phys, 0, self.count)
        # Link the slot last: a kill before this line leaves the entry unlinked (recovery
        # re-indexes it), never a slot pointing past the stored count, whose entry the
        # next put would overwrite, cutting the bucket's chain.
        SLOT.pack_into(self.mm, slot_pos, idx)
        self.mf.dirty = True

    def _first_at_or_after(self, phys: int, lo: int, hi: int) -> int:
        """The first entry in ``[lo, hi)`` pointing at or past ``phys`` (entries in log order)."""
        while lo < hi:
            mid = (lo + hi) // 2
            if ENTRY.unpack_from(self.mm, self._entries_base + mid * ENTRY.size)[1] < phys:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def entries_between(self, phys_lo: int, phys_hi: int) -> list[tuple[int, int, int]]:
        """(hash, commitlog offset, store time) of the entries pointing into ``[phys_lo, phys_hi)``:
        a binary search for the run when the file is in order, else a scan of all of it."""
        # the count in the header is written after its entry (``self.count`` grows before it):
        # the writer may be putting while the upload thread reads
        first, end = 1, HEADER.unpack_from(self.mm, 0)[5] + 1
        if self.in_order:
            first = self._first_at_or_after(phys_lo, first, end)
            end = self._first_at_or_after(phys_hi, first, end)
        start = self._entries_base + first * ENTRY.size
        with memoryview(self.mm) as mv:
            return [(h, phys, ts) for h, phys, ts, _ in ENTRY.iter_unpack(mv[start : self._entries_base + end * ENTRY.size])
                    if phys_lo <= phys < phys_hi]

    def lookup(self, h: int, begin_ts: int, end_ts: int, limit: int, out: list[int]) -> None:
        idx = SLOT.unpack_from(self.mm, HEADER.size + (h % self.slots) * SLOT.size)[0]
        while idx and len(out) < limit:
            eh, phys, ts, prev = ENTRY.unpack_from(self.mm, self._entries_base + idx * ENTRY.size)
            if eh == h and begin_ts <= ts <= end_ts:
                out.append(phys)
            if prev >= idx:  # defensive against a torn chain
                break
            idx = prev


class IndexService:
    """The set of index files of a store, newest last."""

    def __init__(self, directory: Path, slots: int, entries: int) -> None:
        self.dir = Path(directory)
        self.slots = slots
        self.entries = entries
        self.files: list[IndexFile] = []

    def load(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for p in sorted(self.dir.iterdir()):
            if p.name.isdigit():
                self.files.append(IndexFile(p, self.slots, self.entries, create=False))

    def _current(self) -> IndexFile:
        if not self.files or self.files[-1].full:
            self._open_next()
        return self.files[-1]

    def _open_next(self) -> None:
        name = f"{time.time_ns():020d}"
        self.files.append(IndexFile(self.dir / name, self.slots, self.entries, create=True))

    def reserve(self, n: int) -> None:
        """Open the next file now if ``n`` more entries would not fit the current one.

        The store calls this before it writes a record, so a full disk refuses the put
        (StoreFullError) instead of failing after the record is already stored.
        """
        f = self.files[-1] if self.files else None
        if f is None or (f.count and f.count + n > f.entries):
            self._open_next()

    def put(self, key: str, phys: int, ts: int) -> None:
        self._current().put(key_hash(key), phys, ts)

    def query(self, key: str, begin_ts: int, end_ts: int, limit: int) -> list[int]:
        h = key_hash(key)
        out: list[int] = []
        for f in reversed(self.files):
            if f.count and (f.end_ts < begin_ts or f.begin_ts > end_ts):
                continue
            f.lookup(h, begin_ts, end_ts, limit * 4, out)
        seen: set[int] = set()
        uniq = [p for p in out if not (p in seen or seen.add(p))]  # recovery may re-index a record
        return uniq

    def entries_between(self, phys_lo: int, phys_hi: int) -> list[tuple[int, int, int]]:
        """(key hash, commitlog offset, store time) of every entry pointing into
        ``[phys_lo, phys_hi)``, sorted and without repeats: what the tier keeps of one sealed
        segment so that keys and client ids stay findable once the segment left local disk.

        Only the files whose range overlaps are read (see :meth:`IndexFile.entries_between`);
        the tier's upload thread calls it, once per segment.
        """
        out: set[tuple[int, int, int]] = set()
        for f in list(self.files):
            if f.count and f.end_phys >= phys_lo and f.begin_phys < phys_hi:
                out.update(f.entries_between(phys_lo, phys_hi))
        return sorted(out)

    def drop_before_phys(self, phys_min: int) -> None:
        while len(self.files) > 1 and self.files[0].end_phys < phys_min:
            self.files.pop(0).mf.destroy()

    def truncate_beyond_phys(self, phys_end: int) -> None:
        """Entries past a cut tail are harmless (lookups confirm the record); nothing to do."""

    def sync(self) -> None:
        for f in self.files:
            if f.mf.dirty:
                f.mf.sync()

    def close(self) -> None:
        for f in self.files:
            f.mf.close()
        self.files = []
