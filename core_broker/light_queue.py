"""Light message queues' consume queues: a million small queues in one shared log.

Why: an MQTT QoS 1 subscription has its own light message queue (``%LMQ%...``), and a
fleet subscribes by the hundred thousand. Given a consume-queue directory and file each,
the first entry of a new LMQ cost two ``mkdir`` calls in a directory of 100,000 entries,
an ``open``, an ``fallocate`` and a mapping: 250-1,000 us, measured with cProfile on the
2-core machine (``mkdir`` alone 150 us), so at most ~4,000 new subscriptions a second got
their first message; and 100,000 mappings pass Linux's default ``vm.max_map_count``
(65,530). Here an LMQ costs a Python object and its entries in memory; on disk every
LMQ's entries go to one append-only log, written in one ``write`` + ``fdatasync`` per
checkpoint (``sync``) on the flush thread, never on the put path. Creating an LMQ
touches no file at all.

The log (``consumequeue/%25LMQ%25/<seq>.lmq``: the directory name is what the
consume-queue layer would call an LMQ named ``%LMQ%``, which no subscription is, and
its files are not digit-named queues) holds records, each naming its LMQ:

- ENTRY: kind 1, name, queue offset, then the 20-byte consume-queue entry (commitlog
  offset, size, tag hash): the queue's entry at that offset (a later one replaces it,
  so redispatch after a crash may write an offset twice);
- END: kind 2, name, offset: the queue ends there (a torn commitlog tail cut it), or,
  when the LMQ has no entry left in the log, starts and ends there (so its offsets
  never restart below what a reader already consumed);
- DROP: kind 3, name, commitlog offset: the LMQ was deleted (its session discarded) when the
  commitlog ended there; a record below it that a crash recovery dispatches again is not
  an entry of the LMQ (a new session of the same client reuses the name).

Start-up replays the log into memory. Retention deletes a log file, oldest first,
once every entry in it points below the commitlog's first offset; an LMQ whose last
record is in it gets an END record first. Crash recovery needs nothing more: entries
dispatched after the last checkpoint are rebuilt from the commitlog, as for any
consume queue, and written again. Hand-written because the format is this small and
the readers and writers are the store's own.
"""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path
from typing import Callable

from .consume_queue import ENTRY, ENTRY_SIZE

DIR_NAME = "%25LMQ%25"
SEGMENT_BYTES = 64 << 20  # a log file is closed and a new one begun past this size
_HEAD = struct.Struct("<BI")  # kind, name length; then the name (UTF-8)
_Q = struct.Struct("<q")  # a queue offset
_ENTRY, _END, _DROP = 1, 2, 3
_pack_entry = ENTRY.pack
_unpack_entry = ENTRY.unpack_from
_pack_q = _Q.pack
_HOLE = bytes(ENTRY_SIZE)
_FAR = 1 << 62


class LightQueue:
    """One LMQ's consume queue, in memory: what :class:`~core_broker.consume_queue.ConsumeQueue`
    offers the store and the appender, without a file. Entries ``[base, max_offset)`` are held;
    ``min_offset`` moves past entries that retention removed from the commitlog."""

    __slots__ = ("topic", "queue_id", "base", "ents", "max_offset", "min_offset", "limit", "_log", "_head", "seg")

    def __init__(self, log: "LightQueueLog", topic: str) -> None:
        self.topic = topic
        self.queue_id = 0
        self.base = self.max_offset = self.min_offset = 0
        self.ents = bytearray()
        self.limit = _FAR  # the appender's fast path: no file to make room in, ever
        self._log = log
        name = topic.encode()
        self._head = _HEAD.pack(_ENTRY, len(name)) + name
        self.seg = -1  # the log file holding this queue's last record

    # ---------------------------------------------------------------- writes (store lock held)

    def ensure(self, queue_offset: int) -> None:
        """Nothing to prepare: an entry needs no file."""

    def _set(self, queue_offset: int, e: bytes) -> None:
        if queue_offset == self.max_offset:
            self.ents += e
            self.max_offset = queue_offset + 1
        elif queue_offset > self.max_offset:  # a gap (never written): holes, as a file has zeros
            self.ents += _HOLE * (queue_offset - self.max_offset) + e
            self.max_offset = queue_offset + 1
        elif queue_offset >= self.base:
            p = (queue_offset - self.base) * ENTRY_SIZE
            self.ents[p : p + ENTRY_SIZE] = e

    def append(self, queue_offset: int, phys: int, size: int, tag_hash: int) -> None:
        e = _pack_entry(phys, size, tag_hash)
        self.ents += e
        self.max_offset = queue_offset + 1
        self._log.add(self, self._head + _pack_q(queue_offset) + e, phys)

    def put(self, queue_offset: int, phys: int, size: int, tag_hash: int) -> None:
        e = _pack_entry(phys, size, tag_hash)
        self._set(queue_offset, e)
        self._log.add(self, self._head + _pack_q(queue_offset) + e, phys)

    def append_entries(self, first: int, entries: list[bytes]) -> None:
        head = self._head
        for i, e in enumerate(entries):
            self._set(first + i, e)
            self._log.add(self, head + _pack_q(first + i) + e, _unpack_entry(e)[0])

    def _cut(self, end: int) -> None:
        """Forget entries at ``end`` and beyond (in memory only)."""
        if end < self.base:
            self.base = end
            self.ents = bytearray()
        else:
            del self.ents[(end - self.base) * ENTRY_SIZE :]
        self.max_offset = end
        self.min_offset = min(self.min_offset, end)

    def truncate_beyond_phys(self, phys_end: int) -> None:
        """Drop tail entries pointing at or past ``phys_end`` (torn commitlog tail)."""
        end = self.max_offset
        while end > self.min_offset:
            phys, size, _ = _unpack_entry(self.ents, (end - 1 - self.base) * ENTRY_SIZE)
            if size != 0 and phys + size <= phys_end:
                break
            end -= 1
        if end != self.max_offset:
            self._cut(end)
            self._log.end(self)

    def drop_before_phys(self, phys_min: int) -> None:
        """Retention: skip entries pointing below ``phys_min`` and free their memory."""
        lo, ents, base = self.min_offset, self.ents, self.base
        while lo < self.max_offset and _unpack_entry(ents, (lo - base) * ENTRY_SIZE)[0] < phys_min:
            lo += 1
        self.min_offset = lo
        if lo > base:
            del ents[: (lo - base) * ENTRY_SIZE]
            self.base = lo

    # ---------------------------------------------------------------- reads

    def get(self, queue_offset: int, count: int) -> list[tuple[int, int, int]]:
        """Entries [queue_offset, queue_offset+count) that exist."""
        lo = max(queue_offset, self.base)
        hi = min(queue_offset + count, self.max_offset)
        if hi <= lo:
            return []
        mv = memoryview(self.ents)[(lo - self.base) * ENTRY_SIZE : (hi - self.base) * ENTRY_SIZE]
        return list(ENTRY.iter_unpack(mv))

    def raw(self, queue_offset: int, count: int) -> bytes:
        """The packed entries of [queue_offset, queue_offset+count) that exist."""
        lo = max(queue_offset, self.base)
        hi = min(queue_offset + count, self.max_offset)
        return bytes(self.ents[(lo - self.base) * ENTRY_SIZE : (hi - self.base) * ENTRY_SIZE]) if hi > lo else b""

    def entry(self, queue_offset: int) -> tuple[int, int, int] | None:
        if not (self.min_offset <= queue_offset < self.max_offset) or queue_offset < self.base:
            return None
        return _unpack_entry(self.ents, (queue_offset - self.base) * ENTRY_SIZE)

    # ---------------------------------------------------------------- lifecycle

    def load(self) -> None:
        """Loaded with the shared log (:meth:`LightQueueLog.load`)."""

    def sync(self) -> None:
        """The shared log is synced as a whole (:meth:`LightQueueLog.sync`)."""

    def close(self) -> None:
        """Nothing open."""

    def destroy(self) -> None:
        self._log.drop(self)
        self.ents = bytearray()
        self.base = self.min_offset = self.max_offset = 0


class LightQueueLog:
    """Every LMQ of one store: the queues in memory and the log they are written to."""

    def __init__(self, root: Path, write_pos: Callable[[], int] = lambda: 0, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.dir = root
        self.write_pos = write_pos  # the commitlog's end (a DROP's position)
        # LMQ -> where the commitlog ended when it was dropped: read from the log at start, for
        # crash recovery's re-dispatch (MessageStore._dispatch_header); cleared once the store is open
        self.dropped: dict[str, int] = {}
        self.segment_bytes = segment_bytes
        self.queues: dict[str, LightQueue] = {}
        self._pending: list[bytes] = []
        self._pending_max = -1  # the highest commitlog offset a pending entry points at
        self._lock = threading.Lock()  # the pending list: appended by writers, taken by sync
        self._io = threading.Lock()  # one sync at a time
        self._write = threading.Lock()  # taking the pending records and writing them, in order
        self._seq = 0  # the file being written
        self._fd = -1
        self._size = 0
        self._max_phys: dict[int, int] = {}  # per log file: the highest commitlog offset named

    def queue(self, name: str) -> LightQueue:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = LightQueue(self, name)
        return q

    # ---------------------------------------------------------------- records

    def add(self, q: LightQueue, rec: bytes, phys: int) -> None:
        with self._lock:
            self._pending.append(rec)
            if phys > self._pending_max:
                self._pending_max = phys
            q.seg = self._seq

    def end(self, q: LightQueue) -> None:
        name = q.topic.encode()
        with self._lock:
            self._pending.append(_HEAD.pack(_END, len(name)) + name + _pack_q(q.max_offset))
            q.seg = self._seq

    def drop(self, q: LightQueue) -> None:
        """Forget ``q``; its DROP record reaches the file at once (after every earlier record,
        unsynced): a process killed before the next checkpoint must not revive the LMQ of a
        discarded session from its older entries (a new session of the same client reuses the
        name). Only a write to the page cache: the fdatasync stays the flush thread's."""
        if self.queues.get(q.topic) is q:
            del self.queues[q.topic]
        name = q.topic.encode()
        with self._write:
            with self._lock:
                self._pending.append(_HEAD.pack(_DROP, len(name)) + name + _pack_q(self.write_pos()))
            self._write_pending()

    # ---------------------------------------------------------------- disk

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:020d}.lmq"

    def _write_pending(self) -> None:
        """Write what was added so far to the current file (caller holds ``_write``)."""
        with self._lock:
            pending, self._pending = self._pending, []
            top, self._pending_max = self._pending_max, -1
        if not pending:
            return
        if self._fd < 0:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self._path(self._seq), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        blob = b"".join(pending)
        data = memoryview(blob)
        while data:
            data = data[os.write(self._fd, data) :]
        self._size += len(blob)
        self._max_phys[self._seq] = max(self._max_phys.get(self._seq, -1), top)

    def sync(self) -> None:
        """Write and fdatasync what was added since the last sync (the flush thread's)."""
        with self._io:
            with self._write:
                self._write_pending()
                fd = self._fd
            if fd < 0:
                return
            os.fdatasync(fd)
            if self._size >= self.segment_bytes:  # the next record begins a new file
                with self._write:
                    self._write_pending()  # (a DROP written meanwhile: synced below, in the old file)
                    os.fdatasync(self._fd)
                    os.close(self._fd)
                    self._fd, self._size = -1, 0
                    with self._lock:
                        self._seq += 1

    def close(self) -> None:
        self.sync()
        with self._io, self._write:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def load(self, commitlog_min: int) -> None:
        """Replay the log into memory; cut a torn tail; skip entries below ``commitlog_min``."""
        files = sorted(self.dir.glob("*.lmq")) if self.dir.is_dir() else []
        queues = self.queues
        for path in files:
            seq = int(path.stem)
            data = path.read_bytes()
            pos, top = 0, -1
            for kind, name, off, e, pos in _records(data):
                if kind == _DROP:
                    queues.pop(name, None)
                    self.dropped[name] = off
                    continue
                if kind == _ENTRY and name in self.dropped and _unpack_entry(e)[0] < self.dropped[name]:
                    continue  # the dropped LMQ's, dispatched again after its DROP: not revived
                q = queues.get(name) or self.queue(name)
                q.seg = seq
                if kind == _ENTRY:
                    q._set(off, e)
                    top = max(top, _unpack_entry(e)[0])
                elif off < q.max_offset:
                    q._cut(off)
                else:  # an LMQ whose entries all left the log: it starts where it ended
                    q.base = q.min_offset = q.max_offset = off
                    q.ents = bytearray()
            n = len(data)
            if pos < n:
                with open(path, "r+b") as f:
                    f.truncate(pos)
            self._max_phys[seq] = top
            self._seq, self._size = seq, pos
        for q in queues.values():
            q.drop_before_phys(commitlog_min)

    def drop_before_phys(self, phys_min: int) -> int:
        """Delete log files (never the one being written) whose every entry points below
        ``phys_min``, oldest first; the LMQs whose last record was in one get an END record
        first. Answers how many files went."""
        gone = []
        for seq in sorted(self._max_phys):
            if seq >= self._seq or self._max_phys[seq] >= phys_min:
                break
            gone.append(seq)
        if not gone:
            return 0
        last = gone[-1]
        for q in list(self.queues.values()):
            if q.seg <= last:
                self.end(q)
        self.sync()
        for seq in gone:
            del self._max_phys[seq]
            try:
                os.unlink(self._path(seq))
            except FileNotFoundError:
                pass
        return len(gone)


def _records(data: bytes):
    """(kind, name, queue offset, entry, end position) of each whole record in ``data``."""
    pos, n = 0, len(data)
    while pos + _HEAD.size <= n:
        kind, ln = _HEAD.unpack_from(data, pos)
        start = pos + _HEAD.size + ln
        stop = start + (_Q.size + ENTRY_SIZE if kind == _ENTRY else _Q.size)
        if kind not in (_ENTRY, _END, _DROP) or stop > n:
            return  # a torn tail (written when the process died)
        name = data[pos + _HEAD.size : start].decode()
        off = _Q.unpack_from(data, start)[0]
        yield kind, name, off, data[start + _Q.size : stop] if kind == _ENTRY else b"", stop
        pos = stop


def stored_names(cq_root: Path) -> set[str]:
    """The LMQs a store's log on disk holds (read only, without a store: tools and tests
    see what the last sync wrote)."""
    d = cq_root / DIR_NAME
    log = LightQueueLog(d)
    for path in sorted(d.glob("*.lmq")) if d.is_dir() else []:
        for kind, name, off, e, _ in _records(path.read_bytes()):
            if kind == _DROP:
                log.queues.pop(name, None)
                log.dropped[name] = off
            elif kind == _END or _unpack_entry(e)[0] >= log.dropped.get(name, -1):
                log.queue(name)
    return set(log.queues)
