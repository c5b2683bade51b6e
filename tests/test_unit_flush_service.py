"""FlushService on its own: its flush thread driven by callbacks this test controls.

The commitlog is stood in for by a write position (``Log.pos``) and an fdatasync that
blocks until the test hands it a permit, so a test decides exactly when each flush
round's sync returns and can see who is released by which round. The service under
test is the real one, with its real thread, condition and loop callbacks.
"""

from __future__ import annotations

import asyncio
import queue
import threading

import pytest

from core_broker.flush_service import FlushService
from store_helpers import wait_until

pytestmark = pytest.mark.timeout(30)

LONG_MS = 3_600_000  # an interval that never elapses within a test


class Log:
    """The commitlog as the flush service sees it: a write position and a gated fdatasync."""

    def __init__(self, gated: bool = True) -> None:
        self.pos = 0
        self.gated = gated
        self.entered: queue.Queue[int] = queue.Queue()  # the position each sync started at
        self.permits: queue.Queue[BaseException | None] = queue.Queue()  # None: return; else raise
        self.synced: list[int] = []  # position each completed sync covered
        self.snapshots = 0
        self.checkpoints: list[int] = []

    def snapshot(self) -> int:
        self.snapshots += 1
        return self.pos

    def sync(self) -> None:
        at = self.pos
        self.entered.put(at)
        if self.gated:
            outcome = self.permits.get(timeout=20)
            if outcome is not None:
                raise outcome
        self.synced.append(at)

    def checkpoint(self, safe: int) -> None:
        self.checkpoints.append(safe)

    def next_sync(self) -> int:
        """Wait until the flush thread is inside a sync; the position it covers."""
        return self.entered.get(timeout=10)


def make(log: Log, *, sync_mode: bool = True, interval_ms: int = LONG_MS, checkpoint_interval_ms: int = LONG_MS,
         **kw) -> FlushService:
    return FlushService(
        sync_mode=sync_mode,
        interval_ms=interval_ms,
        checkpoint_interval_ms=checkpoint_interval_ms,
        snapshot=log.snapshot,
        sync_commitlog=log.sync,
        checkpoint=log.checkpoint,
        **kw,
    )


@pytest.fixture
def services():
    """FlushServices started by a test; stopped at teardown (the gate opened for good)."""
    made: list[tuple[FlushService, Log]] = []

    def start(log: Log, flushed: int = 0, **kw) -> FlushService:
        fs = make(log, **kw)
        fs.start(flushed)
        made.append((fs, log))
        return fs

    yield start
    for fs, log in made:
        log.gated = False
        for _ in range(8):
            log.permits.put(None)
        fs.stop()


class Waiter(threading.Thread):
    """A writer thread blocked in ``FlushService.wait``; its outcome is kept."""

    def __init__(self, fs: FlushService, offset: int, timeout: float = 20.0) -> None:
        super().__init__(daemon=True)
        self.fs, self.offset, self.timeout = fs, offset, timeout
        self.result: bool | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.fs.wait(self.offset, self.timeout)
        except BaseException as e:
            self.error = e

    def finished(self) -> bool:
        self.join(10)
        return not self.is_alive()


# --------------------------------------------------------------------------- sync mode: group commit


def test_a_waiter_is_released_only_by_the_flush_that_covers_its_offset(services) -> None:
    log = Log()
    fs = services(log)
    log.pos = 100
    a = Waiter(fs, 100)
    assert log.next_sync() == 100  # the waiter woke the flusher; it syncs what is written
    log.pos = 250  # a second writer while that fdatasync runs
    b = Waiter(fs, 250)
    assert a.is_alive() and b.is_alive()  # nobody is released before the sync returns
    log.permits.put(None)
    assert a.finished() and a.result is True
    assert log.next_sync() == 250  # the next round is for b; it is blocked in its sync
    assert fs.flushed == 100
    assert b.is_alive(), "a flush up to 100 must not release a write ending at 250"
    log.permits.put(None)
    assert b.finished() and b.result is True
    assert fs.flushed == 250
    assert log.synced == [100, 250]


def test_writers_arriving_during_one_fdatasync_share_the_next_one(services) -> None:
    log = Log()
    fs = services(log)
    log.pos = 10
    first = Waiter(fs, 10)
    assert log.next_sync() == 10
    # five more writers pile up while the first fdatasync runs
    group = []
    for end in (20, 30, 40, 50, 60):
        log.pos = end
        group.append(Waiter(fs, end))
    log.permits.put(None)
    assert first.finished()
    assert log.next_sync() == 60  # one sync for the whole pile
    assert all(w.is_alive() for w in group)
    log.permits.put(None)
    assert all(w.finished() and w.result is True for w in group)
    assert log.synced == [10, 60]


def test_wait_returns_at_once_when_already_flushed(services) -> None:
    log = Log()
    log.pos = 500
    fs = services(log, flushed=500)  # the store's write position at start is durable
    assert fs.wait(500) is True
    assert fs.wait(0) is True
    assert log.entered.empty()  # no round was needed


def test_wait_times_out_with_false_while_the_disk_does_not_answer(services) -> None:
    log = Log()
    fs = services(log)
    log.pos = 64
    assert fs.wait(64, timeout=0.2) is False
    assert fs.flushed < 64


async def test_futures_and_notify_callbacks_are_settled_on_their_loop_once_covered(services) -> None:
    log = Log()
    fs = services(log)
    loop = asyncio.get_running_loop()
    log.pos = 40
    covered = fs.future(40)
    beyond = fs.future(80)  # a position not written yet: must stay pending
    seen: list[tuple[BaseException | None, int]] = []
    fs.notify(40, loop, lambda exc: seen.append((exc, threading.get_ident())))
    assert await asyncio.to_thread(log.next_sync) == 40
    assert not covered.done() and not seen
    log.permits.put(None)
    await asyncio.wait_for(covered, 10)
    assert covered.result() is None
    assert seen == [(None, threading.get_ident())]  # run on the loop's thread, not the flush thread
    assert not beyond.done()
    log.pos = 80
    fs.notify(80, loop, lambda exc: None)  # a later writer wakes the flusher
    assert await asyncio.to_thread(log.next_sync) == 80
    log.permits.put(None)
    await asyncio.wait_for(beyond, 10)


async def test_future_and_notify_complete_immediately_when_already_flushed(services) -> None:
    log = Log()
    log.pos = 100
    fs = services(log, flushed=100)
    fut = fs.future(100)
    assert fut.done() and fut.result() is None
    calls: list[BaseException | None] = []
    fs.notify(99, asyncio.get_running_loop(), calls.append)
    assert calls == [None]  # synchronously: no hop through the flush thread


# --------------------------------------------------------------------------- a failing disk


def test_a_failed_fdatasync_fails_its_waiters_and_the_next_success_clears_it(services) -> None:
    log = Log()
    fs = services(log)
    log.pos = 30
    w = Waiter(fs, 30)
    assert log.next_sync() == 30
    log.permits.put(OSError(5, "EIO"))
    assert w.finished()
    assert isinstance(w.error, OSError) and w.error.errno == 5
    assert fs.flushed == 0  # nothing was made durable
    # the disk recovers: a later write is flushed and acknowledged normally
    log.pos = 60
    w2 = Waiter(fs, 60)
    assert log.next_sync() == 60
    log.permits.put(None)
    assert w2.finished() and w2.result is True and w2.error is None


def test_an_error_from_a_round_before_a_wait_is_not_that_writes_error(services) -> None:
    log = Log()
    fs = services(log)
    log.pos = 10
    w = Waiter(fs, 10)
    assert log.next_sync() == 10
    log.permits.put(OSError("disk gone"))
    assert w.finished() and isinstance(w.error, OSError)
    # the service still remembers the error, but a new writer waits for a round of its own
    log.pos = 20
    w2 = Waiter(fs, 20)
    assert log.next_sync() == 20
    assert w2.is_alive()  # not failed by the earlier round's error
    log.permits.put(None)
    assert w2.finished() and w2.result is True


async def test_a_failed_fdatasync_fails_pending_futures(services) -> None:
    log = Log()
    fs = services(log)
    log.pos = 70
    fut = fs.future(70)
    assert await asyncio.to_thread(log.next_sync) == 70
    log.permits.put(OSError("EIO"))
    with pytest.raises(OSError, match="EIO"):
        await asyncio.wait_for(fut, 10)


async def test_a_waiter_on_a_closed_loop_does_not_cost_the_others_their_release(services) -> None:
    log = Log(gated=False)
    fs = services(log)
    dead = asyncio.new_event_loop()
    dead.close()
    log.pos = 10
    fs.notify(10, dead, lambda exc: None)  # its writer's loop is gone before the flush
    live = fs.future(10)  # released by the same round, after the closed loop's turn
    await asyncio.wait_for(live, 10)
    assert live.result() is None
    log.pos = 20
    assert await asyncio.to_thread(fs.wait, 20) is True  # the flush thread carries on


# --------------------------------------------------------------------------- async mode, checkpoints, stop


def test_async_mode_flushes_every_interval_without_being_woken(services) -> None:
    log = Log(gated=False)
    fs = services(log, sync_mode=False, interval_ms=5)
    log.pos = 123
    assert wait_until(lambda: fs.flushed == 123)  # no writer waited: the interval did it
    log.pos = 456
    assert wait_until(lambda: fs.flushed == 456)
    assert log.synced[-1] == 456
    assert sorted(set(log.synced)) == log.synced  # each sync covers more, none repeated


def test_no_fdatasync_while_nothing_new_was_written(services) -> None:
    log = Log(gated=False)
    log.pos = 50
    fs = services(log, flushed=50, sync_mode=False, interval_ms=2)
    n = log.snapshots
    assert wait_until(lambda: log.snapshots >= n + 10)  # ten idle rounds
    assert log.synced == []


def test_checkpoint_follows_the_flush_and_an_idle_store_is_not_checkpointed_again(services) -> None:
    log = Log(gated=False)
    fs = services(log, sync_mode=False, interval_ms=2, checkpoint_interval_ms=0)
    log.pos = 100
    assert wait_until(lambda: log.checkpoints[-1:] == [100])
    assert fs.flushed >= 100  # a checkpoint never claims more than was synced
    n = log.snapshots
    assert wait_until(lambda: log.snapshots >= n + 10)  # ten idle rounds
    assert log.checkpoints.count(100) == 1
    log.pos = 180
    assert wait_until(lambda: log.checkpoints[-1:] == [180])


def test_checkpoint_waits_for_its_interval(services) -> None:
    log = Log(gated=False)
    fs = services(log, sync_mode=False, interval_ms=2)  # checkpoint interval: an hour
    log.pos = 100
    assert wait_until(lambda: fs.flushed == 100)
    n = log.snapshots
    assert wait_until(lambda: log.snapshots >= n + 5)
    assert log.checkpoints == []


def test_stop_makes_a_final_flush_and_checkpoint_then_the_thread_ends() -> None:
    log = Log(gated=False)
    fs = make(log, sync_mode=False)  # intervals of an hour: only stop() flushes
    fs.start(0)
    log.pos = 777
    fs.stop()
    assert log.synced == [777]
    assert log.checkpoints == [777]
    assert fs.flushed == 777
    assert not fs._thread.is_alive()


def test_stop_checkpoints_even_when_the_last_checkpoint_still_holds() -> None:
    log = Log(gated=False)
    log.pos = 20
    fs = make(log, sync_mode=False, interval_ms=2, checkpoint_interval_ms=0)
    fs.start(20)
    assert wait_until(lambda: log.checkpoints == [20])
    fs.stop()
    assert log.checkpoints == [20, 20]  # the clean shutdown's checkpoint is always written


def test_stop_of_a_service_never_started_returns() -> None:
    make(Log()).stop()


# --------------------------------------------------------------------------- prepare and warm-up callbacks


def test_prepare_runs_between_rounds_and_a_failing_one_is_dropped(services) -> None:
    log = Log(gated=False)
    calls: list[int] = []

    def prepare() -> bool:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("no space for the next segment")
        return len(calls) == 1  # made a segment the first time only

    fs = services(log, sync_mode=False, interval_ms=2, prepare=prepare)
    assert wait_until(lambda: len(calls) >= 3)
    n = log.snapshots
    assert wait_until(lambda: log.snapshots >= n + 5)  # the flusher keeps running
    assert len(calls) == 3  # not called again after it failed
    assert fs.prepared == 1
    log.pos = 9
    assert wait_until(lambda: fs.flushed == 9)


def test_a_warm_up_sync_covering_a_write_releases_its_waiter_without_a_commitlog_sync(services) -> None:
    log = Log()  # a commitlog fdatasync would block: none may be needed here
    in_warm = threading.Event()
    gate = threading.Event()

    def warm() -> int | None:
        in_warm.set()
        gate.wait(20)
        return log.pos  # its fdatasync covered everything written so far

    fs = services(log, warm=warm)
    assert in_warm.wait(10)  # the first round found nothing to flush and is warming
    log.pos = 300  # a record written while the warm-up's fdatasync runs
    gate.set()
    assert wait_until(lambda: fs.flushed == 300)
    assert fs.wait(300) is True
    assert fs.warm_syncs >= 1
    assert log.entered.empty()


def test_a_failing_warm_up_is_dropped_and_flushing_goes_on(services) -> None:
    log = Log(gated=False)
    calls: list[int] = []

    def warm() -> int | None:
        calls.append(1)
        raise OSError("ENOSPC")

    fs = services(log, warm=warm)
    log.pos = 11
    assert fs.wait(11) is True
    log.pos = 22
    assert fs.wait(22) is True
    assert calls == [1]
    assert fs.warm_syncs == 0


def test_fdatasync_latency_is_counted_in_one_bucket_per_sync(services) -> None:
    log = Log(gated=False)
    fs = services(log)
    for end in (1, 2, 3):
        log.pos = end
        assert fs.wait(end)
    assert sum(fs.sync_counts) == 3 == len(log.synced)
    assert len(fs.sync_counts) == len(FlushService.SYNC_BUCKETS_S) + 1
    assert fs.sync_seconds >= 0.0
