"""MessageStore: CommitLog + ConsumeQueues + IndexFile, with flush, recovery and retention.

This is the one place messages of every protocol are written. A put appends
one record to the commitlog and, in the same critical section, dispatches it
into its consume queue(s) and the key index, so a message is readable as soon
as ``put`` returns. The record names every queue offset it was given, so all
the indexes can be rebuilt from the commitlog after a crash.

Thread model: puts hold ``_lock`` (a few microseconds each); fsync happens
only on the flush thread; retention runs on the housekeeping thread. Reads
take no lock: they read below the published write position.

Layout of ``data_dir``::

    commitlog/<20-digit base offset>     segments
    consumequeue/<topic>/<queue>/<base>  consume queue files (LMQs: %25LMQ%25/, light_queue.py)
    batchqueue/<topic>/<queue>/<base>    batch topics' consume queues (batch_queue.py)
    index/<timestamp>                    index files
    config/topics.json, config/consumer_offsets.json
    checkpoint, abort, store_id
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence

from . import record
from . import log_copy, log_start
from .commitlog import CommitLog
from .compaction import Compactor
from .config import FlushMode, StoreConfig
from . import batch_queue
from .batch_queue import BatchConsumeQueue
from .bulk_reads import BulkReads, batch_member_by_id
from .consume_queue import ENTRY_SIZE, LMQ_CQ_ENTRIES, ConsumeQueue, _safe, unsafe
from .light_queue import DIR_NAME as LMQ_DIR, LightQueueLog
from .errors import (
    CorruptRecordError,
    StoreClosedError,
)
from .durability import DurabilityPolicy
from .appender import Appender, tag_hash
from .flush_service import FlushService
from .group_commit import GroupCommit
from .index_file import IndexService
from .json_file import read_json, write_json_atomic
from .model import (
    GetResult,
    GetStatus,
    Message,
    PutResult,
    PutStatus,
    StoredMessage,
)
from .offset_store import ConsumerOffsetStore
from .segment_keeper import SegmentKeeper
from .system_topics import LMQ_PREFIX
from .topic_config import TopicConfigManager

log = logging.getLogger("unimq.store")

MAX_SCAN = 4096  # consume-queue entries one filtered get may skip before answering
_time = time.time
_get_running_loop = asyncio.get_running_loop
# Commitlog warm-up (sync flush): keep this many bytes of written zeros ahead of the writer,
# zero-filled in pieces of this size, one fdatasync each (see CommitLog.warm_step).
WARM_LEAD = 16 << 20
WARM_PIECE = 1 << 20


class MessageFilter(Protocol):
    """What ``get`` needs of a compiled consumer filter (see ``core_broker.filter``)."""

    tag_hashes: frozenset[int] | None
    matches_all: bool

    def matches(self, tag: str | None, properties: dict[str, str]) -> bool: ...


class MessageStore(BulkReads):
    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        root = Path(config.data_dir)
        self.root = root
        self.commitlog = CommitLog(root / "commitlog", config.commitlog_segment_size)
        self.index = IndexService(root / "index", config.index_slots, config.index_entries_per_file)
        self.topics = TopicConfigManager(root / "config" / "topics.json")
        self.offsets = ConsumerOffsetStore(root / "config" / "consumer_offsets.json")
        self.abort_marker_path = root / "abort"
        self.checkpoint_path = root / "checkpoint"
        self._cq_root = root / "consumequeue"
        self._bq_root = root / batch_queue.ROOT
        self._cqs: dict[tuple[str, int], ConsumeQueue] = {}  # and LightQueues: LMQs since issue 21
        self.lmqs = LightQueueLog(self._cq_root / LMQ_DIR, lambda: self.commitlog.write_pos)  # every LMQ, one log
        self._lock = threading.Lock()  # the write lock: every append, truncation and roll
        # Every record is written by the appender, under _lock.
        self.appender = Appender(self.commitlog, self.index, self._cqs, self._cq, config.max_message_size)
        self.store_id = ""
        self.new_store = False
        self._running = False
        self._sync = config.flush == FlushMode.SYNC
        self._flush: FlushService | None = None
        # When a put may be acknowledged (local flush, and replicas once a group's master).
        self.durability = DurabilityPolicy(self._sync, self._flush_future)
        self._group_commit = GroupCommit(self._lock, self.appender, self.commitlog, lambda: self._flush)
        self._housekeeping: threading.Thread | None = None
        self._hk_stop = threading.Event()
        self.recovered_abnormally = False
        # The tiered storage, when on (core_broker.tier, attached by the broker): retention
        # deletes a segment only once the tier confirms its upload.
        self.tier: SegmentKeeper | None = None
        # Compacted topics' logs and cleaner (core_broker/compaction.py); a keeper for retention too.
        self.compaction = Compactor(self)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open the store; after a crash, find the last valid record and rebuild indexes."""
        root = self.root
        root.mkdir(parents=True, exist_ok=True)
        id_path = root / "store_id"
        self.new_store = not id_path.exists()  # a store id made now: nothing of it can be in a tier
        if not self.new_store:
            self.store_id = id_path.read_text().strip()
        else:
            self.store_id = secrets.token_hex(8).upper()
            id_path.write_text(self.store_id)
        self.appender.set_store_id(self.store_id)
        self.topics.load()
        self.offsets.load()
        self.commitlog.load()
        self.index.load()
        self._load_consume_queues()
        self.compaction.load()
        cut = log_copy.resume_truncation(self)  # before recovery: never serve bytes being cut
        if cut is not None:
            log.warning("finished a truncation a crash interrupted: the log ends at %d at most", cut)
        self._recover()
        self.lmqs.dropped.clear()
        fd = os.open(self.abort_marker_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.fsync(fd)
        os.close(fd)
        self._flush = FlushService(
            sync_mode=self._sync,
            interval_ms=self.config.flush_interval_ms,
            checkpoint_interval_ms=self.config.checkpoint_interval_ms,
            snapshot=self._snapshot_write_pos,
            sync_commitlog=self.commitlog.sync,
            checkpoint=self._checkpoint,
            warm=self._warm_step if self.config.warmup_enabled else None,
            prepare=self._prepare_next,
        )
        self._flush.start(self.commitlog.write_pos)
        self._running = self.appender.open = True
        self._hk_stop.clear()
        self._housekeeping = threading.Thread(target=self._housekeeping_loop, name="unimq-housekeeping", daemon=True)
        self._housekeeping.start()
        self.compaction.start()

    def shutdown(self) -> None:
        """Flush everything, write a clean checkpoint, remove the abort marker."""
        if not self._running:
            return
        with self._lock:
            self._running = self.appender.open = False
        self._hk_stop.set()
        self.compaction.stop()
        if self._housekeeping is not None:
            self._housekeeping.join()
        if self._flush is not None:
            self._flush.stop()
        end = self.commitlog.write_pos
        self._sync_indexes()
        self.offsets.persist(force=True)
        write_json_atomic(self.checkpoint_path, {"safe": end, "clean_end": end, "ts": int(time.time() * 1000)})
        try:
            os.unlink(self.abort_marker_path)
        except FileNotFoundError:
            pass
        self.commitlog.close()
        for cq in self._cqs.values():
            cq.close()
        self.lmqs.close()
        self.index.close()

    @property
    def _id_prefix(self) -> str:
        """The server-assigned ids' prefix: version + store id (what tests look for)."""
        return self.appender.id_prefix

    @property
    def running(self) -> bool:
        return self._running

    def _load_consume_queues(self) -> None:
        self._load_batch_queues()
        self.lmqs.load(self.commitlog.min_offset)
        self._cqs.update(((name, 0), q) for name, q in self.lmqs.queues.items())
        if not self._cq_root.exists():
            return
        for tdir in self._cq_root.iterdir():
            if not tdir.is_dir() or tdir.name == LMQ_DIR:
                continue
            topic = unsafe(tdir.name)
            for qdir in tdir.iterdir():
                if qdir.name.isdigit() and (topic, int(qdir.name)) not in self._cqs:
                    cq = ConsumeQueue(self._cq_root, topic, int(qdir.name), self._cq_entries(topic, qdir))
                    cq.load()
                    self._cqs[(topic, int(qdir.name))] = cq

    def _recover(self) -> None:
        cp = read_json(self.checkpoint_path, {})
        crashed = self.abort_marker_path.exists() or "clean_end" not in cp
        first = self.commitlog.first_record_offset()
        if not self.commitlog.files.files:
            self.commitlog.set_write_pos(int(cp.get("clean_end", cp.get("safe", 0))) if not crashed else 0)
            return
        # Consume queues lost (deleted by hand, ...): rebuilt from the commitlog even after a clean stop.
        rebuild = not self._cq_root.exists()
        if not crashed and not rebuild:
            self.commitlog.set_write_pos(int(cp["clean_end"]))
            return
        self.recovered_abnormally = crashed
        safe = int(cp.get("safe", first))
        if safe < first or self.commitlog.files.find(safe) is None or not self._cq_root.exists():
            safe = first
        t0 = time.monotonic()
        end = self.commitlog.scan(safe)
        self.commitlog.truncate(end)
        for cq in self._cqs.values():
            cq.truncate_beyond_phys(end)
        count = 0

        def redispatch(h: record.RecordHeader) -> None:
            nonlocal count
            count += 1
            self._dispatch_header(h)

        self.commitlog.scan(safe, redispatch)
        self.commitlog.sync()
        self._sync_indexes()
        log.warning(
            "recovered after an unclean stop: log ends at %d, %d records re-dispatched from %d in %.3fs",
            end, count, safe, time.monotonic() - t0,
        )

    def _dispatch_header(self, h: record.RecordHeader) -> None:
        th = tag_hash(h.tag)
        if h.batch_count:
            return self._dispatch_batch(h, th)
        self._cq(h.topic, h.queue_id).put(h.queue_offset, h.phys_offset, h.size, th)
        dropped = self.lmqs.dropped  # (empty but while recovering)
        for topic, qid, qo in h.dispatch:
            if dropped and h.phys_offset < dropped.get(topic, -1):
                continue  # an LMQ deleted after this record was stored: not revived
            self._cq(topic, qid).put(qo, h.phys_offset, h.size, th)
        if h.origin_offset < 0:
            ts = h.store_ts
            for k in h.keys:
                self.index.put(f"{h.topic}#{k}", h.phys_offset, ts)
            if h.message_id:
                self.index.put("#id#" + h.message_id, h.phys_offset, ts)

    # ------------------------------------------------------------------ flush & checkpoint

    def _warm_step(self) -> int | None:
        return self.commitlog.warm_step(self._lock, WARM_LEAD, WARM_PIECE)

    def _prepare_next(self) -> bool:
        # Far enough ahead that the next segment (and, in sync mode, its warm head) is ready
        # before the roll even at disk speed: async mode looks only every flush_interval_ms,
        # and a quarter of a 1 GiB segment lasts about that long at 1 GB/s.
        return self.commitlog.prepare_next(self._lock, max(4 * WARM_LEAD, self.config.commitlog_segment_size // 4))

    def _snapshot_write_pos(self) -> int:
        with self._lock:
            return self.commitlog.write_pos

    def _sync_indexes(self) -> None:
        for cq in list(self._cqs.values()):
            cq.sync()
        self.lmqs.sync()
        self.index.sync()

    def _checkpoint(self, safe: int) -> None:
        """Everything below ``safe`` is in the commitlog and dispatched; make that durable."""
        safe = min(safe, self.commitlog.write_pos)  # a truncation may have cut the log meanwhile
        self._sync_indexes()
        write_json_atomic(self.checkpoint_path, {"safe": safe, "ts": int(time.time() * 1000)})

    # ------------------------------------------------------------------ write path

    def _cq_entries(self, topic: str, qdir: Path | None = None) -> int:
        """Entries per consume-queue file (an older version's LMQ files: 80 KiB, kept)."""
        lmq = topic.startswith(LMQ_PREFIX)
        for p in sorted(qdir.iterdir()) if lmq and qdir is not None else ():
            size = p.stat().st_size
            if p.name.isdigit() and size and size % ENTRY_SIZE == 0:
                return size // ENTRY_SIZE
        return min(LMQ_CQ_ENTRIES, self.config.cq_entries_per_file) if lmq else self.config.cq_entries_per_file

    def _cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self._cqs.get(key)
        if cq is None and queue_id == 0 and topic.startswith(LMQ_PREFIX):
            cq = self._cqs[key] = self.lmqs.queue(topic)  # type: ignore[assignment]
        elif cq is None:
            if self.is_batch_topic(topic):
                cq = BatchConsumeQueue(self._bq_root, topic, queue_id, self.config.cq_entries_per_file)
            else:
                cq = ConsumeQueue(self._cq_root, topic, queue_id, self._cq_entries(topic))
            self._cqs[key] = cq  # type: ignore[assignment]
        return cq  # type: ignore[return-value]

    def put(self, msg: Message) -> PutResult:
        """Store one message; in sync flush mode, return only once it is on disk."""
        now = int(_time() * 1000)
        lock = self._lock
        lock.acquire()
        try:
            r = self.appender.append_one(msg, now)
        finally:
            lock.release()
        if self._sync:
            return self._await_flush_blocking(r)
        return r

    def put_batch(self, msgs: Sequence[Message]) -> list[PutResult]:
        """Store many messages under one lock acquisition and one flush wait."""
        now = int(time.time() * 1000)
        with self._lock:
            results = self.appender.append_batch(msgs, now)
        if self._sync and results:
            last = results[-1]
            if not self._flush.wait(last.commitlog_offset + last.store_size):  # type: ignore[union-attr]
                return [r._replace(status=PutStatus.FLUSH_DISK_TIMEOUT) for r in results]
        return results

    async def put_async(self, msg: Message) -> PutResult:
        """Event-loop variant: the write is a memcpy; in sync mode await the group commit.

        In sync mode the write is deferred to one callback that writes every
        put_async queued on this loop meanwhile (``core_broker.group_commit``) through the
        batch path: one lock acquisition, one flush registration and one wake-up
        per group instead of per message, which is what lets many concurrent
        writers share each fdatasync cheaply. The flush thread settles the group
        with one callback on the loop (``FlushService.notify``). Each writer still
        gets its own result or error. A put cancelled before its group is written
        is not stored.
        """
        if not self._sync:
            now = int(_time() * 1000)
            with self._lock:
                return self.appender.append_one(msg, now)
        return await self._group_commit.put(msg)

    async def put_batch_async(self, msgs: Sequence[Message]) -> list[PutResult]:
        now = int(time.time() * 1000)
        with self._lock:
            results = self.appender.append_batch(msgs, now)
        if self._sync and results:
            last = results[-1]
            await self._flush.future(last.commitlog_offset + last.store_size)  # type: ignore[union-attr]
        return results

    def _await_flush_blocking(self, r: PutResult) -> PutResult:
        if self._flush.wait(r.commitlog_offset + r.store_size):  # type: ignore[union-attr]
            return r
        return r._replace(status=PutStatus.FLUSH_DISK_TIMEOUT)

    def put_link(
        self,
        origin_offset: int,
        topic: str,
        queue_id: int,
        *,
        properties: dict[str, str] | None = None,
        reconsume_times: int = 0,
        protocol: str = "internal",
        extra_dispatch: Sequence[tuple[str, int]] = (),
        wait: bool = True,
    ) -> PutResult:
        """Dispatch an already stored message into (topic, queue) later, body not copied.

        Used for delay fire, transaction commit and retry. The link record is in
        the commitlog, so the dispatch survives a crash like any other record.
        ``extra_dispatch`` indexes the same link into more queues in the same
        record; the broker uses it to journal the state change atomically with it.
        """
        cl, tier = self.commitlog, self.tier
        cold = tier is not None and origin_offset < cl.min_offset  # in the tier only (see SegmentKeeper)
        origin = tier.read_record(origin_offset) if cold else cl.read(origin_offset)  # type: ignore[union-attr]
        merged: dict[str, str] = {}
        lo, _ = tier.record_link_origin(origin_offset) if cold else cl.link_origin(origin_offset)  # type: ignore[union-attr]
        if lo >= 0:  # never chain links: point at the real message, keep the link's properties
            merged.update(origin.properties)
            origin_offset = lo
            origin = tier.read_record(lo) if tier is not None and lo < cl.min_offset else cl.read(lo)
        if properties:
            merged.update(properties)
        link = Message(
            topic,
            b"",
            tag=origin.tag,
            properties=merged,
            born_timestamp_ms=origin.born_timestamp_ms,
            protocol=protocol,
            queue_id=queue_id,
            reconsume_times=reconsume_times,
        )
        now = int(time.time() * 1000)
        with self._lock:
            r = self.appender.append_link(link, origin, origin_offset, extra_dispatch, now)
        if self._sync and wait:
            return self._await_flush_blocking(r)
        return r

    async def wait_durable(self, r: PutResult) -> None:
        """Wait (without blocking the loop) until ``r`` may be acknowledged: see DurabilityPolicy."""
        await self.durability.wait(r.commitlog_offset + r.store_size)

    async def _flush_future(self, end: int) -> None:
        await self._flush.future(end)  # type: ignore[union-attr]

    # ------------------------------------------------------------------ replication seams

    @property
    def write_pos(self) -> int:
        """End of the last whole record written."""
        return self.commitlog.write_pos

    def flushed_pos(self) -> int:
        """How far fdatasync has covered the log (the write position under async flush)."""
        if not self._sync or self._flush is None:
            return self.commitlog.write_pos
        return min(self._flush.flushed, self.commitlog.write_pos)

    async def wait_flushed(self, end: int) -> None:
        if self._sync:
            await self._flush.future(end)  # type: ignore[union-attr]

    def read_log(self, start: int, max_bytes: int) -> tuple[int, bytes]:
        """Whole records from ``start`` as bytes (see core_broker.log_copy)."""
        return log_copy.read_log(self, start, max_bytes)

    def append_replicated(self, start: int, data: bytes) -> int:
        """A master's bytes written at the same offsets, dispatched (see core_broker.log_copy)."""
        if not self._running:
            raise StoreClosedError("the store is not running")
        return log_copy.append_replicated(self, start, data)

    def truncate_to(self, offset: int) -> None:
        """Cut the log at ``offset`` crash-safely (see core_broker.log_copy)."""
        log_copy.truncate_to(self, offset)

    def continue_after(self, phys_end: int, queue_ends: dict[tuple[str, int], int]) -> None:
        """Continue an empty local log after what the tier holds (see core_broker.log_start)."""
        log_start.continue_after(self, phys_end, queue_ends)

    def adopt_store_id(self, store_id: str) -> None:
        """Take a group master's store id: server message ids encode it with the record's
        offset, and a replica holds the same records at the same offsets, so after a
        failover the ids clients were given still find their messages."""
        if store_id == self.store_id:
            return
        (self.root / "store_id").write_text(store_id)
        self.store_id = store_id
        self.appender.set_store_id(store_id)

    def put_batch_nowait(self, msgs: Sequence[Message]) -> list[PutResult]:
        """Batch write without waiting for the flush; pair with :meth:`wait_durable`."""
        now = int(time.time() * 1000)
        with self._lock:
            return self.appender.append_batch(msgs, now)

    def put_nowait(self, msg: Message) -> PutResult:
        """Write without waiting for the flush; pair with :meth:`wait_durable`."""
        now = int(time.time() * 1000)
        with self._lock:
            return self.appender.append_one(msg, now)

    # ------------------------------------------------------------------ read path

    def _materialize(self, phys: int) -> StoredMessage:
        """Decode the record at ``phys``; follow a link to its origin message."""
        cl = self.commitlog
        m = cl.read(phys)
        if m.flags & record.FLAG_LINK:
            lo, _ = cl.link_origin(phys)
            origin = cl.read(lo)
            if m.properties:
                origin.properties.update(m.properties)
            origin.reconsume_times = m.reconsume_times
            origin.store_timestamp_ms = m.store_timestamp_ms
            if not origin.message_id:
                origin.message_id = self.appender.message_id(lo)
            origin.flags |= record.FLAG_LINK
            return origin
        if not m.message_id:
            m.message_id = self.appender.message_id(phys)
        return m

    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        msg_filter: MessageFilter | None = None,
        read: Callable[[int], StoredMessage] | None = None,
    ) -> GetResult:
        """Up to ``max_count`` messages from ``offset`` of one queue, filtered server-side.

        Reads are memory copies out of the page cache; a cold page may fault to
        disk, which is why the gateway's pull path may run this on a thread.
        ``read`` replaces how a record becomes a message (the tier's: a link whose
        origin left the local disk is resolved from the object store); an exception
        it raises other than a missing or corrupt record ends the get. Offsets below a compacted
        queue's boundary are read from its compacted log (``compaction.py``).
        """
        if (topic, queue_id) in self.compaction.gens:
            r = self.compaction.get(topic, queue_id, offset, max_count, msg_filter,
                                    lambda o, n: self.get(topic, queue_id, o, n, msg_filter, read))
            if r is not None:
                return r
        cq = self._cqs.get((topic, queue_id))
        if cq is None or cq.max_offset == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, [], 0 if offset <= 0 else offset, 0, 0)
        cl_min = self.commitlog.min_offset
        if cq.min_offset < cq.max_offset:
            first = cq.entry(cq.min_offset)
            if first is not None and first[0] < cl_min:
                cq.drop_before_phys(cl_min)
        lo, hi = cq.min_offset, cq.max_offset
        if offset < lo:
            return GetResult(GetStatus.OFFSET_MOVED, [], lo, lo, hi)
        if offset == hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], offset, lo, hi)
        if offset > hi:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, [], hi, lo, hi)
        want_all = msg_filter is None or msg_filter.matches_all
        hashes = None if want_all else msg_filter.tag_hashes  # type: ignore[union-attr]
        scan = max_count if want_all else max(MAX_SCAN, max_count)
        if isinstance(cq, BatchConsumeQueue):
            return self._get_batches(cq, offset, max_count, scan, msg_filter, read)
        entries = cq.get(offset, scan)
        out: list[StoredMessage] = []
        next_off = offset
        materialize = read or self._materialize
        for phys, _size, th in entries:
            q = next_off
            next_off += 1
            if hashes is not None and th not in hashes:
                continue
            try:
                m = materialize(phys)
            except (CorruptRecordError, ValueError):
                continue  # removed by retention under our feet, or never valid: skip it
            if not want_all and not msg_filter.matches(m.tag, m.properties):  # type: ignore[union-attr]
                continue
            if m.flags & record.FLAG_BATCH and record.P_BATCH_INDEX not in m.properties:
                m.properties[record.P_BATCH_INDEX] = str(th)  # one message of a batch (an LMQ's entry)
            m.topic = topic
            m.queue_id = queue_id
            m.queue_offset = q
            out.append(m)
            if len(out) >= max_count:
                break
        status = GetStatus.FOUND if out else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, out, next_off, lo, hi)

    def read_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        """The message at one queue offset, or None if it is gone or not there yet."""
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return None
        e = cq.locate(offset) if isinstance(cq, BatchConsumeQueue) else cq.entry(offset)
        if e is None or e[0] < self.commitlog.min_offset:
            return None
        try:
            m = self._materialize(e[0])
        except (CorruptRecordError, ValueError):
            return None
        if m.flags & record.FLAG_BATCH and record.P_BATCH_INDEX not in m.properties:
            m.properties[record.P_BATCH_INDEX] = str(offset - e[3] if len(e) == 5 else e[2])
        m.topic, m.queue_id, m.queue_offset = topic, queue_id, offset
        return m

    def phys_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        """Commitlog offset of the record a queue entry points at (a link stays a link)."""
        cq = self._cqs.get((topic, queue_id))
        e = cq.entry(offset) if cq is not None else None
        return None if e is None or e[0] < self.commitlog.min_offset else e[0]

    def read_phys(self, phys: int) -> StoredMessage:
        return self._materialize(phys)

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cqs.get((topic, queue_id))
        compacted = self.compaction.min_offset(topic, queue_id)
        return compacted if compacted is not None else cq.min_offset if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._cqs.get((topic, queue_id))
        return cq.max_offset if cq else 0

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(q for (t, q) in list(self._cqs) if t == topic)

    def queue_topics(self) -> list[str]:
        return sorted({t for (t, _) in list(self._cqs)})

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """First queue offset whose message was stored at or after ``ts_ms`` (binary search)."""
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return 0
        lo, hi = cq.min_offset, cq.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            m = self.read_at(topic, queue_id, mid)
            if m is None or m.store_timestamp_ms < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def query_by_id(self, message_id: str) -> StoredMessage | None:
        """Server ids decode to their commitlog offset; client-chosen ids use the index."""
        if len(message_id) == 34 and message_id.startswith(self.appender.id_prefix):
            try:
                phys = int(message_id[18:], 16)
            except ValueError:
                return None
            if phys < self.commitlog.min_offset:
                return None
            try:
                m = self._materialize(phys)
                if m.message_id == message_id:
                    return m
            except (ValueError, CorruptRecordError):
                pass
            return self.batch_message_at(phys)  # an offset inside a batch record: one of its messages
        for phys in self.index.query("#id#" + message_id, 0, 2**62, 16):
            if phys < self.commitlog.min_offset:
                continue
            try:
                m = self._materialize(phys)
            except (ValueError, CorruptRecordError):
                continue
            if m.message_id == message_id:
                return m
            inner = batch_member_by_id(m, message_id)  # a client id inside a batch record
            if inner is not None:
                return inner
        return None

    def query_by_key(
        self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**62, max_count: int = 32
    ) -> list[StoredMessage]:
        out: list[StoredMessage] = []
        for phys in self.index.query(f"{topic}#{key}", begin_ms, end_ms, max_count):
            if phys < self.commitlog.min_offset:
                continue
            try:
                m = self._materialize(phys)
            except (ValueError, CorruptRecordError):
                continue
            if m.topic == topic and key in m.keys:
                out.append(m)
                if len(out) >= max_count:
                    break
        return out

    # ------------------------------------------------------------------ admin

    def has_queue(self, topic: str, queue_id: int) -> bool:
        return (topic, queue_id) in self._cqs

    def queued_topics(self) -> set[str]:
        """Every topic with a consume queue here (LMQs exist only through theirs)."""
        return {t for t, _ in list(self._cqs)}

    def delete_topic_queues(self, topic: str) -> None:
        """Remove a topic's consume queues (its records age out with their segments)."""
        lmq = topic.startswith(LMQ_PREFIX)
        with self._lock:
            # an LMQ has queue 0 only: no scan of every queue (there is one LMQ per subscription)
            keys = [(topic, 0)] if lmq else [k for k in self._cqs if k[0] == topic]
            for key in keys:
                cq = self._cqs.pop(key, None)
                if cq is not None:
                    cq.destroy()
                    lmq = lmq and type(cq) is not ConsumeQueue  # an older version's LMQ has a directory
        self.offsets.delete_topic(topic)
        if not lmq:  # an LMQ in the shared log has no directory, nor can it be compacted (it is no topic)
            shutil.rmtree(self._cq_root / _safe(topic), ignore_errors=True)
            shutil.rmtree(self._bq_root / _safe(topic), ignore_errors=True)
            self.compaction.drop(topic)

    # ------------------------------------------------------------------ retention

    def _housekeeping_loop(self) -> None:
        interval = self.config.retention_check_interval_s
        persist_every = self.config.consumer_offset_persist_interval_s
        last_persist = time.monotonic()
        while not self._hk_stop.wait(min(interval, persist_every)):
            try:
                self.run_retention()
                if time.monotonic() - last_persist >= persist_every:
                    self.offsets.persist()
                    last_persist = time.monotonic()
            except Exception:  # keep the broker serving; the next round retries
                log.exception("housekeeping round failed")

    def disk_free_ratio(self) -> float:
        st = os.statvfs(self.root)
        return st.f_bavail / st.f_blocks if st.f_blocks else 1.0

    def run_retention(self, now: float | None = None) -> int:
        """Delete expired (or, when the disk is low, oldest) segments; return how many."""
        now = time.time() if now is None else now
        free = self.disk_free_ratio()
        self.appender.refusing = free < self.config.disk_refuse_free_ratio
        low = free < self.config.disk_min_free_ratio
        horizon = now - self.config.retention_hours * 3600
        files = self.commitlog.files.files
        n = 0
        keepers = [k for k in (self.tier, self.compaction) if k is not None]
        for mf in files[:-1]:  # never the segment being written
            if not all(k.may_delete(mf) for k in keepers):
                break  # not in the tier yet, or a compacted queue needs it: keep it and every later one
            try:
                mtime = os.stat(mf.path).st_mtime
            except FileNotFoundError:
                mtime = 0
            if mtime < horizon or low:
                n += 1
                low = False  # under disk pressure, free one segment per round
            else:
                break
        if not n:
            return 0
        with self._lock:
            self.commitlog.files.drop_head(n)
            new_min = self.commitlog.min_offset
            for cq in list(self._cqs.values()):
                cq.drop_before_phys(new_min)
            self.lmqs.drop_before_phys(new_min)
            self.index.drop_before_phys(new_min)
        log.info("retention removed %d commitlog segment(s); log now starts at %d", n, new_min)
        return n


def iter_messages(store: MessageStore, topic: str, queue_id: int, start: int = 0) -> Iterable[StoredMessage]:
    """Every message of one queue from ``start`` (tests and tools)."""
    off = start
    while True:
        r = store.get(topic, queue_id, off, 256)
        if r.status == GetStatus.OFFSET_MOVED:
            off = r.next_offset
            continue
        if not r.messages and r.status != GetStatus.NO_MATCHED_MESSAGE:
            return
        yield from r.messages
        off = r.next_offset
