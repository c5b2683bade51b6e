"""ConsumeQueue: the per (topic, queue) index of a topic's messages in the commitlog.

Each entry is 20 bytes (commitlog offset i64, record size i32, tag hash i64),
so queue offset N lives at byte 20*N and a reader can jump to any offset and
skip entries whose tag hash cannot match a filter without touching the log.
Entries are written by the store's dispatcher right after the commitlog write
and can be rebuilt from the commitlog alone (each record names its queue
offsets), which is what crash recovery does.

A queue may start above 0 with nothing below it on local disk: after a restart
with an empty local disk, the tier holds its earlier offsets (``start_at``). That
start is kept in a small file (``START_FILE``) beside the queue's files, since a
queue with no entries has no file to say where it continues.
"""

from __future__ import annotations

import struct
from pathlib import Path

from .json_file import read_json, write_json_atomic
from .mapped_file import MappedFileQueue

ENTRY = struct.Struct("<qiq")
ENTRY_SIZE = ENTRY.size
_pack_into = ENTRY.pack_into
_unpack_from = ENTRY.unpack_from
# A light message queue's files are small (80 KiB): there is one LMQ per subscription,
# and each file is preallocated with real blocks when the LMQ's first entry arrives.
LMQ_CQ_ENTRIES = 4096
START_FILE = "start"  # {"offset": N}: the queue's offsets below N are not local (see start_at)


class ConsumeQueue:
    __slots__ = ("topic", "queue_id", "files", "max_offset", "min_offset", "limit", "_file_bytes", "_cur", "floor")

    def __init__(self, root: Path, topic: str, queue_id: int, entries_per_file: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self._file_bytes = entries_per_file * ENTRY_SIZE
        self.files = MappedFileQueue(root / _safe(topic) / str(queue_id), self._file_bytes, keep_fd=False)
        self.max_offset = 0  # next queue offset to assign
        self.min_offset = 0
        self.limit = 0  # queue offsets below this (and >= the current file's first) fit in _cur
        self._cur = None
        self.floor = 0  # no local entry below this offset (``start_at``)

    def load(self) -> None:
        """Find the highest written entry (non-zero size).

        The last segment may hold no entry at all: ``ensure`` creates a segment before the
        commitlog write of the put that needs it, and a crash (or a refused put) can come
        between. Such trailing segments are skipped, so they cannot make the queue's end
        jump to their first offset over entries that were never written.
        """
        self.files.load()
        start = self.files.dir / START_FILE
        if start.exists():
            try:
                self.floor = int(read_json(start, {}).get("offset", 0))
            except (ValueError, TypeError, AttributeError):
                self.floor = 0  # unreadable: the queue's files alone say where it is
            self.min_offset = self.max_offset = max(self.min_offset, self.floor)
        files = self.files.files
        if not files:
            return
        self.min_offset = max(files[0].base // ENTRY_SIZE, self.floor)
        for last in reversed(files):
            # entries are written in order from the floor on: binary search
            lo, hi = max(0, self.floor * ENTRY_SIZE - last.base) // ENTRY_SIZE, last.size // ENTRY_SIZE
            while lo < hi:
                mid = (lo + hi) // 2
                if _unpack_from(last.mm, mid * ENTRY_SIZE)[1] != 0:
                    lo = mid + 1
                else:
                    hi = mid
            self.max_offset = max(last.base // ENTRY_SIZE + lo, self.floor)
            if lo or last is files[0]:
                break
        self._set_cur(self.files.find(self.max_offset * ENTRY_SIZE) or files[-1])

    def _set_cur(self, mf) -> None:
        self._cur = mf
        self.limit = (mf.base + mf.size) // ENTRY_SIZE if mf is not None else 0

    def ensure(self, queue_offset: int) -> None:
        """Make sure the segment for ``queue_offset`` exists (may raise StoreFullError).

        Called before the commitlog write so a full disk refuses the put cleanly.
        """
        cur = self._cur
        pos = queue_offset * ENTRY_SIZE
        if cur is not None and cur.base <= pos < cur.base + cur.size:
            return
        mf = self.files.find(pos)
        if mf is None:
            mf = self.files.create(pos - pos % self._file_bytes)
            if len(self.files.files) == 1:
                self.min_offset = max(mf.base // ENTRY_SIZE, self.floor)
        self._set_cur(mf)

    def start_at(self, offset: int) -> None:
        """Continue at ``offset``: the queue's earlier offsets live elsewhere (the tier, after a
        restart with an empty local disk), so the next entry is ``offset`` and nothing below it
        is local. Kept on disk at once (a restart before the next put must not start at 0)."""
        if offset <= self.max_offset:
            return
        self.files.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.files.dir / START_FILE, {"offset": offset})
        self.floor = offset
        self.max_offset = offset
        if not self.files.files:
            self.min_offset = offset
        self._set_cur(None)  # the put fast path trusts _cur to hold max_offset

    def put(self, queue_offset: int, phys: int, size: int, tag_hash: int) -> None:
        pos = queue_offset * ENTRY_SIZE
        cur = self._cur
        if cur is None or not (cur.base <= pos < cur.base + cur.size):
            self.ensure(queue_offset)
            cur = self._cur
        _pack_into(cur.mm, pos - cur.base, phys, size, tag_hash)  # type: ignore[union-attr]
        cur.dirty = True  # type: ignore[union-attr]
        if queue_offset >= self.max_offset:
            self.max_offset = queue_offset + 1

    def append(self, queue_offset: int, phys: int, size: int, tag_hash: int) -> None:
        """The entry of the next offset, ``max_offset``, which :meth:`ensure` made room for
        (``queue_offset < limit``): the appender's path, without :meth:`put`'s checks."""
        cur = self._cur
        _pack_into(cur.mm, queue_offset * ENTRY_SIZE - cur.base, phys, size, tag_hash)  # type: ignore[union-attr]
        cur.dirty = True  # type: ignore[union-attr]
        self.max_offset = queue_offset + 1

    def append_entries(self, first: int, entries: list[bytes]) -> None:
        """Packed entries of offsets ``first``, ``first + 1``, ... (a batch's, in order)."""
        n = len(entries)
        f = self._cur
        p = first * ENTRY_SIZE
        if f is not None and f.base <= p and p + ENTRY_SIZE * n <= f.base + f.size:
            o = p - f.base
            f.mm[o : o + ENTRY_SIZE * n] = entries[0] if n == 1 else b"".join(entries)
            f.dirty = True
        else:  # the entries span two queue files
            for i, e in enumerate(entries):
                self.ensure(first + i)
                f = self._cur
                o = (first + i) * ENTRY_SIZE - f.base  # type: ignore[union-attr]
                f.mm[o : o + ENTRY_SIZE] = e  # type: ignore[union-attr]
                f.dirty = True  # type: ignore[union-attr]
        if first + n > self.max_offset:
            self.max_offset = first + n

    def get(self, queue_offset: int, count: int) -> list[tuple[int, int, int]]:
        """Entries [queue_offset, queue_offset+count) that exist, stopping at a segment end."""
        out: list[tuple[int, int, int]] = []
        end = min(queue_offset + count, self.max_offset)
        off = queue_offset
        while off < end:
            mf = self.files.find(off * ENTRY_SIZE)
            if mf is None:
                break
            pos = off * ENTRY_SIZE - mf.base
            stop = min(end * ENTRY_SIZE - mf.base, mf.size)
            mm = mf.mm
            while pos < stop:
                out.append(_unpack_from(mm, pos))
                pos += ENTRY_SIZE
            off = (mf.base + pos) // ENTRY_SIZE
        return out

    def raw(self, queue_offset: int, count: int) -> bytes:
        """The packed entries of [queue_offset, queue_offset+count) that exist (may span files)."""
        out = []
        off, end = queue_offset, min(queue_offset + count, self.max_offset)
        while off < end:
            mf = self.files.find(off * ENTRY_SIZE)
            if mf is None:
                break
            start = off * ENTRY_SIZE - mf.base
            stop = min(end * ENTRY_SIZE - mf.base, mf.size)
            out.append(mf.mm[start:stop])
            off = (mf.base + stop) // ENTRY_SIZE
        return out[0] if len(out) == 1 else b"".join(out)

    def entry(self, queue_offset: int) -> tuple[int, int, int] | None:
        if not (self.min_offset <= queue_offset < self.max_offset):
            return None
        mf = self.files.find(queue_offset * ENTRY_SIZE)
        if mf is None:
            return None
        return _unpack_from(mf.mm, queue_offset * ENTRY_SIZE - mf.base)

    def truncate_beyond_phys(self, phys_end: int) -> None:
        """Drop tail entries pointing at or past ``phys_end`` (torn commitlog tail)."""
        cut = False
        while self.max_offset > self.min_offset:
            e = self.entry(self.max_offset - 1)
            # A zero entry is a hole (never written), not a message: cut it like a torn one.
            if e is None or (e[1] != 0 and e[0] + e[1] <= phys_end):
                break
            mf = self.files.find((self.max_offset - 1) * ENTRY_SIZE)
            _pack_into(mf.mm, (self.max_offset - 1) * ENTRY_SIZE - mf.base, 0, 0, 0)  # type: ignore[union-attr]
            mf.dirty = True  # type: ignore[union-attr]
            self.max_offset -= 1
            cut = True
        if cut:
            # Files past the new end hold no entry now: drop them (load() reads max_offset
            # off the last file), and forget the current file, which the put fast path
            # trusts to contain max_offset.
            self.files.drop_from(self.max_offset * ENTRY_SIZE)
            self._set_cur(None)

    def drop_before_phys(self, phys_min: int) -> None:
        """Retention: delete whole segments whose every entry points below ``phys_min``."""
        files = self.files.files
        n = 0
        for mf in files[:-1]:
            last = _unpack_from(mf.mm, mf.size - ENTRY_SIZE)
            if last[1] and last[0] < phys_min:
                n += 1
            else:
                break
        if n:
            self.files.drop_head(n)
            self.min_offset = self.files.files[0].base // ENTRY_SIZE
        # entries below phys_min inside the first remaining segment are skipped lazily
        while self.min_offset < self.max_offset:
            e = self.entry(self.min_offset)
            if e is None or e[0] >= phys_min:
                break
            self.min_offset += 1

    def sync(self) -> None:
        self.files.sync_dirty()

    def close(self) -> None:
        self.files.close()
        self._set_cur(None)

    def destroy(self) -> None:
        (self.files.dir / START_FILE).unlink(missing_ok=True)
        self.files.destroy()
        self._set_cur(None)


def _safe(topic: str) -> str:
    """Topic names may contain '/', '%' etc. (MQTT, AMQP); keep one directory per topic."""
    out = []
    for ch in topic:
        if ch.isalnum() or ch in "-_.":
            out.append(ch)
        else:
            o = ord(ch)
            out.append("%%%02X" % o if o < 256 else "%%u%04X" % o if o < 0x10000 else "%%U%08X" % o)
    name = "".join(out)
    if name in (".", ".."):  # would name the directory itself or its parent
        return "%2E" * len(name)
    return name or "%00"


def unsafe(name: str) -> str:
    """Inverse of :func:`_safe` for the directory names found at load time."""
    out = []
    i = 0
    while i < len(name):
        if name[i] == "%":
            if name[i + 1] == "u":
                out.append(chr(int(name[i + 2 : i + 6], 16)))
                i += 6
            elif name[i + 1] == "U":  # beyond the BMP (emoji): 8 hex digits
                out.append(chr(int(name[i + 2 : i + 10], 16)))
                i += 10
            else:
                out.append(chr(int(name[i + 1 : i + 3], 16)))
                i += 3
        else:
            out.append(name[i])
            i += 1
    return "".join(out)
