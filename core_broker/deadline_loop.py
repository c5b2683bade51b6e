"""A background task that sleeps until its next deadline or until it is woken.

The broker's time-driven services (timers firing, in-flight messages reviving,
transactions being checked back) each hold a set of deadlines. Polling them on
a fixed short period costs CPU on an idle broker and makes every deadline late
by up to that period. Instead each service runs one ``DeadlineLoop``: a round
(``step``) does what is due and returns how long until the next thing is due,
or ``None`` when nothing is pending at all; the loop sleeps that long. Whoever
adds a deadline earlier than the one the loop sleeps towards calls ``wake()``
(a no-op when already woken, so cheap on hot paths).

``max_sleep_s`` bounds one sleep while something is pending: deadlines are
wall-clock milliseconds (they survive restarts) but the loop sleeps on the
monotonic clock, so a wall-clock step forward could otherwise make a due
deadline wait out the whole computed sleep.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

log = logging.getLogger("unimq.broker")

# A step returns seconds until its next deadline, or None: nothing pending until woken.
Step = Callable[[], Awaitable[float | None]]


class DeadlineLoop:
    def __init__(self, name: str, step: Step, max_sleep_s: float, first_delay_s: float = 0.0) -> None:
        self.name = name
        self._step = step
        self.max_sleep_s = max_sleep_s
        self.first_delay_s = first_delay_s  # before the first round (give the rest of start-up a moment)
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Run a round now (something was added that may be due before the current sleep ends)."""
        self._event.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        event = self._event
        if self.first_delay_s > 0:
            await asyncio.sleep(self.first_delay_s)
        while True:
            event.clear()  # before the round: a wake() during it runs another round
            try:
                delay = await self._step()
            except Exception:  # keep serving; retry after a pause, not in a tight loop
                log.exception("%s round failed", self.name)
                delay = self.max_sleep_s
            if delay is None:
                await event.wait()
                continue
            delay = min(delay, self.max_sleep_s)
            if delay <= 0:
                await asyncio.sleep(0)  # due already: go again, letting other tasks run first
                continue
            try:
                # Not wait_for: on Python 3.11 it swallows a cancel() that arrives as the
                # event is set, and stop() then hangs.
                async with asyncio.timeout(delay):
                    await event.wait()
            except TimeoutError:
                pass
