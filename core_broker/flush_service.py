"""Flushing the commitlog: periodic (async mode) or group commit (sync mode).

One background thread owns every fdatasync, so the event loop never blocks on
the disk. In sync mode a writer registers the offset its record ends at and
waits (a thread on a condition, a coroutine on a future); the flusher syncs
everything written so far in one fdatasync and releases every waiter it
covers. While one fdatasync runs, new writers pile up for the next, which is
what makes group commit scale with concurrency.

The same thread creates the next commitlog segment before the writer needs it
(``prepare``: see ``CommitLog.prepare_next``), so a roll does not allocate a
segment under the put lock. In sync mode it also warms the commitlog ahead of the writer
(``warm``: see ``CommitLog.warm_step``), between rounds: on this thread the
warm-up's own slow fdatasync never runs concurrently with a group commit's, so
a group commit never pays for converting the warm-up's extents.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
import time
from typing import Callable

log = logging.getLogger("unimq.store")
WARM_STEPS_PER_ROUND = 16  # warm-up pieces in one round while no writer waits


def _run_all(callbacks: list[Callable[[BaseException | None], None]], exc: BaseException | None) -> None:
    for cb in callbacks:
        cb(exc)


def _settle(fut: asyncio.Future, exc: BaseException | None) -> None:
    if not fut.done():
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


class FlushService:
    # Upper bounds (seconds) of the fdatasync latency histogram the HTTP door's /metrics shows.
    SYNC_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

    def __init__(
        self,
        *,
        sync_mode: bool,
        interval_ms: int,
        checkpoint_interval_ms: int,
        snapshot: Callable[[], int],
        sync_commitlog: Callable[[], None],
        checkpoint: Callable[[int], None],
        warm: Callable[[], int | None] | None = None,
        prepare: Callable[[], bool] | None = None,
    ) -> None:
        self.sync_mode = sync_mode
        self.interval = interval_ms / 1000.0
        self.checkpoint_interval = checkpoint_interval_ms / 1000.0
        self._snapshot = snapshot  # commitlog write position, taken under the put lock
        self._sync_commitlog = sync_commitlog
        self._checkpoint = checkpoint
        self._warm = warm  # one warm-up piece; returns the write position its fdatasync covered
        self._prepare = prepare  # make the next commitlog segment ahead of the roll
        self.prepared = 0
        self.warm_syncs = 0
        self.warm_seconds = 0.0
        self.flushed = 0
        self.sync_counts = [0] * (len(self.SYNC_BUCKETS_S) + 1)  # per bucket, last one is +Inf
        self.sync_seconds = 0.0
        self._work = threading.Event()
        self._cv = threading.Condition()
        # (offset, loop, callback): the callback runs on its loop once offset is durable (None)
        # or the flush failed (the exception).
        self._async_waiters: list[tuple[int, asyncio.AbstractEventLoop, Callable[[BaseException | None], None]]] = []
        self._waiter_lock = threading.Lock()
        self._stop = False
        self._error: BaseException | None = None
        self._failures = 0  # flush rounds that failed so far; a waiter only sees later ones
        self._thread = threading.Thread(target=self._run, name="unimq-flush", daemon=True)

    def start(self, flushed: int) -> None:
        self.flushed = flushed
        self._thread.start()

    # -- writers -------------------------------------------------------------------

    def wait(self, offset: int, timeout: float = 5.0) -> bool:
        """Block the calling thread until ``offset`` is on disk (sync mode)."""
        if self.flushed >= offset:
            return True
        seen = self._failures  # an error from a round before this wait is not this write's
        self._work.set()
        deadline = time.monotonic() + timeout
        with self._cv:
            while self.flushed < offset:
                if self._error is not None and self._failures != seen:
                    raise self._error
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def future(self, offset: int) -> asyncio.Future:
        """A future on the running loop completed once ``offset`` is on disk."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if self.flushed >= offset:
            fut.set_result(None)
            return fut
        self.notify(offset, loop, lambda exc: _settle(fut, exc))
        return fut

    def notify(self, offset: int, loop: asyncio.AbstractEventLoop, callback: Callable[[BaseException | None], None]) -> None:
        """Run ``callback(None)`` on ``loop`` once ``offset`` is on disk, ``callback(exc)`` if the flush fails.

        One hop from the flush thread to the loop: the put path's group of writers
        is settled by this callback directly, not through an intermediate future
        whose done-callbacks would cost another loop iteration per group commit.
        """
        if self.flushed >= offset:
            callback(None)
            return
        with self._waiter_lock:
            self._async_waiters.append((offset, loop, callback))
        if not self._work.is_set():  # set() takes a lock and notifies: skip it when pending anyway
            self._work.set()

    # -- the flusher thread ---------------------------------------------------------

    def _run(self) -> None:
        last_cp = time.monotonic()
        cp_safe: int | None = None  # the offset the last checkpoint made durable
        warming = self._warm is not None
        while True:
            # Sync mode's writers wake this thread themselves; the short period only paces
            # the warm-up while it has work left (idle, the thread wakes every interval).
            self._work.wait(min(self.interval, 0.05) if self.sync_mode and warming else self.interval)
            self._work.clear()
            stop = self._stop
            try:
                target = self._snapshot()
                if target > self.flushed:
                    t0 = time.perf_counter()
                    self._sync_commitlog()
                    dt = time.perf_counter() - t0
                    self.sync_seconds += dt
                    self.sync_counts[bisect.bisect_left(self.SYNC_BUCKETS_S, dt)] += 1
                    self.flushed = target
                self._error = None
                self._release(target)
                if self._prepare is not None and not stop:
                    self._prepare_next()
                if self._warm is not None and not stop:
                    warming = self._warm_round()
                now = time.monotonic()
                # nothing written since the last checkpoint: it (and the indexes it syncs) still
                # holds, so an idle store does not rewrite and fsync it every interval
                if stop or (now - last_cp >= self.checkpoint_interval and target != cp_safe):
                    self._checkpoint(target)
                    cp_safe = target
                    last_cp = now
            except BaseException as e:  # a failing disk: fail the waiters, keep serving reads
                self._error = e
                self._fail(e)
            if stop:
                return

    def _prepare_next(self) -> None:
        try:
            if self._prepare():  # type: ignore[misc]
                self.prepared += 1
        except Exception:  # an optimisation: the roll makes the segment itself
            log.exception("preparing the next commitlog segment failed; continuing without it")
            self._prepare = None

    def _warm_round(self) -> bool:
        """A few warm-up pieces; the first always, more only while no writer waits.

        Returns whether the warm-up may have more to do (False once it is caught up).
        """
        for _ in range(WARM_STEPS_PER_ROUND):
            t0 = time.perf_counter()
            try:
                covered = self._warm()  # type: ignore[misc]
            except OSError:  # zeros are an optimisation: a failing disk shows up in the real syncs
                log.exception("commitlog warm-up failed; continuing without it")
                self._warm = None
                return False
            if covered is None:
                return False
            self.warm_syncs += 1
            self.warm_seconds += time.perf_counter() - t0
            if covered > self.flushed:  # the warm-up's fdatasync covered these records too
                self.flushed = covered
                self._release(covered)
            if self._work.is_set():
                return True
        return True

    def _release(self, target: int) -> None:
        with self._cv:
            self._cv.notify_all()
        if not self._async_waiters:
            return
        with self._waiter_lock:
            ready = [w for w in self._async_waiters if w[0] <= target]
            self._async_waiters = [w for w in self._async_waiters if w[0] > target]
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for _, loop, cb in ready:
            by_loop.setdefault(loop, []).append(cb)
        for loop, cbs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_run_all, cbs, None)
            except RuntimeError:  # loop closed: nobody waits any more
                pass

    def _fail(self, exc: BaseException) -> None:
        self._failures += 1
        with self._waiter_lock:
            waiters, self._async_waiters = self._async_waiters, []
        for _, loop, cb in waiters:
            try:
                loop.call_soon_threadsafe(_run_all, [cb], exc)
            except RuntimeError:
                pass
        with self._cv:
            self._cv.notify_all()

    def stop(self) -> None:
        """Final flush and checkpoint, then the thread ends."""
        self._stop = True
        self._work.set()
        if self._thread.is_alive():
            self._thread.join()
