"""gateway.lmq_reader: the light-message-queue reader the MQTT and AMQP doors share.

The pure parts (settled floor, in-memory window, order across lanes) are checked
directly; the read-back and the committed floor against a real MessagingProcessor
over a real store in a temp dir.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest

from core_broker.config import StoreConfig
from core_broker.errors import BadRequestError
from core_broker.model import DispatchTarget, Message
from gateway.context import RequestContext
from gateway.deployment import merged_processor
from gateway.lmq_reader import (
    Lane,
    LanePulls,
    LaneRuns,
    MemoryBudget,
    SpillLane,
    WindowedLane,
    commit_floor,
    committed_floor,
    pull_lane,
)

pytestmark = pytest.mark.timeout(60)
CTX = RequestContext(protocol="test", client_id="lmq-reader-test")


def test_settling_in_order_moves_the_floor():
    lane = Lane("b", 5)
    assert lane.floor == 5
    for off in (5, 6, 7):
        lane.settle(off)
    assert lane.floor == 8 and not lane.settled
    lane.settle(3)  # below the floor: already settled
    assert lane.floor == 8


def test_out_of_order_settles_are_folded_in_when_the_floor_reaches_them():
    lane = Lane()
    for off in (2, 1, 4):
        lane.settle(off)
    assert lane.floor == 0 and lane.is_settled(2) and not lane.is_settled(3)
    lane.settle(0)
    assert lane.floor == 3
    lane.settle(3)
    assert lane.floor == 5 and not lane.settled


def test_settled_ranges_above_the_floor():
    lane = Lane()
    lane.settle_range(3, 10)
    assert lane.floor == 0 and lane.is_settled(9) and not lane.is_settled(10)
    lane.settle(1)
    lane.settle(0)
    assert lane.floor == 2
    lane.settle(2)
    assert lane.floor == 10 and not lane.jumps


def test_durable_record_round_trip():
    lane = Lane("b")
    for off in (0, 1, 3, 4, 9):
        lane.settle(off)
    lane.settle_range(20, 25)
    lane.hw = 30
    back = Lane("b")
    left = back.restore(lane.to_json(full=True), min_offset=0, max_offset=30)
    assert (back.floor, back.hw, back.end, back.committed) == (2, 30, 30, 2)
    assert all(back.is_settled(o) for o in (3, 4, 9, 20, 24)) and not back.is_settled(5)
    assert left == 30 - 2 - 3 - 5  # 2, 5..8, 10..19, 25..29 remain
    # retention removed the start: the floor moves up to what the store still has
    again = Lane("b")
    again.restore(lane.to_json(full=False), min_offset=6, max_offset=30)
    assert again.floor == 6


def test_spill_lane_resumes_reading_everything_back_from_its_floor():
    lane = SpillLane("b")
    assert lane.spill_next is None  # a new lane: what arrives goes to the reader's memory
    lane.settle(0)
    lane.settle(2)
    back = SpillLane("b")
    assert back.restore(lane.to_json(full=True), min_offset=0, max_offset=5) == 3  # 1, 3, 4
    assert (back.floor, back.end, back.spill_next) == (1, 5, 1)
    done = SpillLane("b")
    assert done.restore({"f": 5}, min_offset=0, max_offset=5) == 0
    assert done.spill_next is None  # nothing left: nothing to read back


def test_window_holds_within_the_shared_budget():
    budget = MemoryBudget(100)
    a, b = WindowedLane("x"), WindowedLane("y")
    assert a.hold(budget, 0, "m0", 60)
    assert not b.hold(budget, 0, "n0", 60)  # over the budget: it stays in the store only
    assert b.hold(budget, 0, "n0", 40) and budget.used == 100
    a.window.popleft()
    a.release(budget, 60)
    assert budget.used == 40 and a.window_bytes == 0
    b.clear_window(budget)
    assert budget.used == 0 and not b.window


def test_skipped_offsets_are_settled_and_caught_up():
    lane = WindowedLane("x", 3)
    lane.end = 10
    assert not lane.caught_up()
    lane.skip_to(7)  # retention removed 3..6
    assert lane.read == 7 and lane.floor == 7
    lane.read = 8  # 7 handed on, not acknowledged
    lane.skip_to(10)
    assert lane.floor == 7 and lane.caught_up()
    lane.settle(7)
    assert lane.floor == 10


def test_runs_keep_the_order_across_lanes():
    runs: LaneRuns[str] = LaneRuns()
    for broker in ("a", "a", "b", "a", "b", "b"):
        runs.note(broker)
    assert [list(r) for r in runs] == [["a", 2], ["b", 1], ["a", 1], ["b", 2]]
    assert runs.head(lambda lane: True) == ["a", 2]
    runs.taken("a", 3)  # both of a's runs (an emptied run inside stays until it is the head)
    assert runs.head(lambda lane: True) == ["b", 1]
    runs.taken("b", 1)
    assert [list(r) for r in runs] == [["b", 2]]
    assert runs.head(lambda lane: lane != "b") is None and not runs


@pytest.fixture
async def processor(tmp_path) -> AsyncIterator:
    p = merged_processor(StoreConfig(data_dir=tmp_path, commitlog_segment_size=16 << 20,
                                     cq_entries_per_file=10_000, index_slots=1000, index_entries_per_file=4000,
                                     disk_min_free_ratio=0.0, disk_refuse_free_ratio=0.0))
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def test_read_back_and_committed_floor(processor) -> None:
    p = processor
    lmq = "%LMQ%test/reader"
    await p.create_topic(CTX, lmq, queues=1, exist_ok=True)
    results = await p.send(CTX, [Message("t", f"m{i}".encode(), protocol="test",
                                         extra_dispatch=(DispatchTarget(lmq, 0),)) for i in range(5)])
    broker = results[0].broker
    assert await committed_floor(p, CTX, "g", lmq, broker) == 0  # never committed: where the lane begins
    lane = WindowedLane(broker)
    r = await pull_lane(p, lmq, lane, 0, 3, CTX)
    assert lane.hosted and [m.body for m in r.messages] == [b"m0", b"m1", b"m2"]
    for m in r.messages:
        lane.settle(m.queue_offset)
    await commit_floor(p, CTX, "g", lmq, lane)
    assert lane.committed == 3
    assert await committed_floor(p, CTX, "g", lmq, broker) == 3
    r = await pull_lane(p, lmq, lane, lane.floor, 10, CTX)
    assert [m.body for m in r.messages] == [b"m3", b"m4"]


def _store(tmp_path) -> StoreConfig:
    return StoreConfig(data_dir=tmp_path, commitlog_segment_size=16 << 20, cq_entries_per_file=10_000,
                       index_slots=1000, index_entries_per_file=4000, disk_min_free_ratio=0.0,
                       disk_refuse_free_ratio=0.0)


async def test_lanes_asked_together_are_read_and_committed_together(tmp_path) -> None:
    """LanePulls: lanes asked in one turn (one call) come back each with its own entries;
    commit_lanes: the floors of several lanes in one call survive a restart (journal replay)."""
    p = merged_processor(_store(tmp_path))
    await p.start()
    lmqs = [f"%LMQ%test/lane{i}" for i in range(3)]
    try:
        for i, lmq in enumerate(lmqs):
            await p.create_topic(CTX, lmq, queues=1, exist_ok=True)
            results = await p.send(CTX, [Message("t", f"{i}-{k}".encode(), protocol="test",
                                                 extra_dispatch=(DispatchTarget(lmq, 0),)) for k in range(i + 2)])
        broker = results[0].broker
        pulls = LanePulls(p, CTX)
        lanes = [WindowedLane(broker) for _ in lmqs]
        empty = WindowedLane(broker)
        got = await asyncio.gather(*(pulls.pull(lmq, lane, 1, 10, CTX) for lmq, lane in zip(lmqs, lanes)),
                                   pulls.pull("%LMQ%test/empty", empty, 0, 10, CTX))
        assert [[m.body for m in r.messages] for r in got[:3]] == [[b"0-1"], [b"1-1", b"1-2"], [b"2-1", b"2-2", b"2-3"]]
        assert got[3].messages == [] and all(lane.hosted for lane in [*lanes, empty])
        await p.commit_lanes(CTX, "g", broker, [(lmqs[0], 2), (lmqs[2], 3)])
        with pytest.raises(BadRequestError):  # lanes are LMQs' parts only
            await p.commit_lanes(CTX, "g", broker, [("t", 1)])
    finally:
        await p.stop()
    p = merged_processor(_store(tmp_path))
    await p.start()
    try:
        assert [await committed_floor(p, CTX, "g", lmq, broker) for lmq in lmqs] == [2, 0, 3]
    finally:
        await p.stop()
