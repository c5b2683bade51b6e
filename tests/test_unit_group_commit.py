"""GroupCommit on its own, over a real MessageStore opened with ``--flush sync``.

The group commit writes through the store's appender and commitlog; it is
settled by a flush service. Here that flush service is a real ``FlushService``
whose fdatasync waits for the test's permission, so a test sees the group
written (readable in the store) but not yet acknowledged, then acknowledged by
the one flush that covers it. The write lock handed to it counts acquisitions:
a group is written under one.
"""

from __future__ import annotations

import asyncio
import queue
import threading

import pytest

from core_broker.config import FlushMode
from core_broker.errors import MessageTooLargeError
from core_broker.flush_service import FlushService
from core_broker.group_commit import GroupCommit
from core_broker.message_store import MessageStore
from core_broker.model import Message, PutStatus
from store_helpers import read_all, stores  # noqa: F401  (stores is a fixture)

pytestmark = pytest.mark.timeout(60)


class CountingLock:
    """The store's write lock, counting how often it is taken."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.acquired = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self.acquired += 1

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class GatedFlush:
    """A FlushService over the store's commitlog whose fdatasync returns when the test says."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.entered: queue.Queue[int] = queue.Queue()
        self.permits: queue.Queue[BaseException | None] = queue.Queue()
        self.syncs = 0
        self.service = FlushService(
            sync_mode=True,
            interval_ms=3_600_000,
            checkpoint_interval_ms=3_600_000,
            snapshot=lambda: store.write_pos,
            sync_commitlog=self._sync,
            checkpoint=lambda safe: None,
        )
        self.service.start(store.write_pos)

    def _sync(self) -> None:
        self.entered.put(self.store.write_pos)
        outcome = self.permits.get(timeout=30)
        if outcome is not None:
            raise outcome
        self.store.commitlog.sync()
        self.syncs += 1

    async def next_sync(self) -> int:
        return await asyncio.to_thread(self.entered.get, True, 10)

    def close(self) -> None:
        for _ in range(8):
            self.permits.put(None)
        self.service.stop()


@pytest.fixture
def sync_store(stores) -> MessageStore:  # noqa: F811
    return stores.open(flush=FlushMode.SYNC)


@pytest.fixture
def gated(sync_store: MessageStore):
    g = GatedFlush(sync_store)
    yield g
    g.close()


def make(store: MessageStore, flush: GatedFlush) -> tuple[GroupCommit, CountingLock]:
    lock = CountingLock(store._lock)
    return GroupCommit(lock, store.appender, store.commitlog, lambda: flush.service), lock  # type: ignore[arg-type]


def msg(i: int, size: int = 32, queue_id: int = 0) -> Message:
    return Message("gc", bytes([65 + i % 26]) * size, queue_id=queue_id, tag=f"m{i}")


async def test_concurrent_puts_are_written_as_one_group_and_settled_after_its_flush(
    sync_store: MessageStore, gated: GatedFlush
) -> None:
    gc, lock = make(sync_store, gated)
    start = sync_store.write_pos
    tasks = [asyncio.create_task(gc.put(msg(i))) for i in range(5)]
    end = await gated.next_sync()  # the group is written and the flush thread is syncing it
    assert lock.acquired == 1  # one lock acquisition for all five writes
    stored = read_all(sync_store, "gc", 0)
    assert [m.tag for m in stored] == [f"m{i}" for i in range(5)]  # in the order they were put
    assert end == sync_store.write_pos > start
    for _ in range(5):
        await asyncio.sleep(0)
    assert not any(t.done() for t in tasks), "acknowledged before the fdatasync returned"
    gated.permits.put(None)
    results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert gated.syncs == 1  # one fdatasync settled the whole group
    assert [r.status for r in results] == [PutStatus.PUT_OK] * 5
    assert [r.queue_offset for r in results] == [m.queue_offset for m in stored]
    assert [r.commitlog_offset for r in results] == [m.commitlog_offset for m in stored]
    assert results[-1].commitlog_offset + results[-1].store_size == end


async def test_a_put_after_a_group_was_written_goes_into_the_next_group(
    sync_store: MessageStore, gated: GatedFlush
) -> None:
    gc, lock = make(sync_store, gated)
    first = asyncio.create_task(gc.put(msg(0)))
    end1 = await gated.next_sync()
    second = asyncio.create_task(gc.put(msg(1)))  # while the first group's fdatasync runs
    while lock.acquired < 2:  # the second group is written on its own
        await asyncio.sleep(0.005)
    gated.permits.put(None)
    r1 = await asyncio.wait_for(first, 10)
    assert r1.commitlog_offset + r1.store_size == end1
    for _ in range(5):
        await asyncio.sleep(0)
    assert not second.done(), "a flush ending before a write must not acknowledge it"
    end2 = await gated.next_sync()
    gated.permits.put(None)
    r2 = await asyncio.wait_for(second, 10)
    assert r2.commitlog_offset + r2.store_size == end2 > end1


async def test_a_put_cancelled_before_its_group_is_written_is_not_stored(
    sync_store: MessageStore, gated: GatedFlush
) -> None:
    gc, lock = make(sync_store, gated)
    start = sync_store.write_pos
    tasks = [asyncio.create_task(gc.put(msg(i))) for i in range(3)]
    await asyncio.sleep(0)  # every task queued its put; the group's drain runs next
    assert sync_store.write_pos == start and lock.acquired == 0, "the group was written too early for this test"
    tasks[1].cancel()
    await gated.next_sync()
    gated.permits.put(None)
    r0, r2 = await asyncio.wait_for(asyncio.gather(tasks[0], tasks[2]), 10)
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]
    assert [m.tag for m in read_all(sync_store, "gc", 0)] == ["m0", "m2"]
    assert (r0.queue_offset, r2.queue_offset) == (0, 1)


async def test_a_put_cancelled_after_its_group_was_written_stays_stored_and_the_rest_are_settled(
    sync_store: MessageStore, gated: GatedFlush
) -> None:
    gc, _ = make(sync_store, gated)
    tasks = [asyncio.create_task(gc.put(msg(i))) for i in range(3)]
    await gated.next_sync()
    tasks[0].cancel()  # its writer gave up waiting: the record is already in the log
    gated.permits.put(None)
    r1, r2 = await asyncio.wait_for(asyncio.gather(tasks[1], tasks[2]), 10)
    assert (r1.queue_offset, r2.queue_offset) == (1, 2)
    assert [m.tag for m in read_all(sync_store, "gc", 0)] == ["m0", "m1", "m2"]


async def test_a_failing_message_fails_only_its_writer(sync_store: MessageStore, gated: GatedFlush) -> None:
    gc, _ = make(sync_store, gated)
    too_big = Message("gc", b"x" * (sync_store.config.max_message_size + 1), queue_id=0, tag="big")
    tasks = [
        asyncio.create_task(gc.put(msg(0))),
        asyncio.create_task(gc.put(too_big)),
        asyncio.create_task(gc.put(msg(2))),
    ]
    await gated.next_sync()
    gated.permits.put(None)
    outcomes = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    assert isinstance(outcomes[1], MessageTooLargeError)
    assert outcomes[0].status == outcomes[2].status == PutStatus.PUT_OK
    stored = read_all(sync_store, "gc", 0)
    assert [m.tag for m in stored] == ["m0", "m2"]
    assert [outcomes[0].commitlog_offset, outcomes[2].commitlog_offset] == [m.commitlog_offset for m in stored]


async def test_a_failed_flush_fails_every_writer_of_the_group(sync_store: MessageStore, gated: GatedFlush) -> None:
    gc, _ = make(sync_store, gated)
    tasks = [asyncio.create_task(gc.put(msg(i))) for i in range(3)]
    await gated.next_sync()
    gated.permits.put(OSError(5, "EIO"))
    outcomes = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    assert all(isinstance(o, OSError) and o.errno == 5 for o in outcomes)


async def test_puts_from_two_loops_form_separate_groups(sync_store: MessageStore, gated: GatedFlush) -> None:
    gc, lock = make(sync_store, gated)

    def other_loop() -> list:
        async def run() -> list:
            return await asyncio.gather(*(gc.put(msg(10 + i, queue_id=1)) for i in range(3)))

        return asyncio.run(run())

    here = [asyncio.create_task(gc.put(msg(i))) for i in range(3)]
    there = asyncio.create_task(asyncio.to_thread(other_loop))
    gated.permits.put(None)
    gated.permits.put(None)
    rs_here = await asyncio.wait_for(asyncio.gather(*here), 20)
    rs_there = await asyncio.wait_for(there, 20)
    assert [r.queue_offset for r in rs_here] == [0, 1, 2]
    assert [r.queue_offset for r in rs_there] == [0, 1, 2]
    assert [m.tag for m in read_all(sync_store, "gc", 1)] == ["m10", "m11", "m12"]
    assert lock.acquired == 2  # one group per loop


async def test_the_stores_put_async_is_durable_when_it_returns(stores) -> None:  # noqa: F811
    """Through MessageStore.put_async (the store's own flush service): the fdatasync ran first."""
    s = stores.open(flush=FlushMode.SYNC)
    results = await asyncio.gather(*(s.put_async(msg(i)) for i in range(20)))
    last = results[-1]
    assert s.flushed_pos() >= last.commitlog_offset + last.store_size
    assert [r.queue_offset for r in results] == list(range(20))
