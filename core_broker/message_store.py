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
    consumequeue/<topic>/<queue>/<base>  consume queue files
    index/<timestamp>                    index files
    config/topics.json, config/consumer_offsets.json
    checkpoint, abort, store_id
"""

from __future__ import annotations

import asyncio
import errno
import logging
import operator
import os
import secrets
import shutil
import struct
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence

from . import record
from . import log_copy
from .commitlog import CommitLog
from .config import FlushMode, StoreConfig
from .consume_queue import ENTRY as CQ_ENTRY, ConsumeQueue, unsafe
from .errors import (
    BadRequestError,
    CorruptRecordError,
    MessageTooLargeError,
    StoreClosedError,
    StoreFullError,
)
from .durability import DurabilityPolicy
from .flush_service import FlushService
from .index_file import IndexService
from .json_file import read_json, write_json_atomic
from .model import (
    DispatchTarget,
    GetResult,
    GetStatus,
    Message,
    PutResult,
    PutStatus,
    StoredMessage,
)
from .offset_store import ConsumerOffsetStore
from .topic_config import TopicConfigManager

log = logging.getLogger("unimq.store")

ID_VERSION = "02"  # server-assigned ids: version + store id (16 hex) + commitlog offset (16 hex)
MAX_SCAN = 4096
PUT_OK = PutStatus.PUT_OK
_new_tuple = tuple.__new__  # builds PutResult without NamedTuple's Python-level __new__
_encode = record.encode
_encode_head = record.encode_head
_encode_dispatch = record.encode_dispatch
_cq_pack = CQ_ENTRY.pack_into  # consume-queue entries one filtered get may skip before answering
# For the put paths' inlined copies of record.encode's fast path (bare messages).
_cq_entry = CQ_ENTRY.pack
_pack_fixed = record.FIXED.pack
_pack_prefix = record.PREFIX.pack
_crc32c = record.crc32c
_MAGIC = record.MAGIC_MESSAGE
_HEADER_SIZE = record.HEADER_SIZE
_NOT_LINK = ~record.FLAG_LINK  # a put never stores the link bit (see record.encode)
_time = time.time
_get_running_loop = asyncio.get_running_loop
_future_done = asyncio.Future.done  # the C methods: map() calls them without a bound method per future
_future_set_result = asyncio.Future.set_result
_is_done = operator.methodcaller("done")  # any other loop's futures


def _any_done(futs: list[asyncio.Future]) -> bool:
    try:
        return any(map(_future_done, futs))
    except TypeError:  # a loop whose futures are not asyncio.Future
        return any(map(_is_done, futs))


# Commitlog warm-up (sync flush): keep this many bytes of written zeros ahead of the writer,
# zero-filled in pieces of this size, one fdatasync each (see CommitLog.warm_step).
WARM_LEAD = 16 << 20
WARM_PIECE = 1 << 20
# Server-assigned message ids end in the commitlog offset as 16 hex digits. "%016X" costs
# about as much as encoding the record's header, so the put paths format the top 12 digits
# once per 64 KiB of log and look the last 4 up: "%012X" % (pos >> 16) + _HEX4[pos & 0xFFFF]
# is "%016X" % pos. 65,536 four-character strings (about 4 MB), built at import in C.
_HEX4: tuple[str, ...] = tuple(struct.pack(">65536H", *range(65536)).hex(" ", 2).upper().split())
# A bare message's header (no tag, keys, properties, ids or extra queues) with the zero
# length fields as pad bytes and topic + protocol as one field: one pack, no concatenation.
# Fields: flags, queue id, queue offset, phys offset, born, store, delivery, origin (-1),
# reconsume times, topic length, protocol length, body length, topic + protocol.
_BARE_HEADS: dict[int, Callable[..., bytes]] = {}  # by len(topic + protocol): few distinct values


def _bare_head(n: int) -> Callable[..., bytes]:
    pack = _BARE_HEADS.get(n)
    if pack is None:
        st = struct.Struct(f"<Iiqqqqqq4xiH8xH12xI{n}s")
        assert st.size == _HEADER_SIZE - 12 + n
        pack = _BARE_HEADS[n] = st.pack
    return pack


_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


class _PutGroup:
    """Sync-mode put_async calls queued on one loop, written together (see MessageStore.put_async)."""

    __slots__ = ("msgs", "futs")

    def __init__(self) -> None:
        self.msgs: list[Message] = []
        self.futs: list[asyncio.Future] = []


class MessageFilter(Protocol):
    """What ``get`` needs of a compiled consumer filter (see ``core_broker.filter``)."""

    tag_hashes: frozenset[int] | None
    matches_all: bool

    def matches(self, tag: str | None, properties: dict[str, str]) -> bool: ...


def tag_hash(tag: str | None) -> int:
    from .filter import tag_hash as _th  # one definition shared with the filter compiler

    return _th(tag) if tag else 0


class MessageStore:
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
        self._cqs: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()
        self._tag_hashes: dict[str, int] = {}
        self._bare_shapes: dict[tuple[str, str], tuple[bytes, int, int, Callable[..., bytes]]] = {}
        self._idx_pending: list[tuple[str, int, int]] = []  # (key, phys, ts) of a batch's unwritten records
        self.store_id = ""
        self._id_prefix = ""
        self._running = False
        self._refuse_puts = False
        self._sync = config.flush == FlushMode.SYNC
        self._max_size = config.max_message_size
        self._flush: FlushService | None = None
        # When a put may be acknowledged (local flush, and replicas once a group's master).
        self.durability = DurabilityPolicy(self._sync, self._flush_future)
        self._put_queues: dict[asyncio.AbstractEventLoop, _PutGroup] = {}  # sync-mode put_async groups per loop
        self._housekeeping: threading.Thread | None = None
        self._hk_stop = threading.Event()
        self.recovered_abnormally = False

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open the store; after a crash, find the last valid record and rebuild indexes."""
        root = self.root
        root.mkdir(parents=True, exist_ok=True)
        id_path = root / "store_id"
        if id_path.exists():
            self.store_id = id_path.read_text().strip()
        else:
            self.store_id = secrets.token_hex(8).upper()
            id_path.write_text(self.store_id)
        self._id_prefix = ID_VERSION + self.store_id
        self._id_hi = self._id_prefix.replace("%", "%%") + "%012X"  # server-assigned ids: see _HEX4
        self._id_key = -1
        self._id_head = ""
        self.topics.load()
        self.offsets.load()
        self.commitlog.load()
        self.index.load()
        self._load_consume_queues()
        cut = log_copy.resume_truncation(self)  # before recovery: never serve bytes being cut
        if cut is not None:
            log.warning("finished a truncation a crash interrupted: the log ends at %d at most", cut)
        self._recover()
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
        self._running = True
        self._hk_stop.clear()
        self._housekeeping = threading.Thread(target=self._housekeeping_loop, name="unimq-housekeeping", daemon=True)
        self._housekeeping.start()

    def shutdown(self) -> None:
        """Flush everything, write a clean checkpoint, remove the abort marker."""
        if not self._running:
            return
        with self._lock:
            self._running = False
        self._hk_stop.set()
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
        self.index.close()

    @property
    def running(self) -> bool:
        return self._running

    def _load_consume_queues(self) -> None:
        if not self._cq_root.exists():
            return
        for tdir in self._cq_root.iterdir():
            if not tdir.is_dir():
                continue
            topic = unsafe(tdir.name)
            for qdir in tdir.iterdir():
                if qdir.name.isdigit():
                    cq = ConsumeQueue(self._cq_root, topic, int(qdir.name), self.config.cq_entries_per_file)
                    cq.load()
                    self._cqs[(topic, int(qdir.name))] = cq

    def _recover(self) -> None:
        cp = read_json(self.checkpoint_path, {})
        crashed = self.abort_marker_path.exists() or "clean_end" not in cp
        first = self.commitlog.first_record_offset()
        if not self.commitlog.files.files:
            self.commitlog.set_write_pos(int(cp.get("clean_end", cp.get("safe", 0))) if not crashed else 0)
            return
        # Consume queues lost (deleted by hand, restored from a backup without them):
        # rebuild them from the commitlog even after a clean stop.
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
        self._cq(h.topic, h.queue_id).put(h.queue_offset, h.phys_offset, h.size, th)
        for topic, qid, qo in h.dispatch:
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
        self.index.sync()

    def _checkpoint(self, safe: int) -> None:
        """Everything below ``safe`` is in the commitlog and dispatched; make that durable."""
        safe = min(safe, self.commitlog.write_pos)  # a truncation may have cut the log meanwhile
        self._sync_indexes()
        write_json_atomic(self.checkpoint_path, {"safe": safe, "ts": int(time.time() * 1000)})

    # ------------------------------------------------------------------ write path

    def _cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self._cqs.get(key)
        if cq is None:
            cq = ConsumeQueue(self._cq_root, topic, queue_id, self.config.cq_entries_per_file)
            self._cqs[key] = cq
        return cq

    def _bare_shape(self, topic: str, proto: str) -> tuple[bytes, int, int, Callable[..., bytes]]:
        """(topic + protocol bytes, their lengths, header pack) of bare records of a topic/protocol.

        Cached for the single put path (encoding two strings and concatenating them cost
        more than the lookup); bounded, since topics are the clients'.
        """
        tb, pb = topic.encode(), proto.encode()
        shape = (tb + pb, len(tb), len(pb), _bare_head(len(tb) + len(pb)))
        if len(self._bare_shapes) >= 4096:
            self._bare_shapes.clear()
        self._bare_shapes[(topic, proto)] = shape
        return shape

    def _tag_hash(self, tag: str | None) -> int:
        if not tag:
            return 0
        h = self._tag_hashes.get(tag)
        if h is None:
            h = tag_hash(tag)
            if len(self._tag_hashes) < 100_000:
                self._tag_hashes[tag] = h
        return h

    @staticmethod
    def _dispatch_ok(msg: Message, extra: tuple) -> bool:
        """Each queue at most once: the primary and every extra target distinct."""
        if len(extra) == 1:
            t = extra[0]
            return t[1] != msg.queue_id or t[0] != msg.topic
        return len(set(extra)) == len(extra) and (msg.topic, msg.queue_id) not in extra

    def _put_locked(self, msg: Message, now: int) -> PutResult:
        """Append one message and dispatch it. Caller holds ``_lock``.

        Written flat on purpose: this is the hottest function of the broker, and
        every attribute lookup and call here costs measurable throughput. A bare
        message (no tag, keys, properties, ids or extra queues: the common case)
        is encoded inline by record.encode's fast path, the same bytes.
        """
        if not self._running:
            raise StoreClosedError("the store is not running")
        if self._refuse_puts:
            raise StoreFullError("the data disk is nearly full; puts are refused until space is freed")
        body = msg.body
        if len(body) > self._max_size:
            raise MessageTooLargeError(
                f"message body of {len(body)} bytes exceeds the limit of {self.config.max_message_size}"
            )
        topic = msg.topic
        cq = self._cqs.get((topic, msg.queue_id)) or self._cq(topic, msg.queue_id)
        qo = cq.max_offset
        if qo >= cq.limit or cq._cur is None:
            cq.ensure(qo)  # may raise StoreFullError before anything is written
        cl = self.commitlog
        if not (msg.extra_dispatch or msg.keys or msg.message_id or msg.tag or msg.message_group
                or msg.properties or msg.born_host):
            proto = msg.protocol
            shape = self._bare_shapes.get((topic, proto))
            if shape is None:
                shape = self._bare_shape(topic, proto)
            tp, lt, lp, head_pack = shape
            bl = len(body)
            size = _HEADER_SIZE + len(tp) + bl
            pos = cl.write_pos
            if pos + size > cl.limit:  # segment end, or a warm-up claim (see CommitLog.make_room)
                if size > cl.segment_size:
                    raise MessageTooLargeError(f"a record of {size} bytes does not fit a commitlog segment")
                pos = cl.make_room(size)
            cur = cl.current
            tail = head_pack(
                msg.flags & _NOT_LINK, msg.queue_id, qo, pos, msg.born_timestamp_ms or now, now, msg.delivery_time_ms, -1,
                msg.reconsume_times, lt, lp, bl, tp,
            ) + body
            off = pos - cur.base  # type: ignore[union-attr]
            cur.mm[off : off + size] = _pack_prefix(size, _MAGIC, _crc32c(tail)) + tail  # type: ignore[union-attr]
            cur.dirty = True  # type: ignore[union-attr]
            cl.write_pos = pos + size
            cqf = cq._cur  # ensured above: qo falls in this file
            _cq_pack(cqf.mm, qo * 20 - cqf.base, pos, size, 0)
            cqf.dirty = True
            cq.max_offset = qo + 1
            if pos >> 16 != self._id_key:  # see _HEX4
                self._id_key = pos >> 16
                self._id_head = self._id_hi % self._id_key
            return _new_tuple(PutResult, (PUT_OK, self._id_head + _HEX4[pos & 0xFFFF], msg.queue_id, qo, pos, size, ()))
        extra = msg.extra_dispatch
        dispatch = b""
        extra_offsets: tuple[int, ...] = ()
        if extra:
            if not self._dispatch_ok(msg, extra):
                raise BadRequestError("a message is dispatched into each queue at most once")
            get = self._cqs.get
            cqs = [get(t) or self._cq(t[0], t[1]) for t in extra]
            extra_offsets = tuple([c.max_offset for c in cqs])
            for c, o in zip(cqs, extra_offsets):
                if o >= c.limit or c._cur is None:
                    c.ensure(o)
            dispatch = _encode_dispatch(extra, extra_offsets)
        if msg.keys or msg.message_id:  # a new index file may be needed: make it before writing
            self.index.reserve(len(msg.keys) + (1 if msg.message_id else 0))
        pos = cl.write_pos
        head = _encode_head(msg, qo, pos, now, dispatch)
        hl = len(head)
        size = hl + len(body)
        if pos + size > cl.limit:
            if size > cl.segment_size:  # huge properties: no segment can hold the record
                raise MessageTooLargeError(f"a record of {size} bytes does not fit a commitlog segment")
            new_pos = cl.make_room(size)
            if new_pos != pos:
                pos = new_pos
                head = _encode_head(msg, qo, pos, now, dispatch)
        cur = cl.current
        off = pos - cur.base  # type: ignore[union-attr]
        mm = cur.mm  # type: ignore[union-attr]
        mm[off : off + hl] = head  # head and body stored apart: the body is never copied twice
        mm[off + hl : off + size] = body
        cur.dirty = True  # type: ignore[union-attr]
        cl.write_pos = pos + size
        tag = msg.tag
        th = (self._tag_hashes.get(tag) or self._tag_hash(tag)) if tag else 0
        cqf = cq._cur  # ensured above: qo falls in this file
        _cq_pack(cqf.mm, qo * 20 - cqf.base, pos, size, th)
        cqf.dirty = True
        cq.max_offset = qo + 1
        if extra:
            for c, o in zip(cqs, extra_offsets):
                c.put(o, pos, size, th)
        mid = msg.message_id
        if mid:
            self.index.put("#id#" + mid, pos, now)
        else:
            if pos >> 16 != self._id_key:
                self._id_key = pos >> 16
                self._id_head = self._id_hi % self._id_key
            mid = self._id_head + _HEX4[pos & 0xFFFF]
        if msg.keys:
            topic = msg.topic
            for k in msg.keys:
                self.index.put(f"{topic}#{k}", pos, now)
        return _new_tuple(PutResult, (PUT_OK, mid, msg.queue_id, qo, pos, size, extra_offsets))

    def put(self, msg: Message) -> PutResult:
        """Store one message; in sync flush mode, return only once it is on disk."""
        now = int(_time() * 1000)
        lock = self._lock
        lock.acquire()
        try:
            r = self._put_locked(msg, now)
        finally:
            lock.release()
        if self._sync:
            return self._await_flush_blocking(r)
        return r

    def _put_batch_locked(
        self, msgs: Sequence[Message], now: int, results: list[PutResult] | None = None
    ) -> list[PutResult]:
        """Append a batch with one write into the segment; falls back per message when needed.

        Messages with extra dispatch targets, keys or client ids take the single path
        (they touch more indexes). The others are encoded back to back (plain ones by
        the codec's fast path inlined here: one struct pack, the CRC chained over the
        body, which is never copied before the write), written with one ``pwritev``
        into the segment file, and their consume-queue entries copied in once per
        queue. ``pwritev`` rather than a copy into the mapping because the first
        write into a page of a fresh segment through the mapping costs a page fault,
        several times what write(2) costs for the same bytes (see bench/RESULTS.md).
        Nothing is written before every queue file the batch needs exists, so a
        full disk refuses the batch without storing half of it.

        Tried and not kept: encoding a uniform batch of bare messages column-wise
        (one template head per record, the differing fields written through strided
        memoryview casts, C-level ``map`` for CRCs, ids and results). Under
        cachegrind it cost 16.4k instructions per 1 KiB message against this loop's
        16.9k: the per-record objects (a memoryview slice per CRC and per iovec, the
        id string, the result tuple) cost as much as the packs they replace.
        """
        if not self._running:
            raise StoreClosedError("the store is not running")
        if self._refuse_puts:
            raise StoreFullError("the data disk is nearly full; puts are refused until space is freed")
        if results is None:  # a caller's list keeps the results made before an exception
            results = []
        add = results.append
        cl = self.commitlog
        limit = self._max_size
        idhi = self._id_hi  # see _HEX4
        hex4 = _HEX4
        id_key = -1
        id_head = ""
        pending: list[bytes] = []  # encoded records not yet written (bare: prefix, head, body; else head, body)
        runs: dict[tuple[str, int], list] = {}  # (topic, queue) -> [cq, first queue offset, entries]
        start = pos = cl.write_pos
        cur = cl.current
        end = cl.limit  # the segment's end or a warm-up claim: no claim starts while we hold the lock
        last_topic = last_proto = None
        last_qid = 0
        run: list = []
        cq = ents = tp = head_pack = None
        lt = lp = hsz = 0
        idx = self._idx_pending  # index entries of pending records, put once they are written
        try:
            for m in msgs:
                body = m.body
                extra = m.extra_dispatch
                if len(body) > limit or (extra and not self._dispatch_ok(m, extra)):
                    # The single path raises the error, after the pending records are written.
                    if pending:
                        self._write_pending(cur, start, pos, pending, runs)
                    runs.clear()
                    last_topic = None
                    add(self._put_locked(m, now))
                    start = pos = cl.write_pos
                    cur = cl.current
                    end = cl.limit
                    continue
                topic = m.topic
                qid = m.queue_id
                proto = m.protocol
                if topic != last_topic or qid != last_qid or proto != last_proto:
                    key = (topic, qid)
                    run = runs.get(key)  # type: ignore[assignment]
                    if run is None:
                        cq = self._cqs.get(key) or self._cq(topic, qid)
                        run = runs[key] = [cq, cq.max_offset, []]
                    cq, ents = run[0], run[2]
                    tb = topic.encode()
                    pb = proto.encode()
                    tp, lt, lp = tb + pb, len(tb), len(pb)
                    hsz = _HEADER_SIZE + lt + lp
                    head_pack = _bare_head(lt + lp)
                    last_topic, last_qid, last_proto = topic, qid, proto
                qo = run[1] + len(ents)  # type: ignore[arg-type]
                if qo >= cq.limit:  # type: ignore[union-attr]
                    cq.ensure(qo)  # type: ignore[union-attr]  # may raise StoreFullError: nothing written yet
                tag = m.tag
                mid = m.message_id
                keys = m.keys
                if extra or tag or mid or keys or m.properties or m.message_group or m.born_host:
                    # Door traffic (properties, LMQ dispatch, keys): record.encode_head writes
                    # every field; the body is chained into the CRC, never copied before pwritev.
                    if extra:
                        xruns = []
                        xo = []
                        for t in extra:
                            xr = runs.get(t)
                            if xr is None:
                                xcq = self._cqs.get(t) or self._cq(t[0], t[1])
                                xr = runs[t] = [xcq, xcq.max_offset, []]
                            o = xr[1] + len(xr[2])
                            if o >= xr[0].limit:
                                xr[0].ensure(o)  # may raise StoreFullError: this record is not written yet
                            xruns.append(xr)
                            xo.append(o)
                        xo = tuple(xo)
                        dispatch = _encode_dispatch(extra, xo)
                    else:
                        xo = ()
                        dispatch = b""
                    if mid or keys:  # a new index file may be needed: make it before writing
                        nidx = len(keys) + (1 if mid else 0)
                        self.index.reserve(len(idx) + nidx)
                    head = _encode_head(m, qo, pos, now, dispatch)
                    size = len(head) + len(body)
                    if pos + size > end:
                        pos, cur, end = self._roll_batch(cur, start, pos, pending, runs, size)
                        start = pos
                        head = _encode_head(m, qo, pos, now, dispatch)
                    pending += (head, body)
                    th = (self._tag_hashes.get(tag) or self._tag_hash(tag)) if tag else 0
                    if extra:
                        e = _cq_entry(pos, size, th)
                        ents.append(e)  # type: ignore[union-attr]
                        for xr in xruns:
                            xr[2].append(e)
                    else:
                        ents.append(_cq_entry(pos, size, th))  # type: ignore[union-attr]
                    if mid:
                        idx.append(("#id#" + mid, pos, now))
                    else:
                        if pos >> 16 != id_key:
                            id_key = pos >> 16
                            id_head = idhi % id_key
                        mid = id_head + hex4[pos & 0xFFFF]
                    if keys:
                        for k in keys:
                            idx.append((f"{topic}#{k}", pos, now))
                    add(_new_tuple(PutResult, (PUT_OK, mid, qid, qo, pos, size, xo)))
                    pos += size
                    continue
                # record.encode's fast path for a bare message, inlined (same bytes): the
                # prefix, the header and the body go to pwritev as three pieces (two when
                # the body is small enough to copy after the header).
                bl = len(body)
                size = hsz + bl
                if pos + size > end:
                    pos, cur, end = self._roll_batch(cur, start, pos, pending, runs, size)
                    start = pos
                head = head_pack(  # type: ignore[misc]
                    m.flags & _NOT_LINK, qid, qo, pos, m.born_timestamp_ms or now, now, m.delivery_time_ms, -1,
                    m.reconsume_times, lt, lp, bl, tp,
                )
                if bl <= 256:  # small: one CRC call over a copy costs less than a chained second call
                    head += body
                    pending += (_pack_prefix(size, _MAGIC, _crc32c(head)), head)
                else:
                    pending += (_pack_prefix(size, _MAGIC, _crc32c(body, _crc32c(head))), head, body)
                ents.append(_cq_entry(pos, size, 0))  # type: ignore[union-attr]
                if pos >> 16 != id_key:
                    id_key = pos >> 16
                    id_head = idhi % id_key
                add(_new_tuple(PutResult, (PUT_OK, id_head + hex4[pos & 0xFFFF], qid, qo, pos, size, ())))
                pos += size
            if pending:
                self._write_pending(cur, start, pos, pending, runs)
        except BaseException:
            idx.clear()  # their records were not written
            # Nothing of the unwritten tail is visible; point each queue back at the file
            # holding its next offset (ensure() may have moved it to a file ahead).
            for r in runs.values():
                try:
                    r[0].ensure(r[0].max_offset)
                except Exception:
                    pass
            raise
        return results

    def _roll_batch(self, cur, start: int, pos: int, pending: list, runs: dict, size: int):
        """Write what a batch has pending, then make room for a ``size``-byte record.

        Room is the rest of the segment once a warm-up claim in the way is done, or
        the next segment (see ``CommitLog.make_room``).
        """
        if pending:
            self._write_pending(cur, start, pos, pending, runs)
        cl = self.commitlog
        if size > cl.segment_size:
            raise MessageTooLargeError(f"a record of {size} bytes does not fit a commitlog segment")
        pos = cl.make_room(size)
        return pos, cl.current, cl.limit

    def _write_pending(self, cur, start: int, end: int, pending: list, runs: dict) -> None:
        """Write a batch's records [start, end) into segment ``cur``, then their queue entries."""
        off = start - cur.base
        total = end - start
        try:
            i = 0
            while i < len(pending):  # IOV_MAX pieces per pwritev
                chunk = pending[i : i + _IOV_MAX] if i or len(pending) > _IOV_MAX else pending
                want = sum(map(len, chunk)) if chunk is not pending else total
                done = os.pwritev(cur.fd, chunk, off)
                if done != want:  # a short write: copy the rest through the mapping
                    data = b"".join(chunk)
                    cur.mm[off + done : off + want] = data[done:]
                off += want
                i += _IOV_MAX
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreFullError("no space left on the data disk") from e
            raise
        cur.dirty = True
        self.commitlog.write_pos = end
        pending.clear()
        idx = self._idx_pending
        if idx:
            put = self.index.put
            for key, phys, ts in idx:
                put(key, phys, ts)
            idx.clear()
        for run in runs.values():
            ents = run[2]
            n = len(ents)
            if not n:
                continue
            cq, first = run[0], run[1]
            f = cq._cur
            p = first * 20
            if f is not None and f.base <= p and p + 20 * n <= f.base + f.size:
                o = p - f.base
                f.mm[o : o + 20 * n] = ents[0] if n == 1 else b"".join(ents)
                f.dirty = True
            else:  # the entries span two queue files
                for i, e in enumerate(ents):
                    cq.ensure(first + i)
                    f = cq._cur
                    o = (first + i) * 20 - f.base
                    f.mm[o : o + 20] = e
                    f.dirty = True
            if first + n > cq.max_offset:
                cq.max_offset = first + n
            run[1] = first + n
            ents.clear()

    def put_batch(self, msgs: Sequence[Message]) -> list[PutResult]:
        """Store many messages under one lock acquisition and one flush wait."""
        now = int(time.time() * 1000)
        with self._lock:
            results = self._put_batch_locked(msgs, now)
        if self._sync and results:
            last = results[-1]
            if not self._flush.wait(last.commitlog_offset + last.store_size):  # type: ignore[union-attr]
                return [r._replace(status=PutStatus.FLUSH_DISK_TIMEOUT) for r in results]
        return results

    async def put_async(self, msg: Message) -> PutResult:
        """Event-loop variant: the write is a memcpy; in sync mode await the group commit.

        In sync mode the write is deferred to one callback that writes every
        put_async queued on this loop meanwhile (:meth:`_drain_puts`) through the
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
                return self._put_locked(msg, now)
        loop = _get_running_loop()
        fut = loop.create_future()
        q = self._put_queues.get(loop)
        if q is None:
            q = self._put_queues[loop] = _PutGroup()
            loop.call_soon(self._drain_puts, loop)
        q.msgs.append(msg)
        q.futs.append(fut)
        return await fut

    def _drain_puts(self, loop: asyncio.AbstractEventLoop) -> None:
        """Write the put_async group queued on ``loop`` (sync mode); settle it after one flush."""
        q = self._put_queues.pop(loop, None)
        if q is None:
            return
        msgs, futs = q.msgs, q.futs
        if _any_done(futs):  # a writer was cancelled before its put was written: leave it out
            keep = [i for i, f in enumerate(futs) if not f.done()]
            msgs = [msgs[i] for i in keep]
            futs = [futs[i] for i in keep]
        out: list[PutResult] = []
        now = int(_time() * 1000)
        try:
            with self._lock:
                try:
                    self._put_batch_locked(msgs, now, out)
                except Exception:
                    # Keep what reached the log (below write_pos), then put the rest one by
                    # one, so an error is only the failing message's (or each, if the store's).
                    end = self.commitlog.write_pos
                    k = 0
                    while k < len(out) and out[k].commitlog_offset < end:
                        k += 1
                    del out[k:]
                    written = futs[:k]
                    for msg, fut in zip(msgs[k:], futs[k:]):
                        try:
                            out.append(self._put_locked(msg, now))
                            written.append(fut)
                        except Exception as e:
                            fut.set_exception(e)
                    futs = written
            if out:
                r = out[-1]  # written in order under one lock: the last one ends the group
                self._flush.notify(  # type: ignore[union-attr]
                    r.commitlog_offset + r.store_size, loop, lambda exc: self._settle_puts(futs, out, exc)
                )
        except BaseException as e:
            for fut in q.futs:
                if not fut.done():
                    fut.set_exception(e)
            raise

    @staticmethod
    def _settle_puts(futs: list[asyncio.Future], results: list[PutResult], exc: BaseException | None) -> None:
        if exc is None:
            try:  # every writer still waiting: the common case, without a done() call per future
                deque(map(_future_set_result, futs, results), 0)
                return
            except (TypeError, asyncio.InvalidStateError):  # another loop's futures; a cancelled writer
                pass
            for fut, r in zip(futs, results):
                if not fut.done():  # its writer was cancelled after the write
                    fut.set_result(r)
        else:
            for fut in futs:
                if not fut.done():
                    fut.set_exception(exc)

    async def put_batch_async(self, msgs: Sequence[Message]) -> list[PutResult]:
        now = int(time.time() * 1000)
        with self._lock:
            results = self._put_batch_locked(msgs, now)
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
        origin = self.commitlog.read(origin_offset)
        merged: dict[str, str] = {}
        lo, _ = self.commitlog.link_origin(origin_offset)
        if lo >= 0:  # never chain links: point at the real message, keep the link's properties
            merged.update(origin.properties)
            origin_offset = lo
            origin = self.commitlog.read(lo)
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
            if not self._running:
                raise StoreClosedError("the store is not running")
            cq = self._cq(topic, queue_id)
            qo = cq.max_offset
            cq.ensure(qo)
            targets = [DispatchTarget(t, q) for t, q in extra_dispatch]
            cqs = [self._cq(t, q) for t, q in targets]
            extra_offsets = tuple(c.max_offset for c in cqs)
            for c, o in zip(cqs, extra_offsets):
                c.ensure(o)
            dispatch = record.encode_dispatch(targets, extra_offsets) if targets else b""
            cl = self.commitlog
            pos = cl.write_pos
            data = record.encode(link, qo, pos, now, dispatch, origin_offset, origin.store_size)
            if not cl.fits(len(data)):
                if len(data) > cl.segment_size:
                    raise MessageTooLargeError(f"a record of {len(data)} bytes does not fit a commitlog segment")
                new_pos = cl.make_room(len(data))
                if new_pos != pos:
                    pos = new_pos
                    data = record.encode(link, qo, pos, now, dispatch, origin_offset, origin.store_size)
            cl.write(data)
            th = self._tag_hash(origin.tag)
            cq.put(qo, pos, len(data), th)
            for c, o in zip(cqs, extra_offsets):
                c.put(o, pos, len(data), th)
        mid = origin.message_id or f"{self._id_prefix}{origin_offset:016X}"
        r = PutResult(PutStatus.PUT_OK, mid, queue_id, qo, pos, len(data), extra_offsets)
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

    def adopt_store_id(self, store_id: str) -> None:
        """Take a group master's store id: server message ids encode it with the record's
        offset, and a replica holds the same records at the same offsets, so after a
        failover the ids clients were given still find their messages."""
        if store_id == self.store_id:
            return
        (self.root / "store_id").write_text(store_id)
        self.store_id = store_id
        self._id_prefix = ID_VERSION + store_id
        self._id_hi = self._id_prefix.replace("%", "%%") + "%012X"
        self._id_key = -1
        self._id_head = ""

    def put_batch_nowait(self, msgs: Sequence[Message]) -> list[PutResult]:
        """Batch write without waiting for the flush; pair with :meth:`wait_durable`."""
        now = int(time.time() * 1000)
        with self._lock:
            return self._put_batch_locked(msgs, now)

    def put_nowait(self, msg: Message) -> PutResult:
        """Write without waiting for the flush; pair with :meth:`wait_durable`."""
        now = int(time.time() * 1000)
        with self._lock:
            return self._put_locked(msg, now)

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
                origin.message_id = f"{self._id_prefix}{lo:016X}"
            origin.flags |= record.FLAG_LINK
            return origin
        if not m.message_id:
            m.message_id = f"{self._id_prefix}{phys:016X}"
        return m

    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        msg_filter: MessageFilter | None = None,
    ) -> GetResult:
        """Up to ``max_count`` messages from ``offset`` of one queue, filtered server-side.

        Reads are memory copies out of the page cache; a cold page may fault to
        disk, which is why the gateway's pull path may run this on a thread.
        """
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
        entries = cq.get(offset, scan)
        out: list[StoredMessage] = []
        next_off = offset
        materialize = self._materialize
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
            m.topic = topic
            m.queue_id = queue_id
            m.queue_offset = q
            out.append(m)
            if len(out) >= max_count:
                break
        status = GetStatus.FOUND if out else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, out, next_off, lo, hi)

    def get_raw(
        self, topic: str, queue_id: int, offset: int, max_count: int, max_span: int = 32 << 20
    ) -> tuple[bytes, memoryview, int, str, int, int] | None:
        """Queue offsets ``[offset, offset+n)`` of one queue as undecoded bytes, for bulk readers.

        For columnar readers such as the HTTP door's Arrow pages: decoding message by message in
        Python is what bounds a pull, so this does no per-message work at all. Answers
        ``(entries, span, span_base, id_prefix, queue_min, queue_max)``: ``entries`` holds the n
        consume-queue entries (``consume_queue.ENTRY``: commitlog offset, size, tag hash) and
        ``span`` a read-only view of the mapped commitlog from the first record to the end of the
        last (so it also holds other queues' records in between), starting at commitlog offset
        ``span_base``: no copy, so use it within the call and drop it (a segment retention
        unmaps meanwhile stays mapped while a view exists; the bytes below the write position
        never change). n is cut so the span stays in one segment and under ``max_span`` bytes.
        None when :meth:`get` must be used: offset not in ``[min, max)``, data gone to retention.
        """
        cq = self._cqs.get((topic, queue_id))
        if cq is None or not cq.min_offset <= offset < cq.max_offset:
            return None
        esize = CQ_ENTRY.size
        unpack = CQ_ENTRY.unpack_from
        try:
            mf = cq.files.find(offset * esize)
            if mf is None:
                return None
            pos = offset * esize - mf.base
            stop = min((min(offset + max_count, cq.max_offset)) * esize - mf.base, mf.size)
            entries = mf.mm[pos:stop]
            n = len(entries) // esize
            if n == 0:
                return None
            first = unpack(entries, 0)[0]
            seg = self.commitlog.files.find(first)
            if seg is None:
                return None
            limit = min(seg.base + seg.size, self.commitlog.write_pos, first + max_span)

            def fits(i: int) -> bool:
                phys, size, _ = unpack(entries, i * esize)
                return first <= phys and phys + size <= limit

            if not fits(n - 1):  # keep the longest prefix whose records lie in the span (offsets grow)
                lo, hi = 0, n - 1
                if not fits(0):
                    return None
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if fits(mid):
                        lo = mid
                    else:
                        hi = mid - 1
                n = lo + 1
                entries = entries[: n * esize]
            last, last_size, _ = unpack(entries, (n - 1) * esize)
            span = memoryview(seg.mm)[first - seg.base : last + last_size - seg.base].toreadonly()
        except (ValueError, CorruptRecordError):  # a segment unmapped by retention meanwhile
            return None
        if self.commitlog.min_offset > first:  # retention moved past it meanwhile
            return None
        return entries, span, first, self._id_prefix, cq.min_offset, cq.max_offset

    def read_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        """The message at one queue offset, or None if it is gone or not there yet."""
        cq = self._cqs.get((topic, queue_id))
        if cq is None:
            return None
        e = cq.entry(offset)
        if e is None or e[0] < self.commitlog.min_offset:
            return None
        try:
            m = self._materialize(e[0])
        except (CorruptRecordError, ValueError):
            return None
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
        return cq.min_offset if cq else 0

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
        if len(message_id) == 34 and message_id.startswith(self._id_prefix):
            try:
                phys = int(message_id[18:], 16)
                if phys >= self.commitlog.min_offset:
                    m = self._materialize(phys)
                    if m.message_id == message_id:
                        return m
            except (ValueError, CorruptRecordError):
                return None
            return None
        for phys in self.index.query("#id#" + message_id, 0, 2**62, 16):
            if phys < self.commitlog.min_offset:
                continue
            try:
                m = self._materialize(phys)
            except (ValueError, CorruptRecordError):
                continue
            if m.message_id == message_id:
                return m
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

    def delete_topic_queues(self, topic: str) -> None:
        """Remove a topic's consume queues (its records age out with their segments)."""
        with self._lock:
            for key in [k for k in self._cqs if k[0] == topic]:
                self._cqs.pop(key).destroy()
        shutil.rmtree(self._cq_root / ConsumeQueueDir.name_of(topic), ignore_errors=True)
        self.offsets.delete_topic(topic)

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
        self._refuse_puts = free < self.config.disk_refuse_free_ratio
        low = free < self.config.disk_min_free_ratio
        horizon = now - self.config.retention_hours * 3600
        files = self.commitlog.files.files
        n = 0
        for mf in files[:-1]:  # never the segment being written
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
            self.index.drop_before_phys(new_min)
        log.info("retention removed %d commitlog segment(s); log now starts at %d", n, new_min)
        return n


class ConsumeQueueDir:
    """Directory naming of consume queues (shared with ConsumeQueue)."""

    @staticmethod
    def name_of(topic: str) -> str:
        from .consume_queue import _safe

        return _safe(topic)


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
