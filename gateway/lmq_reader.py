"""One reader of light message queues (LMQs), for every door that keeps its own queues in them.

Why in ``gateway/``: an MQTT QoS 1/2 subscription and an AMQP queue are both an
LMQ that one door-side reader walks: messages just stored are handed on from
memory, what memory could not hold is read back from the store, and progress
is an acknowledged floor that survives a restart. The parts:

- :class:`Lane`: one broker's part of an LMQ. In the separated deployment a
  message's LMQ entry is written by the broker that stored it, so one LMQ has a
  part (its own offsets, from 0) on every broker that took a matching publish;
  merged mode has one. A lane knows the end of what was stored in it and its
  *settled floor*: the lowest offset not yet settled (acknowledged, dropped,
  dead-lettered), with what was settled out of order above it.
- :class:`SpillLane`: a lane of a queue with several consumers (an AMQP queue):
  its messages go to the door's own ready buffer (taken and acknowledged in any
  order) until that is full; from ``spill_next`` on they stay in the store and
  are read back in order.
- :class:`WindowedLane`: a lane read in order by one consumer, with a window of
  just-stored messages held in memory under a :class:`MemoryBudget` shared by
  all lanes of a door; gaps (what arrived while the budget was spent) are read
  back from the store up to the next entry held.
- :class:`LaneRuns`: the order messages were stored in *across* the lanes of one
  LMQ, so a read-back interleaves them the same way (runs of [lane, count]).
- :func:`pull_lane`: read a lane back from the store (making the LMQ known on
  that broker first, once); :class:`LanePulls` does it for many lanes, those
  asked in one event-loop turn on one broker travelling as one call.
- The durable floor, two ways: as a consumer group's committed offset
  (:func:`committed_floor`, :func:`commit_floor`: the floor only, what one
  in-order reader needs) or as a small JSON record the door keeps in the
  processor's key-value store (:meth:`Lane.to_json` / :meth:`Lane.restore`: the
  settled offsets above the floor too, for a queue acknowledged out of order).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable, Generic, Iterator, TypeVar

from core_broker.errors import TopicNotFoundError
from core_broker.model import GetResult
from gateway.api import ProcessorCalls
from gateway.context import RequestContext

__all__ = [
    "Lane",
    "WindowedLane",
    "SpillLane",
    "MemoryBudget",
    "LaneRuns",
    "pull_lane",
    "LanePulls",
    "committed_floor",
    "commit_floor",
    "settled_ranges",
]

T = TypeVar("T")


def settled_ranges(offsets: list[int]) -> list[list[int]]:
    """Sorted offsets as [start, end) ranges."""
    out: list[list[int]] = []
    for o in offsets:
        if out and out[-1][1] == o:
            out[-1][1] = o + 1
        else:
            out.append([o, o + 1])
    return out


class Lane:
    """One broker's part of an LMQ: the end of what it holds and the settled floor.

    ``floor`` is the lowest offset not yet settled; ``settled`` holds offsets
    settled out of order above it and ``jumps`` whole settled ranges (a purge),
    both folded into the floor as it reaches them. Settling in order (the common
    case) is one comparison and one assignment.
    """

    __slots__ = ("broker", "end", "floor", "settled", "jumps", "hw", "hosted", "committed")

    def __init__(self, broker: str = "", start: int = 0) -> None:
        self.broker = broker  # the broker holding this lane
        self.end = start  # one past the highest offset known to be in the lane
        self.floor = start  # lowest offset not yet settled
        self.settled: set[int] = set()  # settled offsets above the floor (out of order)
        self.jumps: dict[int, int] = {}  # settled ranges above the floor: start -> end
        self.hw = 0  # one past the highest offset ever delivered (redelivery flag after a restart)
        self.hosted = False  # the LMQ is known on this broker (see pull_lane)
        self.committed = start  # the floor as last made durable

    def settle(self, offset: int) -> None:
        if offset == self.floor:
            if self.settled or self.jumps:
                self._advance(offset + 1)
            else:
                self.floor = offset + 1
        elif offset > self.floor:
            self.settled.add(offset)

    def settle_range(self, start: int, end: int) -> None:
        """Settle every offset in ``[start, end)`` (a purge, or offsets skipped on a read-back)."""
        if end <= start:
            return
        if start <= self.floor:
            self._advance(max(end, self.floor))
        else:
            self.jumps[start] = max(end, self.jumps.get(start, 0))

    def _advance(self, f: int) -> None:
        settled = self.settled
        jumps = self.jumps
        while True:
            if f in settled:
                settled.discard(f)
                f += 1
                continue
            if jumps:  # rare (a purge): a settled range covering f, or one left behind
                hit = next((a for a, e in jumps.items() if a <= f < e or e <= f), None)
                if hit is not None:
                    f = max(f, jumps.pop(hit))
                    if settled:
                        settled.difference_update([o for o in settled if o < f])
                    continue
            break
        self.floor = f

    def is_settled(self, offset: int) -> bool:
        if offset < self.floor or offset in self.settled:
            return True
        for a, e in self.jumps.items():
            if a <= offset < e:
                return True
        return False

    def to_json(self, full: bool) -> dict[str, Any]:
        """The durable form: floor, high-water mark, settled offsets above the floor.

        Without ``full``, more than 4,096 out-of-order settled offsets (rare: one old
        message held while thousands are acknowledged) are left out: a crash may then
        deliver some of them again, never lose one."""
        d: dict[str, Any] = {"f": self.floor, "h": self.hw}
        s = self.settled
        if s and (full or len(s) <= 4096):
            d["s"] = settled_ranges(sorted(s))
        if self.jumps:
            d["j"] = [[a, e] for a, e in self.jumps.items()]
        return d

    def restore(self, d: dict[str, Any], min_offset: int, max_offset: int) -> int:
        """Resume from :meth:`to_json`'s record and the lane's offsets in the store
        (``min_offset``: what retention kept; ``max_offset``: its end); returns how many
        messages are left to deliver."""
        self.floor = max(int(d.get("f", 0)), min_offset)
        self.hw = int(d.get("h", 0))
        for a, e in d.get("s", ()):
            self.settled.update(range(max(a, self.floor), e))
        for a, e in d.get("j", ()):
            if e > self.floor:
                self.jumps[max(a, self.floor)] = e
        self._advance(self.floor)
        self.committed = self.floor
        self.end = max(max_offset, self.floor)
        gone = len([o for o in self.settled if o < self.end])
        gone += sum(min(e, self.end) - a for a, e in self.jumps.items() if a < self.end)
        return max(self.end - self.floor - gone, 0)


class MemoryBudget:
    """Bytes of just-stored messages a door keeps in memory over all its lanes."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0


class SpillLane(Lane):
    """A lane whose reader buffers what it can and leaves the rest in the store from ``spill_next`` on.

    The reader (an AMQP queue) holds just-stored messages in its own ready buffer,
    any of its consumers takes them and acknowledges them in any order (the
    settled floor); once the buffer is full, the lane's messages from
    ``spill_next`` up to ``end`` stay in the store only and are read back in order.
    ``spill_next`` None: everything up to ``end`` went to memory.
    """

    __slots__ = ("spill_next",)

    def __init__(self, broker: str = "", start: int = 0) -> None:
        super().__init__(broker, start)
        self.spill_next: int | None = None  # first offset not held in memory (to read back)

    def restore(self, d: dict[str, Any], min_offset: int, max_offset: int) -> int:
        """:meth:`Lane.restore`; what is left to deliver is then all in the store (read back from the floor)."""
        left = super().restore(d, min_offset, max_offset)
        self.spill_next = self.floor if self.floor < self.end else None
        return left


class WindowedLane(Lane):
    """A lane one consumer reads in order: next offset to hand on, and an in-memory window.

    ``window`` holds messages just stored in the lane, ascending offsets at or past
    ``read``, so a consumer that is behind need not read them back from the store;
    what did not fit the budget is pulled from the store up to the next entry held
    here, so a consumer that fell far behind goes back to memory as soon as room frees.
    """

    __slots__ = ("read", "window", "window_bytes", "must_pull")

    def __init__(self, broker: str = "", start: int = 0, must_pull: bool = False) -> None:
        super().__init__(broker, start)
        self.read = start  # next offset to hand to the consumer
        self.window: deque[tuple[int, Any]] = deque()
        self.window_bytes = 0  # what ``window`` holds, as counted against the budget
        self.must_pull = must_pull  # the store may hold messages beyond ``end``

    def hold(self, budget: MemoryBudget, offset: int, item: Any, size: int) -> bool:
        """Keep a just-stored message in the window if the budget allows; False: it stays
        in the store only (the read-back finds it)."""
        if budget.used + size > budget.limit:
            return False
        self.window.append((offset, item))
        self.window_bytes += size
        budget.used += size
        return True

    def release(self, budget: MemoryBudget, size: int) -> None:
        """``size`` bytes of the window were handed on or dropped."""
        self.window_bytes -= size
        budget.used -= size

    def clear_window(self, budget: MemoryBudget) -> None:
        budget.used -= self.window_bytes
        self.window_bytes = 0
        self.window.clear()

    def skip_to(self, offset: int) -> None:
        """Offsets ``read .. offset`` will never be handed on (retention removed them): settle them."""
        if offset > self.read:
            self.settle_range(self.read, offset)
            self.read = offset

    def caught_up(self) -> bool:
        return not self.window and not self.must_pull and self.read >= self.end


class LaneRuns(Generic[T]):
    """The order messages were stored in across the lanes of one LMQ: runs [lane, count], oldest first.

    Each lane's offsets keep its own order; the runs interleave the lanes as the
    messages arrived, so reading back from several brokers is FIFO too. Counts are
    best effort (a lane re-read from its floor after a reconnect): a run whose lane
    has nothing left is dropped.
    """

    __slots__ = ("runs",)

    def __init__(self) -> None:
        self.runs: deque[list[Any]] = deque()

    def __bool__(self) -> bool:
        return bool(self.runs)

    def __iter__(self) -> Iterator[list[Any]]:
        return iter(self.runs)

    def clear(self) -> None:
        self.runs.clear()

    def note(self, lane: T, k: int = 1) -> None:
        """``k`` more offsets were stored in ``lane``."""
        runs = self.runs
        if runs and runs[-1][0] == lane:
            runs[-1][1] += k
        else:
            runs.append([lane, k])

    def head(self, live: Callable[[T], bool]) -> list[Any] | None:
        """The oldest run whose lane ``live`` says still has something to read."""
        runs = self.runs
        while runs:
            head = runs[0]
            if head[1] <= 0 or not live(head[0]):
                runs.popleft()
                continue
            return head
        return None

    def taken(self, lane: T, n: int) -> None:
        """``n`` offsets of ``lane`` were read: take them off its oldest runs."""
        runs = self.runs
        for run in runs:
            if n <= 0:
                break
            if run[0] == lane:
                k = min(n, run[1])
                run[1] -= k
                n -= k
        while runs and runs[0][1] <= 0:
            runs.popleft()


async def pull_lane(source: ProcessorCalls, lmq: str, lane: Lane, offset: int, n: int, ctx: RequestContext,
                    admin_ctx: RequestContext | None = None) -> GetResult:
    """Read up to ``n`` entries of ``lane`` from ``offset`` (``ctx``: the reader, for authorization).

    In the separated deployment the lane's broker need not be one the LMQ's route
    names (it stored a publish dispatched there), and a pull there needs the LMQ
    known on that broker: made so once per lane (``admin_ctx``: the door's own).
    """
    if not lane.hosted:
        await source.host_lmq(admin_ctx or ctx, lmq, lane.broker)
        lane.hosted = True
    return await source.pull(ctx, lmq, 0, offset, n, broker=lane.broker)


class LanePulls:
    """Reads of many lanes: those asked in one event-loop turn on one broker go as one call.

    Why (issue 21): an MQTT gateway woken for thousands of sessions at once (a fleet's notes,
    a broker's restart) read each lane with a call of its own, and each call cost the broker
    and the gateway more than the read itself. The readers woken together ask in the same
    turn (each runs up to its read); the first ask schedules the send for the next turn, which
    takes all asked meanwhile (:meth:`ProcessorCalls.pull_lanes`, at most :attr:`MAX_LANES`
    per call, those calls in flight together). A read asked alone goes as a plain pull.
    """

    # reads per call: a few dozen take most of the per-call cost away, and several calls in flight
    # keep the broker reading while the gateway hands out the previous answer (at 256 per call
    # the two waited for each other: first messages took longer for the same CPU)
    MAX_LANES = 32

    def __init__(self, source: ProcessorCalls, admin_ctx: RequestContext) -> None:
        self.source = source
        self.admin_ctx = admin_ctx  # the door's own: hosting an LMQ, the batch call itself
        self._asked: dict[str, list[tuple[RequestContext, str, int, int, asyncio.Future[GetResult]]]] = {}
        self._sending: set[asyncio.Task[None]] = set()  # (held: the loop keeps only weak references)

    async def pull(self, lmq: str, lane: Lane, offset: int, n: int, ctx: RequestContext) -> GetResult:
        """:func:`pull_lane`, read together with the other lanes asked now on that broker."""
        if not lane.hosted:
            await self.source.host_lmq(self.admin_ctx, lmq, lane.broker)
            lane.hosted = True
        loop = asyncio.get_running_loop()
        asked = self._asked.get(lane.broker)
        if asked is None:
            asked = self._asked[lane.broker] = []
            loop.call_soon(self._send, lane.broker)
        f: asyncio.Future[GetResult] = loop.create_future()
        asked.append((ctx, lmq, offset, n, f))
        return await f

    def _send(self, broker: str) -> None:
        asked = self._asked.pop(broker)
        for i in range(0, len(asked), self.MAX_LANES):
            t = asyncio.get_running_loop().create_task(self._read(broker, asked[i:i + self.MAX_LANES]))
            self._sending.add(t)
            t.add_done_callback(self._sending.discard)

    async def _read(self, broker: str, asked: list[tuple[RequestContext, str, int, int,
                                                           asyncio.Future[GetResult]]]) -> None:
        asked = [a for a in asked if not a[4].done()]  # a reader cancelled meanwhile
        try:
            if len(asked) == 1:
                ctx, lmq, offset, n, _ = asked[0]
                got: list[GetResult | None] = [await self.source.pull(ctx, lmq, 0, offset, n, broker=broker)]
            elif asked:
                got = await self.source.pull_lanes(self.admin_ctx, broker, [a[:4] for a in asked])
            else:
                return
        except asyncio.CancelledError:
            for a in asked:
                a[4].cancel()
            raise
        except Exception as e:  # every reader sees it, as its own pull would have raised it
            for a in asked:
                if not a[4].done():
                    a[4].set_exception(e)
            return
        for a, r in zip(asked, got):
            f = a[4]
            if f.done():
                continue
            if r is None:
                f.set_exception(TopicNotFoundError(f"topic {a[1]!r} does not exist on {broker}"))
            else:
                f.set_result(r)


async def committed_floor(source: ProcessorCalls, ctx: RequestContext, group: str, lmq: str, broker: str) -> int:
    """A lane's durable floor kept as ``group``'s committed offset, or where its part of the LMQ begins."""
    await source.host_lmq(ctx, lmq, broker)
    off = await source.get_offset(ctx, group, lmq, 0, broker=broker)
    if off is not None:
        return off
    return await source.query_offset(ctx, lmq, 0, "begin", broker=broker)


async def commit_floor(source: ProcessorCalls, ctx: RequestContext, group: str, lmq: str, lane: Lane) -> None:
    """Make the lane's floor durable as ``group``'s committed offset, when it moved."""
    floor = lane.floor
    if floor != lane.committed:
        await source.commit_offset(ctx, group, lmq, 0, floor, broker=lane.broker)
        lane.committed = floor

