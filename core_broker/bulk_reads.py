"""The store's paths for bulk readers and batch topics (``MessageStore`` inherits them): queue
offsets as undecoded bytes (the gateway's Arrow pages), batch queues loaded and re-dispatched,
and reads that answer a batch record per offset or whole.

Why apart: the store's module holds the general put/get/recovery machinery; what readers that
take many messages at once need, and what only batch topics need (``batch_queue.py`` is their
consume queue, ``record.FLAG_BATCH`` their record), is kept here beside it, so both stay
readable. Nothing here decodes a batch: the gateway does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from . import record
from .batch_queue import BatchConsumeQueue
from .consume_queue import ENTRY as CQ_ENTRY, unsafe
from .errors import CorruptRecordError
from .model import GetResult, GetStatus, StoredMessage
from .system_topics import LMQ_PREFIX

if TYPE_CHECKING:
    from .message_store import MessageFilter

__all__ = ["BulkReads", "batch_member", "batch_member_by_id"]


def batch_member(m: StoredMessage, i: int) -> StoredMessage | None:
    """Batch record ``m`` answered as its message ``i`` (``record.P_BATCH_INDEX`` and that
    message's queue offset; the gateway unpacks it as a read's), or None when ``m`` is no batch
    record or has no message ``i``."""
    if m.flags & (record.FLAG_BATCH | record.FLAG_LINK) != record.FLAG_BATCH or \
            not 0 <= i < int(m.properties.get(record.P_BATCH_COUNT, "1")):
        return None
    m.properties[record.P_BATCH_INDEX] = str(i)
    m.queue_offset += i
    return m


def batch_member_by_id(m: StoredMessage, message_id: str) -> StoredMessage | None:
    """The message of batch record ``m`` whose client-chosen id is ``message_id`` (the index
    entry ``#id#<id>`` names the record, ``record.P_BATCH_IDS`` which of its messages), or None."""
    if not m.flags & record.FLAG_BATCH:
        return None
    ids = m.properties.get(record.P_BATCH_IDS)
    if not ids:
        return None
    try:
        return batch_member(m, ids.split("\0").index(message_id))
    except ValueError:
        return None


class BulkReads:
    """Mixed into ``MessageStore``: uses its queues, topics, commitlog and ``_materialize``."""

    def _load_batch_queues(self) -> None:
        if self._bq_root.exists():  # batch topics' queues (a store older than them has none)
            for tdir in self._bq_root.iterdir():
                for qdir in tdir.iterdir() if tdir.is_dir() else ():
                    if qdir.name.isdigit():
                        key = (unsafe(tdir.name), int(qdir.name))
                        bq = BatchConsumeQueue(self._bq_root, key[0], key[1], self.config.cq_entries_per_file)
                        bq.load()
                        self._cqs[key] = bq

    def _dispatch_batch(self, h: record.RecordHeader, th: int) -> None:
        """Recovery of a batch record: its batch-queue entry and its messages' LMQ entries."""
        cq = self._cq(h.topic, h.queue_id)
        if isinstance(cq, BatchConsumeQueue):
            cq.ensure(h.queue_offset)
            cq.put_batch(h.queue_offset, h.batch_count, h.phys_offset, h.size, th)
        for (topic, qid, qo), i in zip(h.dispatch, h.batch_dispatch):
            self._cq(topic, qid).put(qo, h.phys_offset, h.size, i)
        for mid in h.batch_ids:
            self.index.put("#id#" + mid, h.phys_offset, h.store_ts)

    def is_batch_topic(self, topic: str) -> bool:
        """A topic created with the attribute ``batch=true``: its queues are batch queues."""
        tc = self.topics.get(topic) if not topic.startswith(LMQ_PREFIX) else None
        return tc is not None and tc.attributes.get("batch") == "true"

    def _get_batches(self, cq: BatchConsumeQueue, offset: int, max_count: int, scan: int,
                     msg_filter: MessageFilter | None, read: Callable[[int], StoredMessage] | None) -> GetResult:
        """:meth:`get` of a batch queue: each batch record read once and answered as one
        message per queue offset wanted (copies of the record sharing its body, each naming
        its index in the batch in ``record.P_BATCH_INDEX``). The batch is not unpacked: the
        gateway does that (``gateway/batch_codec.py``)."""
        want_all = msg_filter is None or msg_filter.matches_all
        hashes = None if want_all else msg_filter.tag_hashes  # type: ignore[union-attr]
        materialize = read or self._materialize
        topic, queue_id = cq.topic, cq.queue_id
        out: list[StoredMessage] = []
        next_off = offset
        for phys, _size, th, first, n in cq.batches(offset, scan):
            if (hashes is not None and th not in hashes) or next_off >= first + n:
                next_off = max(next_off, first + n)
                continue
            try:
                m = materialize(phys)
            except (CorruptRecordError, ValueError):
                next_off = first + n
                continue
            if not want_all and not msg_filter.matches(m.tag, m.properties):  # type: ignore[union-attr]
                next_off = first + n
                continue
            batch = m.flags & record.FLAG_BATCH
            for q in range(max(first, next_off), first + n):
                c = m.clone() if batch and n > 1 else m
                c.topic, c.queue_id, c.queue_offset = topic, queue_id, q
                if batch:
                    c.properties[record.P_BATCH_INDEX] = str(q - first)
                out.append(c)
                next_off = q + 1
                if len(out) >= max_count:
                    break
            if len(out) >= max_count:
                break
        status = GetStatus.FOUND if out else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, out, next_off, cq.min_offset, cq.max_offset)

    def get_batches(self, topic: str, queue_id: int, offset: int, max_count: int) -> tuple[list, int, int] | None:
        """Queue offsets from ``offset`` of a batch queue as whole records, each read once:
        ``([(first offset, count, record)], queue min, queue max)``, for bulk readers (the gateway's
        Arrow pages) that take a batch's messages as columns. None: not a batch queue, or out of range."""
        cq = self._cqs.get((topic, queue_id))
        if not isinstance(cq, BatchConsumeQueue) or not cq.min_offset <= offset < cq.max_offset:
            return None
        out = []
        for phys, _size, _th, first, n in cq.batches(offset, max_count):
            try:
                out.append((first, n, self._materialize(phys)))
            except (CorruptRecordError, ValueError):
                break
        return (out, cq.min_offset, cq.max_offset) if out else None

    def batch_message_at(self, phys: int) -> StoredMessage | None:
        """The message of a batch whose server id names commitlog offset ``phys``: the batch record
        at ``start`` holds its messages' ids ``start + i`` (``i`` below its count, a record being
        longer than its count), so the record holding ``phys`` is found by looking back from it
        (``CommitLog.record_start_before``); answered as the record naming index ``phys - start`` and
        that message's queue offset, unpacked by the gateway as a read's are. No index entry per
        message: the write path never opens a batch. None when ``phys`` is no such position."""
        start = self.commitlog.record_start_before(phys, self.config.max_message_size + record.HEADER_SIZE + (64 << 10))
        if start is None or start == phys:
            return None
        try:
            m = self._materialize(start)
        except (CorruptRecordError, ValueError):
            return None
        return batch_member(m, phys - start)

    def batch_index_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        """The index inside its batch record of the message at a batch queue's offset (None: a
        record of its own): a link made to it (retry, dead letter) names it. A batch of one
        message is a batch record too (its record says so, not its entry): without the index
        its link would be read as an LMQ entry's, whose tag-hash field is the index."""
        cq = self._cqs.get((topic, queue_id))
        if not isinstance(cq, BatchConsumeQueue):
            return None
        e = cq.locate(offset)
        if e is None:
            return None
        if e[4] == 1:
            try:
                return 0 if self._materialize(e[0]).flags & record.FLAG_BATCH else None
            except (CorruptRecordError, ValueError):
                return None
        return offset - e[3]

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
        if isinstance(cq, BatchConsumeQueue):
            return None  # a batch queue's entries are not one per offset: see get_batches_raw
        if cq is None or not max(cq.min_offset, self.compaction.boundary(topic, queue_id)) <= offset < cq.max_offset:
            return None
        esize = CQ_ENTRY.size
        unpack = CQ_ENTRY.unpack_from
        try:
            entries = cq.raw(offset, max_count)  # (an LMQ's are in memory: light_queue.py)
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
        return entries, span, first, self.appender.id_prefix, cq.min_offset, cq.max_offset
