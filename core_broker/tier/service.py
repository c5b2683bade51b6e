"""TierService: what the store and the broker hold of the tier.

Why one object: the store asks one question of the tier (``may_delete``: is this
segment safe to drop locally?) and the broker starts and stops it and reads its
status; behind it are the object store client, the upload worker and tier
retention, each in its own module. Built from the store's configuration
(``tier_*`` knobs of ``StoreConfig``) and attached as ``store.tier`` by the
broker once the store is open; off by default.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from ..errors import TierUnreadableError
from ..mapped_file import MappedFile
from ..model import GetResult, StoredMessage
from . import expiry
from .object_store import ObjectStore
from .reader import ColdOrigin, TierReader, read_ahead_blocks
from .uploader import Uploader

if TYPE_CHECKING:
    from ..message_store import MessageFilter, MessageStore

T = TypeVar("T")
LIST_WAIT_S = 10.0  # how long a cold read right after a start waits for the tier's listing


class TierService:
    def __init__(self, store: "MessageStore", objects: ObjectStore | None = None) -> None:
        cfg = store.config
        self.store = store
        ahead = read_ahead_blocks(cfg.tier_read_block_bytes, cfg.tier_read_ahead_bytes, cfg.tier_read_cache_bytes)
        self.objects = objects or ObjectStore(
            cfg.tier_bucket, cfg.tier_prefix, cfg.tier_endpoint, cfg.tier_region,
            max_connections=1 + cfg.tier_read_threads + 2 * ahead,  # the uploader, read workers, read-ahead
        )
        self.retention_hours = cfg.tier_retention_hours
        self.expiry_interval_s = cfg.tier_expiry_interval_s
        self._last_expiry = 0.0
        self.uploader = Uploader(
            store, self.objects, cfg.tier_scan_interval_s, cfg.tier_retry_max_s, self._idle, cfg.tier_upload_nice
        )
        # Cold reads wait on the network: never on the event loop, nor on the threads hot reads use;
        # their read-ahead GETs run on threads of their own: every block read ahead in flight at
        # once, and as many index GETs of the next segments (where a queue continues in each).
        self._read_pool = ThreadPoolExecutor(cfg.tier_read_threads, thread_name_prefix="unimq-tier-read")
        self._prefetch_pool = ThreadPoolExecutor(2 * ahead, thread_name_prefix="unimq-tier-read-ahead")
        self.reader = TierReader(
            store, self.objects, self.uploader, cfg.tier_read_cache_bytes, cfg.tier_read_block_bytes,
            self._prefetch_pool, ahead,
        )

    def start(self) -> None:
        """Start the upload worker (no network call here: the worker makes them)."""
        self.uploader.start()

    def continue_empty_log(self) -> None:
        """Before the first put, with nothing of the commitlog on local disk (a restart with an
        empty disk): read the tier's manifests now and make the log and every queue continue
        after the tier's end, so no offset is given twice and everything before is read from
        the tier. Blocks on the network (call it on a thread, before :meth:`start`).

        A store whose id was made by this start has nothing in the tier; otherwise a tier
        that cannot be read stops the start (:class:`TierUnreadableError`): where the log
        continues is unknown, and guessing 0 would reuse offsets the tier serves.
        """
        store = self.store
        if store.commitlog.files.files or store.new_store:
            return  # the local log says where it continues (the worker lists the tier later)
        try:
            self.uploader.list_tier()
        except self.objects.errors as e:
            raise TierUnreadableError(
                f"the local commitlog is empty and the tier (bucket {self.objects.bucket!r}) cannot be read, "
                f"so where the log continues is unknown: {type(e).__name__}: {e}; start again once it answers"
            ) from e
        manifests = self.uploader.manifests()
        if not manifests:
            return
        ends: dict[tuple[str, int], int] = {}
        for m in manifests:
            for t, q, _first, end, *_ in m.queues:
                ends[(t, q)] = max(ends.get((t, q), 0), end)
        last = manifests[-1]
        store.continue_after(last.base + last.size, ends)

    def stop(self) -> None:
        self.uploader.stop()
        self._read_pool.shutdown(wait=True, cancel_futures=True)
        self._prefetch_pool.shutdown(wait=True, cancel_futures=True)

    def may_delete(self, segment: MappedFile) -> bool:
        """Local retention's question: is ``segment`` confirmed in the tier?"""
        return self.uploader.confirmed(segment.base)

    def read_record(self, offset: int) -> StoredMessage:
        """The record at a commitlog offset only the tier holds, as ``CommitLog.read`` gives a
        local one (a link unresolved). Blocks on the network unless its blocks are cached:
        ``cold_pops`` reads them on the read workers before the store's ``put_link`` asks."""
        return self.reader.record_at(offset)[0]

    def record_link_origin(self, offset: int) -> tuple[int, int]:
        """(origin offset, origin size) of a link record only the tier holds; (-1, 0) otherwise."""
        return self.reader.record_at(offset)[1]

    async def run_cold(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the read workers, once the tier's manifests were read since start
        (waiting up to ``LIST_WAIT_S``; after that the tier answers with what it knows)."""

        def run() -> T:
            if not self.uploader.listed:
                self.uploader.wait_listed(LIST_WAIT_S)
            return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(self._read_pool, run)

    async def get_async(
        self, topic: str, queue_id: int, offset: int, max_count: int, msg_filter: "MessageFilter | None" = None
    ) -> GetResult | None:
        """A get below the local minimum, served from the tier on its read workers
        (see :meth:`TierReader.get`: None when the tier holds nothing for it)."""
        return await self.run_cold(self.reader.get, topic, queue_id, offset, max_count, msg_filter)

    async def get_local_async(
        self, topic: str, queue_id: int, offset: int, max_count: int, msg_filter: "MessageFilter | None" = None
    ) -> GetResult:
        """``MessageStore.get`` of the local queue, except that a link whose origin only the tier
        still holds (a retry or timer record newer than the message it delivers) is delivered,
        not skipped. The local read runs here, on the caller's (event loop) thread, as without a
        tier; only a batch that meets such a link is read again on the tier's read workers."""
        try:
            return self.store.get(topic, queue_id, offset, max_count, msg_filter, self.reader.read_local)
        except ColdOrigin:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._read_pool, self.store.get, topic, queue_id, offset, max_count, msg_filter, self.reader.read_phys
            )

    async def offset_for_timestamp_async(self, topic: str, queue_id: int, ts_ms: int) -> int:
        """The first queue offset stored at or after ``ts_ms``, in the tier or locally; tier
        lookups run on the read workers (none at all for a time newer than the tier's data)."""
        cold = await self.run_cold(self.reader.offset_for_timestamp, topic, queue_id, ts_ms)
        return cold if cold is not None else self.store.offset_for_timestamp(topic, queue_id, ts_ms)

    async def query_by_id_async(self, message_id: str) -> StoredMessage | None:
        """A message by id (server-assigned or client-chosen) from the tier, on the read workers (see
        :meth:`TierReader.query_by_id`)."""
        return await self.run_cold(self.reader.query_by_id, message_id)

    async def query_by_key_async(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int
    ) -> list[StoredMessage]:
        """Messages by key from segments only the tier holds, on the read workers (see
        :meth:`TierReader.query_by_key`)."""
        return await self.run_cold(self.reader.query_by_key, topic, key, begin_ms, end_ms, max_count)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The queue's oldest readable offset, in the tier or local (no network call)."""
        local = self.store.min_offset(topic, queue_id)
        tier = self.reader.min_offset(topic, queue_id)
        return local if tier is None else min(tier, local)

    def backlog(self) -> tuple[int, int]:
        """(segments, bytes) waiting for upload: the metric of a slow or absent object store."""
        return self.uploader.backlog()

    def run_expiry(self, now: float | None = None) -> int:
        """Apply tier retention now (the worker does this when idle): ``tier_retention_hours``,
        per topic its attribute of that name (see ``expiry``); return segments removed."""
        now = time.time() if now is None else now
        return expiry.expire(self.objects, self.uploader, self.store.store_id, int(now * 1000), self.topic_retention_hours)

    def topic_retention_hours(self, topic: str) -> float:
        """A topic's tier retention (0: for ever); a topic no longer configured has the global one."""
        tc = self.store.topics.get(topic) if topic else None
        return expiry.topic_hours(tc.attributes if tc else None, self.retention_hours, self.store.config.retention_hours)

    def _idle(self) -> None:
        if time.monotonic() - self._last_expiry >= self.expiry_interval_s:
            self._last_expiry = time.monotonic()
            self.run_expiry()

    def status(self) -> dict[str, Any]:
        """What is uploaded, what waits, and where the log starts in the tier and locally."""
        up = self.uploader
        segments, nbytes = up.backlog()
        in_tier = sorted(up.in_tier)
        return {
            "bucket": self.objects.bucket,
            "prefix": self.objects.prefix,
            "store_id": self.store.store_id,
            "listed": up.listed,
            "uploaded_segments": len(in_tier),
            "uploaded_this_run": up.uploaded,
            "pending_segments": segments,
            "pending_bytes": nbytes,
            "oldest_tier_offset": in_tier[0] if in_tier else None,
            "oldest_local_offset": self.store.commitlog.min_offset,
            "failures": up.failures,
            "last_error": up.last_error,
        }
