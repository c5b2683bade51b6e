"""Cold reads: messages whose segment left the local disk, read back from the tier.

Why here and how: once retention deleted a segment locally, the manifests the
uploader keeps say which tier segment holds which offsets of every queue; the
queue's entries are one ranged read of the segment's index object (the manifest
gives their position) and the records one ranged read of the segment object,
both through a bounded block cache (``block_cache``), so a sequential reader
pays one GET per block, not per message. Records are decoded with the store's
own decoder (``record.decode``, CRC checked), so what a reader gets is what a
local read would have given: same bytes, same message id, a link resolved to
its origin (local or in the tier). Everything here blocks on the network: the
broker calls it on the tier's read workers (``TierService.get_async``), never
on the event loop.
"""

from __future__ import annotations

import bisect
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Callable, NamedTuple

from .. import record
from ..batch_queue import ENTRY as BATCH_ENTRY
from ..bulk_reads import batch_member, batch_member_by_id
from ..consume_queue import ENTRY
from ..errors import CorruptRecordError
from ..model import GetResult, GetStatus, StoredMessage
from ..index_file import key_hash
from . import key_index, layout
from .block_cache import BlockCache
from .object_store import ObjectStore
from .uploader import Uploader

if TYPE_CHECKING:
    from ..message_store import MessageFilter, MessageStore



class Range(NamedTuple):
    """A queue's entries in one tier segment."""

    first: int  # queue offsets [first, end)
    end: int
    pos: int  # where its entries start in the segment's index object
    m: layout.Manifest
    size: int  # entry size: ENTRY.size (one per offset) or BATCH_ENTRY.size (one per record)
    stop: int  # where its entries end in the index object


MAX_SCAN = 4096  # entries one filtered get may skip before answering (as the store's get)
MAX_SPAN = 8 << 20  # the most segment bytes one get reads
READ_AHEAD_MAX = 8  # blocks fetched in the background past what a get read, at most


def read_ahead_blocks(block_size: int, ahead_bytes: int, cache_bytes: int) -> int:
    """How many blocks a sequential reader has fetched in the background past what it read:
    ``tier_read_ahead_bytes`` worth (at least one block), at most :data:`READ_AHEAD_MAX` and at
    most half the cache's blocks, so what was fetched ahead is not evicted before it is read.

    Why several: a GET's thread waits for the GIL after each of its socket calls, up to the
    5 ms switch interval while the reader decodes, so one GET takes tens of milliseconds
    beside a busy reader whatever the object store's speed; GETs in flight together share
    those waits. The service runs the read-ahead on as many threads as this.
    """
    return max(1, min(READ_AHEAD_MAX, ahead_bytes // block_size, cache_bytes // block_size // 2))


class ColdOrigin(Exception):
    """A local link's origin is only in the tier: read it off the event loop (``read_phys``)."""


def _linked(link: StoredMessage, origin: StoredMessage) -> StoredMessage:
    """The message a link delivers: its origin's, with the link's properties and counters
    (as ``MessageStore._materialize`` merges them)."""
    if link.properties:
        origin.properties.update(link.properties)
    origin.reconsume_times = link.reconsume_times
    origin.store_timestamp_ms = link.store_timestamp_ms
    origin.flags |= record.FLAG_LINK
    return origin


class TierReader:
    def __init__(
        self,
        store: "MessageStore",
        objects: ObjectStore,
        uploader: Uploader,
        cache_bytes: int,
        block_size: int,
        prefetcher: Executor,
        ahead_blocks: int = 1,
    ) -> None:
        self.store = store
        self.objects = objects
        self.uploader = uploader
        self.cache = BlockCache(cache_bytes)
        self.block_size = block_size
        self.ahead = ahead_blocks  # blocks read ahead (``read_ahead_blocks``)
        self.prefetcher = prefetcher  # runs read-ahead GETs
        self.gets = 0  # ranged GETs made (tests, and a metric of cold-read traffic)
        # (uploader version, ranges by queue, segment bases, manifests): replaced whole, so the
        # read workers never see parts of two versions
        self._maps: tuple[int, dict[tuple[str, int], list[Range]], list[int], list[layout.Manifest]] = (-1, {}, [], [])

    # ------------------------------------------------------------------ where things are

    def _current(self) -> tuple[int, dict[tuple[str, int], list[Range]], list[int], list[layout.Manifest]]:
        maps = self._maps
        version = self.uploader.version
        if version != maps[0]:  # rebuilt when the tier changed, not per get
            by_queue: dict[tuple[str, int], list[Range]] = {}
            manifests = self.uploader.manifests()
            for m in manifests:
                starts = sorted(q[4] for q in m.queues) + [m.index_length]
                for t, q, first, end, pos, size in m.queues:
                    stop = starts[bisect.bisect_right(starts, pos)]
                    by_queue.setdefault((t, q), []).append(Range(first, end, pos, m, size, stop))
            for r in by_queue.values():
                r.sort(key=lambda x: x[0])
            maps = self._maps = (version, by_queue, [m.base for m in manifests], manifests)
        return maps

    def _ranges(self, topic: str, queue_id: int) -> list[Range]:
        """(first, end, entries' position, manifest) of every tier segment with entries of the queue."""
        return self._current()[1].get((topic, queue_id), [])

    def min_offset(self, topic: str, queue_id: int) -> int | None:
        """The queue's oldest offset in the tier, or None when the tier holds none of it."""
        r = self._ranges(topic, queue_id)
        return r[0][0] if r else None

    # ------------------------------------------------------------------ bytes

    def _read(self, kind: str, m: layout.Manifest, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a segment's ``kind`` object ("segment", "index" or "keys")."""
        buf, at = self._span(kind, m, start, end)
        return buf if at == 0 and len(buf) <= end - start else buf[at : at + end - start]

    def _span(self, kind: str, m: layout.Manifest, start: int, end: int, ahead: int = 0) -> tuple[bytes, int]:
        """Bytes ``[start, end)`` of a segment's ``kind`` object as (a buffer, where they start in
        it): the cached block itself when they lie in one, so records decode from it with no copy;
        then fetch the ``ahead`` blocks after them in the background (a sequential reader's next)."""
        limit = m.where(self.store.store_id, kind)[2]
        end = min(end, limit)
        if end <= start:
            return b"", 0
        bs = self.block_size
        fetch = self._fetcher(m, kind)
        first, last = start // bs, (end - 1) // bs
        for b in range(last + 1, min(last + 1 + ahead, (limit - 1) // bs + 1)):
            self.cache.prefetch((m.base, kind, b), fetch(b), self.prefetcher)
        if first == last:
            return self.cache.get((m.base, kind, first), fetch(first)), start - first * bs
        parts = []
        for b in range(first, last + 1):
            block = self.cache.get((m.base, kind, b), fetch(b))
            parts.append(block[max(start - b * bs, 0) : end - b * bs])
        return b"".join(parts), 0

    def _fetcher(self, m: layout.Manifest, kind: str) -> Callable[[int], Callable[[], bytes]]:
        """Block number -> the ranged GET of that block of segment ``m``'s ``kind`` bytes (a
        segment's index or keys may follow its records in one object, ``layout``)."""
        name, at, limit = m.where(self.store.store_id, kind)
        bs = self.block_size
        with_tail = kind == "index" and m.inline and m.size > 0

        def fetch(b: int) -> Callable[[], bytes]:
            def run() -> bytes:
                self.gets += 1
                end = at + min(b * bs + bs, limit)
                if b == 0 and with_tail:
                    return self._index_with_tail(name, m, end)
                return self.objects.get_range(name, at + b * bs, end)

            return run

        return fetch

    def _index_with_tail(self, name: str, m: layout.Manifest, end: int) -> bytes:
        """The first index block of an inline segment object (``[m.size, end)``), fetched in one
        GET with the segment's last block, which lies just before it in the object and goes into
        the cache too (unless it is there or on its way).

        Why: whoever reads a queue's entries of a segment reads their records next, and one
        GET fewer per segment matters: a GET costs milliseconds of botocore CPU whatever its
        size (bench/RESULTS.md, branch tierread). That block keeps the index bytes after the
        segment's end: every reader takes its range of a block by offset (``_span``), and
        records are bounded by their own size and CRC, so they never show.
        """
        bs = self.block_size
        last = (m.size - 1) // bs
        key = (m.base, "segment", last)
        if self.cache.has(key):
            return self.objects.get_range(name, m.size, end)
        data = self.objects.get_range(name, last * bs, end)
        cut = m.size - last * bs
        self.cache.put(key, data)
        return data[cut:]

    def _ahead_into(self, after: list[Range], budget: int) -> None:
        """A sequential reader nears the end of a queue's segment: fetch, in the background, where
        it continues in the next tier segments (in each, the index block with the queue's first
        entry there, then the blocks from that entry's record on), ``budget`` blocks of records in
        all but at least the next segment's first, so that it waits for no GET at a segment
        boundary, and segments of a block or two keep as many blocks in flight as large ones."""
        bs = self.block_size
        for _first, _end, pos, m, *_ in after:
            n = min(max(budget, 1), (m.size - 1) // bs + 1)
            budget -= n
            key = (m.base, "index", pos // bs)
            if not self.cache.has(key):  # not asked yet
                # the index block is asked before ``_segment_ahead`` is queued, so that (waiting for
                # it) waits for a job a worker took already, never for one queued behind it
                fetch = self._fetcher(m, "index")
                self.cache.prefetch(key, fetch(pos // bs), self.prefetcher)
                try:
                    self.prefetcher.submit(self._segment_ahead, m, pos, n)
                except RuntimeError:  # shut down: no read-ahead any more
                    return
            if budget <= 0:
                break

    def _segment_ahead(self, m: layout.Manifest, pos: int, n: int) -> None:
        """Read ahead ``n`` blocks of segment ``m`` from the record of the index entry at ``pos``."""
        phys = ENTRY.unpack(self._read("index", m, pos, pos + ENTRY.size))[0]
        bs = self.block_size
        fetch = self._fetcher(m, "segment")
        b = (phys - m.base) // bs
        for k in range(b, min(b + n, (m.size - 1) // bs + 1)):
            self.cache.prefetch((m.base, "segment", k), fetch(k), self.prefetcher)

    def _manifest_at(self, phys: int) -> layout.Manifest | None:
        _, _, bases, ms = self._current()
        i = bisect.bisect_right(bases, phys) - 1
        if i >= 0 and ms[i].base <= phys < ms[i].base + ms[i].length:
            return ms[i]
        return None

    def _record(self, phys: int) -> bytes:
        m = self._manifest_at(phys)
        if m is None:
            raise CorruptRecordError(f"no record at commitlog offset {phys} in the tier")
        off = phys - m.base
        size = int.from_bytes(self._read("segment", m, off, off + 4), "little")
        if size < 12 or off + size > m.length:
            raise CorruptRecordError(f"no record at commitlog offset {phys} in the tier")
        return self._read("segment", m, off, off + size)

    def record_at(self, phys: int) -> tuple[StoredMessage, tuple[int, int]]:
        """The record at ``phys`` in the tier as stored (a link unresolved), and its link origin
        ((-1, 0) for a message)."""
        buf = self._record(phys)
        return record.decode(buf, 0), record.link_origin(buf, 0)

    def read_phys(self, phys: int) -> StoredMessage:
        """The message at a commitlog offset, wherever it is now; a link resolves to its origin
        (a local link's origin too, when only the tier still holds it). Blocks on the network."""
        if phys >= self.store.commitlog.min_offset:
            try:
                return self.store.read_phys(phys)
            except (CorruptRecordError, ValueError):
                link = self._local_link(phys)
                if link is not None:  # the link is local, its origin left: read that from the tier
                    return _linked(link[0], self.read_phys(link[1]))
                # else retention removed it under our feet: it is in the tier now
        return self._decode(self._record(phys), 0, phys)

    def read_local(self, phys: int) -> StoredMessage:
        """The message at ``phys`` from local disk only (no network: the event loop may call it),
        as the store reads it; a local link whose origin only the tier holds raises
        :class:`ColdOrigin`, so the caller can do the read again off the loop with :meth:`read_phys`."""
        try:
            return self.store.read_phys(phys)
        except (CorruptRecordError, ValueError):
            link = self._local_link(phys)
            if link is not None and self._manifest_at(link[1]) is not None:
                raise ColdOrigin(phys) from None
            raise

    def _local_link(self, phys: int) -> tuple[StoredMessage, int] | None:
        """(the link record, its origin's offset) when ``phys`` is a link still on local disk."""
        cl = self.store.commitlog
        try:
            if phys < cl.min_offset:
                return None
            m = cl.read(phys)
            lo, _ = cl.link_origin(phys)
        except (CorruptRecordError, ValueError):
            return None
        return (m, lo) if m.flags & record.FLAG_LINK and 0 <= lo < cl.min_offset else None

    def _decode(self, buf: bytes, pos: int, phys: int) -> StoredMessage:
        """The record at ``pos`` of ``buf`` (commitlog offset ``phys``), as the store's read gives it."""
        m = record.decode(buf, pos)
        if m.flags & record.FLAG_LINK:
            lo, _ = record.link_origin(buf, pos)
            return _linked(m, self.read_phys(lo))
        if not m.message_id:
            m.message_id = self.store.appender.message_id(phys)
        return m

    # ------------------------------------------------------------------ by id

    def query_by_id(self, message_id: str) -> StoredMessage | None:
        """The message of an id whose record left the local disk, or None.

        A server id names its record's commitlog offset (``Appender.message_id``), so this is
        one record read from the tier, no index needed; a client-chosen id is looked up in the
        segments' keys objects (``key_index``), newest segment first.
        """
        prefix = self.store.appender.id_prefix
        if len(message_id) != len(prefix) + 16 or not message_id.startswith(prefix):
            for m in self._by_index_key("#id#" + message_id, 0, 2**62, 16):
                if m.message_id == message_id:
                    return m
                inner = batch_member_by_id(m, message_id)  # a client id inside a batch record
                if inner is not None:
                    return inner
            return None
        try:
            phys = int(message_id[len(prefix) :], 16)
        except ValueError:
            return None
        if phys >= self.store.commitlog.min_offset or self._manifest_at(phys) is None:
            return None
        try:
            m = self.read_phys(phys)
        except (CorruptRecordError, ValueError):  # not a record boundary: a batch's message, or no id
            return self._batch_member_at(phys)
        return m if m.message_id == message_id else None

    def _batch_member_at(self, phys: int) -> StoredMessage | None:
        """The message of a batch record in the tier whose server id names ``phys`` (the record's
        offset + the message's index), or None. The record is found in the segment's batch-queue
        entries (binary search over their record offsets), not by looking back in its bytes as
        the local store does: a few cached index blocks rather than up to a message's size."""
        m = self._manifest_at(phys)
        if m is None:
            return None
        for t, q, _first, _end, pos, size in m.queues:
            if size == ENTRY.size:
                continue
            r = next(r for r in self._ranges(t, q) if r.m is m and r.pos == pos)
            at = r.pos + self._last_at_or_before(r, 0, phys) * size
            start, _, _, _, count = BATCH_ENTRY.unpack(self._read("index", m, at, at + size))
            if start < phys < start + count:
                try:
                    return batch_member(self.read_phys(start), phys - start)
                except (CorruptRecordError, ValueError):
                    return None
        return None

    # ------------------------------------------------------------------ by key

    def query_by_key(self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int) -> list[StoredMessage]:
        """Messages of ``topic`` with ``key`` stored in ``[begin_ms, end_ms]`` whose records
        left the local disk, newest segment first, at most ``max_count``."""
        out = []
        for m in self._by_index_key(f"{topic}#{key}", begin_ms, end_ms, 4 * max_count):
            if m.topic == topic and key in m.keys:
                out.append(m)
                if len(out) >= max_count:
                    break
        return out

    def _by_index_key(self, index_key: str, begin_ms: int, end_ms: int, limit: int) -> list[StoredMessage]:
        """The records whose keys object entry has ``index_key``'s hash, in segments no longer on
        local disk (the local IndexFile answers for the rest); the caller checks each one."""
        h = key_hash(index_key)
        local_min = self.store.commitlog.min_offset
        out: list[StoredMessage] = []
        for m in reversed(self._current()[3]):
            if len(out) >= limit:
                break
            if not m.keys_length or m.base >= local_min or m.last_ts < begin_ms or m.first_ts > end_ms:
                continue

            def read(start: int, end: int, m: layout.Manifest = m) -> bytes:
                return self._read("keys", m, start, end)

            for phys in key_index.lookup(read, m.keys_length, h, begin_ms, end_ms, limit - len(out)):
                if phys >= local_min:
                    continue
                try:
                    out.append(self.read_phys(phys))
                except (CorruptRecordError, ValueError):
                    continue
        return out

    def locate(self, topic: str, queue_id: int, offset: int) -> tuple[int, int | None] | None:
        """(commitlog offset, index inside its batch-queue entry's record, None for a classic
        queue's entry) of a queue entry only the tier holds, or None (one ranged read of the index object, cached; a batch queue's entry
        found by binary search). Blocks on the network: run it on the read workers."""
        for r in self._ranges(topic, queue_id):
            if r.first <= offset < r.end:
                at, stop = self._entry_span(r, offset)
                raw = self._read("index", r.m, at, stop)
                if r.size == ENTRY.size:
                    return ENTRY.unpack(raw)[0], None
                phys, _, _, first, _count = BATCH_ENTRY.unpack(raw)
                return phys, offset - first
        return None

    def _entry_span(self, r: Range, offset: int) -> tuple[int, int]:
        """Where in ``r``'s index object the entry holding queue offset ``offset`` lies: at its
        place for a classic queue, found by binary search over first offsets for a batch queue."""
        if r.size == ENTRY.size:
            at = r.pos + (offset - r.first) * ENTRY.size
            return at, at + ENTRY.size
        at = r.pos + self._last_at_or_before(r, 3, offset) * r.size
        return at, at + r.size

    def _last_at_or_before(self, r: Range, field: int, value: int) -> int:
        """The index of the last of batch-queue run ``r``'s entries whose ``field`` (0: record
        offset, 3: first queue offset; both grow with the entries) is at most ``value`` (0: none)."""
        lo, hi = 0, (r.stop - r.pos) // r.size - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            at = r.pos + mid * r.size
            if BATCH_ENTRY.unpack(self._read("index", r.m, at, at + r.size))[field] > value:
                hi = mid - 1
            else:
                lo = mid
        return lo

    # ------------------------------------------------------------------ by time

    def offset_for_timestamp(self, topic: str, queue_id: int, ts_ms: int) -> int | None:
        """The first queue offset stored at or after ``ts_ms`` among the queue's entries in tier
        segments no longer on local disk; None when there is none (the local queue answers).

        Store timestamps grow with the log, so the manifests' first and last timestamps pick
        the one segment to search without a network call (a time newer than the tier's data
        costs none at all); within it, a binary search reads one entry and one record header
        per step through the block cache. Blocks on the network: run it on the read workers.
        """
        local_start = self.store.commitlog.min_offset
        for first, end, pos, m, size, stop in self._ranges(topic, queue_id):
            if m.base >= local_start:
                break  # still on local disk: the local search covers it
            if m.last_ts < ts_ms:
                continue
            if m.first_ts >= ts_ms:
                return first
            lo, hi = 0, (stop - pos) // size  # over entries (a batch queue's hold several offsets)
            while lo < hi:
                mid = (lo + hi) // 2
                if self._store_ts(m, pos + mid * size) < ts_ms:
                    lo = mid + 1
                else:
                    hi = mid
            if lo * size < stop - pos:
                if size == ENTRY.size:
                    return first + lo
                at = pos + lo * size
                return BATCH_ENTRY.unpack(self._read("index", m, at, at + size))[3]
        return None

    def _store_ts(self, m: layout.Manifest, at: int) -> int:
        """Store timestamp of the record the index entry at ``at`` of ``m``'s index object names."""
        phys, size, _ = ENTRY.unpack(self._read("index", m, at, at + ENTRY.size))
        rec = self._read("segment", m, phys - m.base, phys - m.base + size)
        return record.parse_header(rec, 0).store_ts

    # ------------------------------------------------------------------ get

    def _batch_messages(
        self, entries: list[tuple[int, int, int, int, int]], span: bytes, delta: int, next_off: int, end: int,
        budget: int, msg_filter: MessageFilter | None, queue: tuple[str, int], out: list[StoredMessage],
        max_count: int,
    ) -> tuple[int, int]:
        """A batch queue's entries in the tier, as the store's ``_get_batches`` answers local ones:
        each record decoded once, one message per queue offset wanted from ``next_off`` (copies
        sharing its body, each naming its index in the batch), appended to ``out``; returns the
        next offset and what is left of the scan budget."""
        want_all = msg_filter is None or msg_filter.matches_all
        hashes = None if want_all else msg_filter.tag_hashes  # type: ignore[union-attr]
        for phys, _size, th, first, n in entries:
            budget -= 1
            if (hashes is not None and th not in hashes) or next_off >= first + n:
                next_off = max(next_off, first + n)
                continue
            msg = self._decode(span, phys + delta, phys)
            if not want_all and not msg_filter.matches(msg.tag, msg.properties):  # type: ignore[union-attr]
                next_off = first + n
                continue
            batch = msg.flags & record.FLAG_BATCH
            for q in range(max(first, next_off), min(first + n, end)):
                c = msg.clone() if batch and n > 1 else msg
                c.topic, c.queue_id, c.queue_offset = queue[0], queue[1], q
                if batch:
                    c.properties[record.P_BATCH_INDEX] = str(q - first)
                out.append(c)
                next_off = q + 1
                if len(out) >= max_count:
                    return next_off, budget
        return next_off, budget

    def get(
        self, topic: str, queue_id: int, offset: int, max_count: int, msg_filter: MessageFilter | None = None
    ) -> GetResult | None:
        """What ``MessageStore.get`` would answer for an offset below the local queue's minimum.

        None when the tier holds nothing of the queue at or below ``offset`` (the local
        answer stands). An offset older than the tier's oldest answers OFFSET_MOVED with
        the tier's minimum. Answers stop at the local queue's minimum: the next get is local.
        """
        ranges = self._ranges(topic, queue_id)
        if not ranges:
            return None
        tier_min = ranges[0][0]
        local_min = self.store.min_offset(topic, queue_id)
        # segments retention deleted: their entries are the tier's even while the local queue's
        # minimum lags (it moves past them lazily, or just after the segments went)
        gone = self.store.commitlog.min_offset
        hi = self.store.max_offset(topic, queue_id)
        if offset < tier_min:
            return GetResult(GetStatus.OFFSET_MOVED, [], tier_min, tier_min, hi)
        want_all = msg_filter is None or msg_filter.matches_all
        hashes = None if want_all else msg_filter.tag_hashes  # type: ignore[union-attr]
        budget = max_count if want_all else max(MAX_SCAN, max_count)
        out: list[StoredMessage] = []
        next_off = offset
        for i, r in enumerate(ranges):
            first, end, m = r.first, r.end, r.m
            if m.base >= gone:
                end = min(end, local_min)  # from the local minimum on, the local queue answers
            if next_off >= end:
                continue
            if next_off < first:  # a hole: segments tier retention removed (other topics kept older ones)
                if next_off == offset:
                    return GetResult(GetStatus.OFFSET_MOVED, [], first, tier_min, hi)
                break  # the caller asks again from here
            batches = r.size != ENTRY.size
            if batches:  # entries per record: from the one holding next_off, each one offset at least
                at = self._entry_span(r, next_off)[0]
                raw = self._read("index", m, at, min(r.stop, at + min(end - next_off, budget) * r.size))
                entries = [e for e in BATCH_ENTRY.iter_unpack(raw) if e[3] < end]  # (phys, size, th, first, n)
            else:
                n = min(end - next_off, budget)
                at = r.pos + (next_off - first) * ENTRY.size
                raw = self._read("index", m, at, at + n * ENTRY.size)
                entries = list(ENTRY.iter_unpack(raw))  # (phys, size, tag hash)
            if not entries:
                break
            # the records of these entries lie in this segment, in order: one read for all of them,
            # at most MAX_SPAN bytes (a sparse queue's entries may be far apart)
            span_start = entries[0][0]
            limit = span_start + max(MAX_SPAN, entries[0][1])
            if entries[-1][0] + entries[-1][1] > limit:
                entries = entries[: max(1, bisect.bisect_right([e[0] + e[1] for e in entries], limit))]
            span_end = entries[-1][0] + entries[-1][1] - m.base
            span, delta = self._span("segment", m, span_start - m.base, span_end, self.ahead)
            delta -= span_start  # a record's position in ``span``: its commitlog offset + delta
            left = (m.size - 1) // self.block_size - (span_end - 1) // self.block_size  # blocks after the span
            if i + 1 < len(ranges) and left <= self.ahead:
                self._ahead_into(ranges[i + 1 : i + 1 + self.ahead], self.ahead - left)
            if batches:
                next_off, budget = self._batch_messages(entries, span, delta, next_off, end, budget, msg_filter,
                                                        (topic, queue_id), out, max_count)
            else:
                for qo, (phys, _size, th) in enumerate(entries, next_off):
                    next_off = qo + 1
                    budget -= 1
                    if hashes is not None and th not in hashes:
                        continue
                    msg = self._decode(span, phys + delta, phys)
                    if not want_all and not msg_filter.matches(msg.tag, msg.properties):  # type: ignore[union-attr]
                        continue
                    msg.topic, msg.queue_id, msg.queue_offset = topic, queue_id, qo
                    out.append(msg)
                    if len(out) >= max_count:
                        break
            if len(out) >= max_count or budget <= 0:
                break
        if next_off == offset:
            return None
        status = GetStatus.FOUND if out else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, out, next_off, tier_min, hi)
