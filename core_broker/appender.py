"""The appender: the one place records are encoded, written and dispatched.

Every write of a message into the store goes through :class:`Appender`, under
the store's write lock: a door's message (:meth:`Appender.append_one`), a
batch (:meth:`Appender.append_batch`), a link record (:meth:`Appender.append_link`:
a later dispatch of an already stored body, for delay, commit and retry).
Replicated bytes enter below it (``core_broker.log_copy``): they are records
already encoded by the master's appender. What it gives back is a
:class:`PutResult`; *when* that result may be acknowledged is not its concern
but :class:`core_broker.durability.DurabilityPolicy`'s.

The record layout is ``core_broker.record``'s alone: the bare-message header
(the common case: no tag, keys, properties, ids or extra queues) is packed with
``record.bare_head_packer``, the same struct ``record.encode`` uses, and every
other record with ``record.encode_head``; ``tests/test_appender.py`` checks each
path's bytes against ``record.encode``. Bytes reach the segment through
``CommitLog`` and queue entries through ``ConsumeQueue``; this module never
touches a mapping or a file itself.

Why two loops rather than a single put being a batch of one: measured on the
2-core machine, a batch of one through the batch loop stored 200k bare 100 B
messages/s against 285k/s through the record-at-a-time loop, and 175k/s
against 245k/s for messages with properties (the doors' traffic): the batch
loop's per-call set-up (per-queue runs, pending pieces, the deferred index
entries) is a third of a small put's cost. Both loops are here, side by side,
sharing the encoder, the id scheme and the queue and log writers; the batch
loop falls back to :meth:`append_one` for a message it cannot take.

Server-assigned message ids end in the commitlog offset as 16 hex digits.
``"%016X"`` costs about as much as encoding the record's header, so the loops
format the top 12 digits once per 64 KiB of log and look the last 4 up in
:data:`_HEX4` (65,536 four-character strings, about 4 MB, built at import in C).
"""

from __future__ import annotations

import os
import struct
from typing import Callable, Sequence

from . import record
from .batch_queue import BatchConsumeQueue
from .commitlog import CommitLog
from .consume_queue import ENTRY as CQ_ENTRY, ConsumeQueue
from .errors import BadRequestError, MessageTooLargeError, StoreClosedError, StoreFullError
from .index_file import IndexService
from .model import DispatchTarget, Message, PutResult, PutStatus, StoredMessage

ID_VERSION = "02"  # server-assigned ids: version + store id (16 hex) + commitlog offset (16 hex)
PUT_OK = PutStatus.PUT_OK
_new_tuple = tuple.__new__  # builds PutResult without NamedTuple's Python-level __new__
_encode_head = record.encode_head
_encode_dispatch = record.encode_dispatch
_cq_entry = CQ_ENTRY.pack
_pack_prefix = record.PREFIX.pack
_crc32c = record.crc32c
_MAGIC = record.MAGIC_MESSAGE
_HEADER_SIZE = record.HEADER_SIZE
_NOT_LINK = ~record.FLAG_LINK  # a put never stores the link bit (see record.encode)
# A bare message (no properties) is never a batch record: a batch carries its count as a property.
_BARE_FLAGS = ~(record.FLAG_LINK | record.FLAG_BATCH)
_FLAG_BATCH = record.FLAG_BATCH
_bare_head = record.bare_head_packer
_door_head = record.door_head
_NO_PACK = struct.Struct("").pack  # (no template yet)
_DISPATCH_SIZE = record.DISPATCH_ENTRY_SIZE
_encode_properties = record.encode_properties
_HEX4: tuple[str, ...] = tuple(struct.pack(">65536H", *range(65536)).hex(" ", 2).upper().split())


def _load_native() -> Callable[..., tuple[int, int]] | None:
    """The compiled encoder of runs of plain records (core_broker/_recordc.c, built by
    ``pip install`` when a C compiler is at hand), or None: not built, or UNIMQ_NO_NATIVE=1
    (the pure-Python loop below then encodes every record: the same bytes, slower)."""
    if os.environ.get("UNIMQ_NO_NATIVE", "") not in ("", "0"):
        return None
    try:
        from . import _recordc
    except ImportError:
        return None
    _recordc.setup(PutResult, PUT_OK)
    return _recordc.encode_run


#: core_broker._recordc.encode_run when the extension is built and not disabled.
NATIVE_ENCODE = _load_native()

#: (topic + protocol bytes, topic length, protocol length, header pack) of a topic's bare records.
BareShape = tuple[bytes, int, int, Callable[..., bytes]]


def tag_hash(tag: str | None) -> int:
    from .filter import tag_hash as _th  # one definition shared with the filter compiler

    return _th(tag) if tag else 0


class Appender:
    """Encodes, writes and dispatches records; the caller holds the store's write lock."""

    def __init__(
        self,
        commitlog: CommitLog,
        index: IndexService,
        queues: dict[tuple[str, int], ConsumeQueue],
        queue_factory: Callable[[str, int], ConsumeQueue],
        max_message_size: int,
        native: bool = True,
    ) -> None:
        """``native=False``: encode every record in Python even when the compiled encoder is
        built (tests compare the two paths' bytes)."""
        self.commitlog = commitlog
        self.index = index
        self._cqs = queues  # shared with the store's readers
        self._cq = queue_factory
        self._max_size = max_message_size
        self.open = False  # the store is running
        self.refusing = False  # the data disk is nearly full (set by retention's disk check)
        self._tag_hashes: dict[str, int] = {}
        self._bare_shapes: dict[tuple[str, str], BareShape] = {}
        self._idx_pending: list[tuple[str, int, int]] = []  # (key, phys, ts) of a batch's unwritten records
        self._encode_run = NATIVE_ENCODE if native else None
        self.set_store_id("")

    def set_store_id(self, store_id: str) -> None:
        """Server-assigned ids name the store: its id (or a group master's, see adopt_store_id)."""
        self.id_prefix = ID_VERSION + store_id
        self._id_hi = self.id_prefix.replace("%", "%%") + "%012X"  # see _HEX4
        self._id_key = -1
        self._id_head = ""

    def message_id(self, phys: int) -> str:
        """The server-assigned id of the record at ``phys``."""
        return f"{self.id_prefix}{phys:016X}"

    def _bare_shape(self, topic: str, proto: str) -> BareShape:
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

    def append_one(self, msg: Message, now: int) -> PutResult:
        """Append one message and dispatch it. Caller holds the store's lock.

        Written flat on purpose: this is the hottest function of the broker, and
        every attribute lookup and call here costs measurable throughput. A bare
        message (no tag, keys, properties, ids or extra queues: the common case)
        is encoded inline by record.encode's fast path, the same bytes.
        """
        if not self.open:
            raise StoreClosedError("the store is not running")
        if self.refusing:
            raise StoreFullError("the data disk is nearly full; puts are refused until space is freed")
        body = msg.body
        if len(body) > self._max_size:
            raise MessageTooLargeError(
                f"message body of {len(body)} bytes exceeds the limit of {self._max_size}"
            )
        topic = msg.topic
        cq = self._cqs.get((topic, msg.queue_id)) or self._cq(topic, msg.queue_id)
        qo = cq.max_offset
        if qo >= cq.limit:  # (limit is 0 while no queue file is open)
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
            tail = head_pack(
                msg.flags & _BARE_FLAGS, msg.queue_id, qo, pos, msg.born_timestamp_ms or now, now, msg.delivery_time_ms, -1,
                msg.reconsume_times, lt, lp, bl, tp,
            ) + body
            cl.write_at(pos, _pack_prefix(size, _MAGIC, _crc32c(tail)) + tail)
            cq.append(qo, pos, size, 0)  # ensured above: qo falls in its current file
            if pos >> 16 != self._id_key:  # see _HEX4
                self._id_key = pos >> 16
                self._id_head = self._id_hi % self._id_key
            return _new_tuple(PutResult, (PUT_OK, self._id_head + _HEX4[pos & 0xFFFF], msg.queue_id, qo, pos, size, ()))
        if msg.flags & _FLAG_BATCH:
            return self._append_batch_record(msg, cq, qo, now)
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
                if o >= c.limit:
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
        cl.write_parts_at(pos, head, body)  # head and body stored apart: the body is never copied twice
        tag = msg.tag
        th = (self._tag_hashes.get(tag) or self._tag_hash(tag)) if tag else 0
        cq.append(qo, pos, size, th)  # ensured above: qo falls in its current file
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

    def append_batch(
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

        Runs of plain messages of one queue (bare, or a door's: properties and a born host, no
        extra queue) are encoded by the compiled encoder when it is built (core_broker/_recordc.c:
        one call per run for the headers, CRCs, queue entries, ids and results; the same bytes);
        it stops at anything else, and this loop goes on.

        Tried and not kept: encoding a uniform batch of bare messages column-wise
        (one template head per record, the differing fields written through strided
        memoryview casts, C-level ``map`` for CRCs, ids and results). Under
        cachegrind it cost 16.4k instructions per 1 KiB message against this loop's
        16.9k: the per-record objects (a memoryview slice per CRC and per iovec, the
        id string, the result tuple) cost as much as the packs they replace.
        """
        if not self.open:
            raise StoreClosedError("the store is not running")
        if self.refusing:
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
        native = self._encode_run
        id_prefix = self.id_prefix
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
        # a door message's header template (record.door_head), and the properties and host it is of
        dpack: Callable[..., bytes] = _NO_PACK
        dlens = dstr = b""
        dtp: bytes | None = None  # the topic + protocol bytes of the bare shape the template is of
        dext: tuple = ()  # the extra queue (none or one) the template is of
        dxtb: bytes | None = None  # its topic, encoded
        dprops: dict[str, str] | None = None
        dhost = ""
        dsz = 0
        idx = self._idx_pending  # index entries of pending records, put once they are written
        seq = msgs if msgs.__class__ is list or msgs.__class__ is tuple else list(msgs)
        n = len(seq)
        i = 0  # the next message
        try:
            while i < n:
                m = seq[i]
                i += 1
                body = m.body
                extra = m.extra_dispatch
                if len(body) > limit or (extra and not self._dispatch_ok(m, extra)) or m.flags & _FLAG_BATCH:
                    # The single path raises the error, after the pending records are written.
                    if pending:
                        self._write_pending(cur, start, pos, pending, runs)
                    runs.clear()
                    last_topic = None
                    add(self.append_one(m, now))
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
                    shape = self._bare_shapes.get((topic, proto)) or self._bare_shape(topic, proto)
                    tp, lt, lp, head_pack = shape
                    hsz = _HEADER_SIZE + lt + lp
                    last_topic, last_qid, last_proto = topic, qid, proto
                qo = run[1] + len(ents)  # type: ignore[arg-type]
                if qo >= cq.limit:  # type: ignore[union-attr]
                    cq.ensure(qo)  # type: ignore[union-attr]  # may raise StoreFullError: nothing written yet
                if native is not None and not extra:
                    # The compiled encoder takes this message, if plain (bare, or a door's: properties
                    # and a born host), and the run of plain ones of this queue after it, as far as
                    # the queue file and the segment allow; when it takes none (another shape, or a
                    # value it leaves to Python), the code below does.
                    j, npos = native(seq, i - 1, topic, qid, proto, tp, lt, lp, qo, cq.limit,  # type: ignore[union-attr]
                                     pos, end, now, limit, id_prefix, pending, ents, results)
                    if j >= i:
                        i, pos = j, npos
                        continue
                if extra or m.tag or m.message_id or m.keys or m.properties or m.message_group or m.born_host:
                    # (Read here, not before the test: a bare message never needs them.)
                    tag = m.tag
                    mid = m.message_id
                    keys = m.keys
                    props = m.properties
                    if not (tag or mid or keys or m.message_group) and len(extra) < 2:
                        # A door's plain publish: properties, a born host and at most one extra queue
                        # (an MQTT QoS 1 subscriber's LMQ). A run of equal ones (one publisher's
                        # messages on one topic) shares one header template (record.door_head): its
                        # strings are encoded once per run, the queue offsets packed per record.
                        host = m.born_host
                        if dtp is not tp or host != dhost or (props is not dprops and props != dprops) or (
                                extra is not dext and extra != dext):
                            dext = extra
                            dxtb = extra[0][0].encode() if extra else None
                            pb = _encode_properties(props) if props else b""
                            hb = host.encode() if host else b""
                            dpack, dlens, dstr = _door_head(tp[:lt], hb, tp[lt:], pb, dxtb)  # type: ignore[index]
                            dtp, dprops, dhost = tp, props, host
                            dsz = _HEADER_SIZE + len(dstr) + (_DISPATCH_SIZE + len(dxtb) if dxtb else 0)
                        bl = len(body)
                        size = dsz + bl
                        if extra:
                            t = extra[0]
                            xr = runs.get(t)
                            if xr is None:
                                xcq = self._cqs.get(t) or self._cq(t[0], t[1])
                                xr = runs[t] = [xcq, xcq.max_offset, []]
                            o = xr[1] + len(xr[2])
                            if o >= xr[0].limit:
                                xr[0].ensure(o)  # may raise StoreFullError: this record is not written yet
                        if pos + size > end:
                            pos, cur, end = self._roll_batch(cur, start, pos, pending, runs, size)
                            start = pos
                        if extra:
                            head = dpack(m.flags & _NOT_LINK, qid, qo, pos, m.born_timestamp_ms or now, now,
                                         m.delivery_time_ms, -1, 0, m.reconsume_times, dlens, bl, dstr,
                                         len(dxtb), t[1], o, dxtb)  # type: ignore[arg-type]
                        else:
                            head = dpack(m.flags & _NOT_LINK, qid, qo, pos, m.born_timestamp_ms or now, now,
                                         m.delivery_time_ms, -1, 0, m.reconsume_times, dlens, bl, dstr)
                        if bl <= 256:  # as for bare records below
                            head += body
                            pending += (_pack_prefix(size, _MAGIC, _crc32c(head)), head)
                        else:
                            pending += (_pack_prefix(size, _MAGIC, _crc32c(body, _crc32c(head))), head, body)
                        e = _cq_entry(pos, size, 0)
                        ents.append(e)  # type: ignore[union-attr]
                        if pos >> 16 != id_key:
                            id_key = pos >> 16
                            id_head = idhi % id_key
                        if extra:
                            xr[2].append(e)  # type: ignore[index]  # (set above: extra)
                        mid = id_head + hex4[pos & 0xFFFF]
                        add(_new_tuple(PutResult, (PUT_OK, mid, qid, qo, pos, size, (o,) if extra else ())))
                        pos += size
                        continue
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
        self.commitlog.write_pieces(cur, start, end, pending)
        pending.clear()
        idx = self._idx_pending
        if idx:
            put = self.index.put
            for key, phys, ts in idx:
                put(key, phys, ts)
            idx.clear()
        for run in runs.values():
            ents = run[2]
            if ents:
                run[0].append_entries(run[1], ents)
                run[1] += len(ents)
                ents.clear()

    def _append_batch_record(self, msg: Message, cq, qo: int, now: int) -> PutResult:
        """One record for a producer's batch of messages (``record.FLAG_BATCH``), indexed once in
        its batch queue for queue offsets [qo, qo + count); each extra target (an LMQ) gets one
        classic entry per message of the batch routed to it, the message's index in the
        tag-hash field. The body is stored as it came: never unpacked here."""
        if not isinstance(cq, BatchConsumeQueue):
            raise BadRequestError(f"topic {msg.topic!r} is not a batch topic (attribute batch=true)")
        props = msg.properties
        try:
            count = int(props[record.P_BATCH_COUNT])
            x = props.get(record.P_BATCH_DISPATCH)
            inner = [int(i) for i in x.split(",")] if x else []
        except (KeyError, ValueError):
            raise BadRequestError("a batch record needs its message count") from None
        extra = msg.extra_dispatch
        if count < 1 or len(inner) != len(extra) or any(not 0 <= i < count for i in inner):
            raise BadRequestError("a batch record's count or dispatch indexes are out of range")
        cqs = [self._cqs.get(t) or self._cq(t[0], t[1]) for t in extra]
        seen: dict = {}
        offsets = []
        for t, c in zip(extra, cqs):  # one target may take several messages of the batch
            k = seen[t] = seen.get(t, -1) + 1
            offsets.append(c.max_offset + k)
            c.ensure(c.max_offset + k)
        extra_offsets = tuple(offsets)
        dispatch = _encode_dispatch(extra, extra_offsets) if extra else b""
        cl = self.commitlog
        pos = cl.write_pos
        head = _encode_head(msg, qo, pos, now, dispatch)
        size = len(head) + len(msg.body)
        if pos + size > cl.limit:
            if size > cl.segment_size:
                raise MessageTooLargeError(f"a record of {size} bytes does not fit a commitlog segment")
            new_pos = cl.make_room(size)
            if new_pos != pos:
                pos = new_pos
                head = _encode_head(msg, qo, pos, now, dispatch)
        cl.write_parts_at(pos, head, msg.body)
        th = (self._tag_hashes.get(msg.tag) or self._tag_hash(msg.tag)) if msg.tag else 0
        cq.put_batch(qo, count, pos, size, th)
        for c, o, i in zip(cqs, extra_offsets, inner):
            c.put(o, pos, size, i)
        for mid in record.batch_ids(props):  # client-chosen ids: query by id finds the record
            self.index.put("#id#" + mid, pos, now)
        return PutResult(PutStatus.PUT_OK, self.message_id(pos), msg.queue_id, qo, pos, size, extra_offsets)

    def append_link(
        self,
        link: Message,
        origin: StoredMessage,
        origin_offset: int,
        extra_dispatch: Sequence[tuple[str, int]],
        now: int,
    ) -> PutResult:
        """A link record: ``link``'s queue (and ``extra_dispatch``'s) get an entry for the
        message stored at ``origin_offset``, whose body is not copied."""
        if not self.open:
            raise StoreClosedError("the store is not running")
        topic, queue_id = link.topic, link.queue_id
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
        cl.write_at(pos, data)
        th = self._tag_hash(origin.tag)
        cq.put(qo, pos, len(data), th)
        for c, o in zip(cqs, extra_offsets):
            c.put(o, pos, len(data), th)
        mid = origin.message_id or self.message_id(origin_offset)
        return PutResult(PutStatus.PUT_OK, mid, queue_id, qo, pos, len(data), extra_offsets)
