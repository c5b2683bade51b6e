"""DeadlineLoop: rounds run when due or when woken, never in a busy loop, and stop cleanly.

Each step here records its rounds and returns what the test scripts; the test
waits for a round with a bounded ``asyncio.wait_for`` rather than asserting
how long anything took.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

import pytest

from core_broker.deadline_loop import DeadlineLoop

pytestmark = pytest.mark.timeout(30)

HOUR = 3600.0


class Script:
    """A step that returns the scripted delays in turn (the last one forever) and counts rounds."""

    def __init__(self, *delays: float | None | BaseException) -> None:
        self.delays = deque(delays)
        self.rounds = 0
        self._changed = asyncio.Event()

    async def step(self) -> float | None:
        self.rounds += 1
        self._changed.set()
        d = self.delays.popleft() if len(self.delays) > 1 else self.delays[0]
        if isinstance(d, BaseException):
            raise d
        return d

    async def until(self, n: int, timeout: float = 10.0) -> None:
        async def reach() -> None:
            while self.rounds < n:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(reach(), timeout)

    async def settle(self) -> int:
        """Let the loop run whatever is ready now; the round count after that."""
        for _ in range(20):
            await asyncio.sleep(0)
        return self.rounds


@pytest.fixture
async def loops():
    made: list[DeadlineLoop] = []

    def start(script: Script, max_sleep_s: float = HOUR, first_delay_s: float = 0.0) -> DeadlineLoop:
        dl = DeadlineLoop("test-loop", script.step, max_sleep_s=max_sleep_s, first_delay_s=first_delay_s)
        dl.start()
        made.append(dl)
        return dl

    yield start
    for dl in made:
        await dl.stop()


async def test_nothing_pending_sleeps_until_woken(loops) -> None:
    s = Script(None)
    dl = loops(s)
    await s.until(1)
    assert await s.settle() == 1  # no further rounds while nothing is pending
    dl.wake()
    await s.until(2)
    assert await s.settle() == 2


async def test_wakes_coalesce_into_one_round(loops) -> None:
    s = Script(None)
    dl = loops(s)
    await s.until(1)
    for _ in range(5):
        dl.wake()  # cheap on hot paths: already woken
    await s.until(2)
    assert await s.settle() == 2


async def test_a_wake_during_a_round_runs_another_round() -> None:
    gate = asyncio.Event()
    rounds = 0
    dl: DeadlineLoop

    async def step() -> float | None:
        nonlocal rounds
        rounds += 1
        if rounds == 1:
            await gate.wait()  # a deadline is added (wake) while this round runs
        return None

    dl = DeadlineLoop("t", step, max_sleep_s=HOUR)
    dl.start()
    try:
        for _ in range(5):
            await asyncio.sleep(0)
        assert rounds == 1
        dl.wake()
        gate.set()
        for _ in range(50):
            await asyncio.sleep(0)
            if rounds == 2:
                break
        assert rounds == 2, "the wake that came during the round was lost"
    finally:
        await dl.stop()


async def test_a_due_step_runs_again_without_waiting(loops) -> None:
    s = Script(0.0, 0.0, None)
    loops(s)
    await s.until(3)  # two rounds that said "due now", then idle
    assert await s.settle() == 3


async def test_the_next_round_comes_when_its_delay_is_over(loops) -> None:
    s = Script(0.05, None)
    loops(s)
    await s.until(2)  # nobody woke it: the 50 ms deadline did


async def test_max_sleep_bounds_a_long_delay(loops) -> None:
    s = Script(HOUR, None)
    loops(s, max_sleep_s=0.05)
    await s.until(2)  # without the bound this would be an hour away


async def test_an_earlier_deadline_wakes_a_long_sleep(loops) -> None:
    s = Script(HOUR)
    dl = loops(s)
    await s.until(1)
    dl.wake()
    await s.until(2)


async def test_a_failing_round_is_logged_and_retried_after_max_sleep(loops, caplog) -> None:
    s = Script(RuntimeError("boom"), None)
    with caplog.at_level(logging.ERROR, logger="unimq.broker"):
        loops(s, max_sleep_s=0.05)
        await s.until(2)  # retried by itself, not dead and not spinning
    assert any("test-loop round failed" in r.getMessage() for r in caplog.records)
    assert await s.settle() == 2


async def test_first_delay_holds_back_the_first_round(loops) -> None:
    s = Script(None)
    dl = loops(s, first_delay_s=HOUR)
    assert await s.settle() == 0
    dl.wake()  # even a wake waits for the first delay
    assert await s.settle() == 0


async def test_first_delay_then_rounds(loops) -> None:
    s = Script(None)
    loops(s, first_delay_s=0.05)
    await s.until(1)


async def test_stop_ends_the_task_and_can_be_called_again() -> None:
    s = Script(0.01)
    dl = DeadlineLoop("t", s.step, max_sleep_s=HOUR)
    dl.start()
    await s.until(2)
    task = dl._task
    await asyncio.wait_for(dl.stop(), 5)
    assert task is not None and task.done()
    n = s.rounds
    await asyncio.sleep(0.05)
    assert s.rounds == n  # no round after stop
    await dl.stop()  # a second stop (or one without start) is a no-op


async def test_stop_while_woken_does_not_hang() -> None:
    """A cancel arriving as the event is set must still end the task."""
    s = Script(HOUR)
    dl = DeadlineLoop("t", s.step, max_sleep_s=HOUR)
    dl.start()
    await s.until(1)
    dl.wake()
    await asyncio.wait_for(dl.stop(), 5)


async def test_stop_without_start() -> None:
    await DeadlineLoop("t", Script(None).step, max_sleep_s=1.0).stop()
