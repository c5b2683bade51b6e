"""The cleaner of compacted topics: keeps, eventually, only the latest message per key.

Why this shape (RocketMQ 5's compaction store, Kafka's cleaner inside it): the
commitlog holds every topic, so it is never rewritten; per queue of a
``COMPACTED`` topic a compacted log (``compacted_log.py``) holds the sealed,
compacted prefix of the queue, offsets ``[0, boundary)``, and the queue's
offsets from the boundary on are read from the commitlog as before. Offsets
never change (the kept records are copied byte for byte, gaps stay where older
values were dropped), so a reader's position means the same before and after.

A pass over one queue (Kafka's): the *cleanable* range is ``[boundary, E)``
where ``E`` is the first offset whose record lies in the commitlog segment
being written or past the flushed position (the active range is never
compacted, and nothing a crash could still cut is copied). The pass reads the
keys of ``[boundary, E)`` into a map of key digest -> latest offset, bounded by
``compaction_map_entries`` (memory ~100 bytes an entry); when the map is full
the pass stops early at ``E' < E`` and the next pass goes on from there. It
then writes a new generation: the old generation's records whose key the map
does not name, then the records of ``[boundary, E')`` that are the latest of
their key, dropping delete markers (an empty body) older than
``delete_retention_ms``. Every key appears at most once below the boundary
after each pass, which is why a marker can be dropped once it expired: no
older value of its key is left anywhere below it.

A queue is compacted when its dirty share, cleanable entries over cleanable
plus compacted entries, passes ``min_cleanable_dirty_ratio`` (a topic attribute,
else the store's knob); the check runs every ``compaction_check_interval_s`` on
the cleaner's own thread. ``compact_now`` forces passes (the admin endpoint).

Retention: a commitlog segment holding a record of a compacted queue's
uncompacted range is kept (:meth:`Compactor.may_delete`, asked by the store's
retention beside the tier), so a crash before a generation is switched in
never loses a record that was not copied yet.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import mmap
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from . import record
from .compacted_log import (
    Generation,
    GenerationWriter,
    open_generation,
    remove_other_generations,
)
from .consume_queue import _safe, unsafe
from .mapped_file import MappedFile
from .errors import CorruptRecordError
from .model import GetResult, GetStatus, MessageType, StoredMessage

if TYPE_CHECKING:  # the store owns the cleaner; imported for type hints only
    from .message_store import MessageFilter, MessageStore

log = logging.getLogger("unimq.compaction")

_FIXED = record.FIXED.unpack_from
_PREFIX = record.PREFIX.unpack_from
_HEADER = record.HEADER_SIZE
_CHUNK = 4096  # consume-queue entries read at a time


def _digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


def _head(buf, pos: int) -> tuple[tuple, bytes | None]:
    """A record's fixed fields (``record.FIXED``: 0 flags, 5 store time, 7 link origin, 19 body
    length) and its first key as bytes, without decoding anything else."""
    f = _FIXED(buf, pos + 12)
    kl = f[16]
    if not kl:
        return f, None
    p = pos + _HEADER + f[10] + f[11] + f[12] + f[13] + f[14] + f[15]
    keys = buf[p : p + kl]
    z = keys.find(b"\0")
    return f, keys if z < 0 else keys[:z]


class Compactor:
    """Compacted logs of every compacted queue of one store, and the thread that cleans them."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.config = store.config
        self.root = Path(store.config.data_dir) / "compacted"
        self.gens: dict[tuple[str, int], Generation] = {}
        self._pass_lock = threading.Lock()  # one pass at a time (the thread or a forced one)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # table reads: per queue (boundary, offset read up to, key -> latest offset, sorted offsets)
        self._live: dict[tuple[str, int], tuple[int, int, dict[str, int], list[int] | None]] = {}
        self.passes = 0
        self.bytes_read = 0
        self._throttle_t0 = 0.0  # compaction_max_bytes_per_s: when this pass started, bytes so far
        self._throttle_bytes = 0

    # ------------------------------------------------------------------ lifecycle

    def topics(self) -> list[str]:
        return [t.name for t in list(self.store.topics.topics.values()) if t.message_type == MessageType.COMPACTED]

    def _dir(self, topic: str, queue_id: int) -> Path:
        return self.root / _safe(topic) / str(queue_id)

    def load(self) -> None:
        """Open every compacted queue's live generation (temporary files a crash left are deleted)."""
        if not self.root.exists():
            return
        for tdir in self.root.iterdir():
            for qdir in tdir.iterdir() if tdir.is_dir() else ():
                if qdir.name.isdigit():
                    self.gens[(unsafe(tdir.name), int(qdir.name))] = open_generation(qdir)

    def drop(self, topic: str) -> None:
        """A deleted topic's compacted logs go with it (a topic made again under its name starts empty)."""
        with self._pass_lock:
            for key in [k for k in self.gens if k[0] == topic]:
                del self.gens[key]
                self._live.pop(key, None)
            shutil.rmtree(self.root / _safe(topic), ignore_errors=True)

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="unimq-compaction", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.config.compaction_check_interval_s):
            try:
                for topic in self.topics():
                    for q in self.store.queue_ids(topic):
                        if self._stop.is_set():
                            return
                        if self.dirty_ratio(topic, q) > self._ratio(topic):
                            self.compact_queue(topic, q)
            except Exception:  # keep serving; the next round retries
                log.exception("compaction round failed")

    # ------------------------------------------------------------------ settings per topic

    def _attr(self, topic: str, name: str, default: float) -> float:
        tc = self.store.topics.get(topic)
        try:
            return float(tc.attributes[name]) if tc is not None and name in tc.attributes else default
        except ValueError:
            return default

    def _ratio(self, topic: str) -> float:
        return self._attr(topic, "min_cleanable_dirty_ratio", self.config.compaction_min_cleanable_dirty_ratio)

    def _delete_retention_ms(self, topic: str) -> float:
        return self._attr(topic, "delete_retention_ms", self.config.compaction_delete_retention_ms)

    # ------------------------------------------------------------------ what is cleanable

    def boundary(self, topic: str, queue_id: int) -> int:
        g = self.gens.get((topic, queue_id))
        return g.boundary if g is not None else 0

    def cleanable_end(self, topic: str, queue_id: int) -> int:
        """First offset not to compact: its record is in the active segment or not flushed yet."""
        store = self.store
        cq = store._cqs.get((topic, queue_id))
        if cq is None:
            return 0
        files = store.commitlog.files.files
        if len(files) < 2:
            return max(self.boundary(topic, queue_id), cq.min_offset)
        flush = store._flush
        limit = min(files[-1].base, flush.flushed if flush is not None else files[-1].base)
        lo, hi = max(self.boundary(topic, queue_id), cq.min_offset), cq.max_offset
        while lo < hi:  # a queue's records grow through the log: binary search
            mid = (lo + hi) // 2
            e = cq.entry(mid)
            if e is not None and (e[1] == 0 or e[0] + e[1] <= limit):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def dirty_ratio(self, topic: str, queue_id: int) -> float:
        b = self.boundary(topic, queue_id)
        dirty = self.cleanable_end(topic, queue_id) - b
        if dirty <= 0:
            return 0.0
        g = self.gens.get((topic, queue_id))
        return dirty / (dirty + (g.count if g is not None else 0))

    def may_delete(self, segment: MappedFile) -> bool:
        """Retention's question: does no compacted queue still need a record of ``segment``?"""
        end = segment.base + segment.size
        store = self.store
        for topic in self.topics():
            for q in store.queue_ids(topic):
                cq = store._cqs.get((topic, q))
                if cq is None:
                    continue
                off = max(self.boundary(topic, q), cq.min_offset)
                e = cq.entry(off) if off < cq.max_offset else None
                if e is not None and e[0] < end:
                    return False
        return True

    # ------------------------------------------------------------------ a pass

    def _throttle(self, nbytes: int) -> None:
        self.bytes_read += nbytes
        rate = self.config.compaction_max_bytes_per_s
        if rate > 0:
            ahead = self._throttle_bytes / rate - (time.monotonic() - self._throttle_t0)
            self._throttle_bytes += nbytes
            if ahead > 0:
                time.sleep(min(ahead, 1.0))

    def compact_now(self, topic: str) -> dict:
        """Compact every queue of ``topic`` as far as it can go now, whatever its dirty share."""
        done = {"passes": 0, "queues": 0, "removed": 0}
        for q in self.store.queue_ids(topic):
            done["queues"] += 1
            while True:
                r = self.compact_queue(topic, q)
                if r is None:
                    break
                done["passes"] += 1
                done["removed"] += r
                if self.boundary(topic, q) >= self.cleanable_end(topic, q):
                    break
        return done

    def compact_queue(self, topic: str, queue_id: int) -> int | None:
        """One pass over one queue; the number of records dropped, None if nothing was cleanable."""
        with self._pass_lock:
            return self._pass(topic, queue_id)

    def _pass(self, topic: str, queue_id: int) -> int | None:
        store = self.store
        cq = store._cqs.get((topic, queue_id))
        if cq is None or store.topics.get(topic) is None:
            return None
        key = (topic, queue_id)
        old = self.gens.get(key) or Generation(None, 0, 0, 0)
        start = max(old.boundary, cq.min_offset)
        end = self.cleanable_end(topic, queue_id)
        if end <= start:
            return None
        self._throttle_t0, self._throttle_bytes = time.monotonic(), 0
        cap = max(1, self.config.compaction_map_entries)
        latest: dict[bytes, int] = {}  # key digest -> its latest offset in [start, stop)
        keyless: list[int] = []  # none in a compacted topic's own messages; kept if they occur
        stop = off = start
        full = False
        while off < end and not full:  # 1: the offset map of the dirty range, bounded (headers only)
            for phys, size, _ in cq.get(off, min(_CHUNK, end - off)):
                if size:
                    buf, pos = self._locate(phys)
                    f, k = _head(buf, pos)
                    if f[0] & record.FLAG_LINK:
                        buf, pos = self._locate(f[7])
                        f, k = _head(buf, pos)
                    if k is None:
                        keyless.append(off)
                    else:
                        d = _digest(k)
                        if d not in latest and len(latest) >= cap:
                            full = True
                            break
                        latest[d] = off
                    self._throttle(size)
                off += 1
                stop = off
        horizon = time.time() * 1000 - self._delete_retention_ms(topic)
        writer = GenerationWriter(self._dir(topic, queue_id), old.gen + 1)
        try:
            for qo, pos, size in old.entries():  # 2: what the old generation keeps
                f, k = _head(old.buffer, pos)
                if k is not None and (_digest(k) in latest or (f[19] == 0 and f[5] < horizon)):
                    continue
                writer.add(qo, old.raw(pos, size))
            # 3: the latest record of each key of [start, stop), read by offset: the others are not touched
            for q in sorted([*latest.values(), *keyless]):
                phys = cq.entry(q)[0]  # type: ignore[index]
                buf, pos = self._locate(phys)
                f, _ = _head(buf, pos)
                if f[0] & record.FLAG_LINK:
                    buf, pos = self._locate(f[7])
                    f, _ = _head(buf, pos)
                if f[19] == 0 and f[5] < horizon:  # a delete marker past its retention
                    continue
                size = _PREFIX(buf, pos)[0]
                writer.add(q, memoryview(buf)[pos : pos + size])
                self._throttle(size)
            if self._stop.is_set() and self._thread is not None and threading.current_thread() is self._thread:
                writer.abort()
                return None
            new = writer.commit(stop)
        except BaseException:
            writer.abort()
            raise
        self.gens[key] = new  # readers starting now see the new generation; running ones keep theirs
        self._live.pop(key, None)
        remove_other_generations(self._dir(topic, queue_id), new.gen)
        self.passes += 1
        dropped = old.count + (stop - start) - new.count  # (holes, never written, count as dropped)
        log.info("compacted %s/%d up to offset %d: %d kept, %d dropped", topic, queue_id, stop, new.count, dropped)
        return dropped

    def _locate(self, phys: int) -> tuple[mmap.mmap, int]:
        """The mapped segment holding commitlog offset ``phys``, and the offset in it."""
        mf = self.store.commitlog.files.find(phys)
        if mf is None:
            raise CorruptRecordError(f"no record at commitlog offset {phys}")
        return mf.mm, phys - mf.base

    # ------------------------------------------------------------------ reads below the boundary

    def get(
        self, topic: str, queue_id: int, offset: int, max_count: int, msg_filter: MessageFilter | None,
        live: Callable[[int, int], GetResult],
    ) -> GetResult | None:
        """Messages from ``offset`` when it lies below the boundary (then on into the live range
        through ``live``); None when the offset is the commitlog's to answer."""
        g = self.gens.get((topic, queue_id))
        if g is None or offset >= g.boundary:
            return None
        hi = self.store.max_offset(topic, queue_id)
        lo = min(g.first_offset(), g.boundary)
        out: list[StoredMessage] = []
        i = g.index_of(offset)
        want_all = msg_filter is None or msg_filter.matches_all
        scanned = 0
        while i < g.count and len(out) < max_count and scanned < 4096 + max_count:
            qo, pos, _ = g.entry(i)
            i += 1
            scanned += 1
            m = g.message(pos)
            if not want_all and not msg_filter.matches(m.tag, m.properties):  # type: ignore[union-attr]
                continue
            if not m.message_id:
                m.message_id = self.store.appender.message_id(m.commitlog_offset)
            m.topic, m.queue_id, m.queue_offset = topic, queue_id, qo
            out.append(m)
        nxt = g.entry(i)[0] if i < g.count else g.boundary
        if len(out) < max_count and i >= g.count and g.boundary < hi:
            r = live(g.boundary, max_count - len(out))
            if r.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
                out.extend(r.messages)
                nxt = r.next_offset
        status = GetStatus.FOUND if out else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, out, nxt, lo, hi)

    def min_offset(self, topic: str, queue_id: int) -> int | None:
        g = self.gens.get((topic, queue_id))
        return None if g is None or (g.boundary == 0) else min(g.first_offset(), g.boundary)

    # ------------------------------------------------------------------ the table

    def _live_keys(self, topic: str, queue_id: int) -> tuple[dict[bytes, int], list[int]]:
        """(boundary, key -> latest offset) of the uncompacted range, kept up to date incrementally."""
        key = (topic, queue_id)
        b = self.boundary(topic, queue_id)
        hi = self.store.max_offset(topic, queue_id)
        cached = self._live.get(key)
        if cached is not None and cached[0] == b:
            _, seen, keys, ordered = cached
        else:
            seen, keys, ordered = b, {}, None
        cq = self.store._cqs.get(key)
        off = max(seen, cq.min_offset) if cq is not None else hi
        while cq is not None and off < hi:
            entries = cq.get(off, min(_CHUNK, hi - off))
            if not entries:
                break
            for phys, size, _ in entries:
                if size:
                    k = _head(*self._locate(phys))[1]
                    if k is not None:
                        keys[k] = off
                off += 1
        if ordered is None or off != seen:
            ordered = sorted(keys.values())
        self._live[key] = (b, off, keys, ordered)
        return keys, ordered

    def table(self, topic: str, queue_id: int, offset: int, max_count: int) -> GetResult:
        """The latest message of every key of one queue, in offset order, from ``offset``.

        Delete markers are left out (a deleted key is not in the table). ``next_offset`` is
        where the next page starts; the queue's end once it is read through.
        """
        keys, ordered = self._live_keys(topic, queue_id)
        g = self.gens.get((topic, queue_id))
        hi = self.store.max_offset(topic, queue_id)
        out: list[StoredMessage] = []
        nxt = max(offset, 0)
        if g is not None and nxt < g.boundary:
            i = g.index_of(nxt)
            while i < g.count and len(out) < max_count:
                qo, pos, _ = g.entry(i)
                i += 1
                f, k = _head(g.buffer, pos)
                nxt = qo + 1
                if k in keys or f[19] == 0:
                    continue  # a newer value in the live range, or a delete marker
                m = g.message(pos)
                if not m.message_id:
                    m.message_id = self.store.appender.message_id(m.commitlog_offset)
                m.topic, m.queue_id, m.queue_offset = topic, queue_id, qo
                out.append(m)
            if i >= g.count:
                nxt = max(nxt, g.boundary)
        if len(out) < max_count and nxt < hi:
            for o in ordered[bisect.bisect_left(ordered, nxt):]:
                if len(out) >= max_count:
                    break
                m = self.store.read_at(topic, queue_id, o)
                nxt = o + 1
                if m is None or not m.body:
                    continue
                out.append(m)
            else:
                nxt = max(nxt, hi)
        return GetResult(GetStatus.FOUND if out else GetStatus.NO_MATCHED_MESSAGE, out, nxt, 0, hi)
