"""An AMQP queue's parts without a server: its ready buffers, and its LMQ lanes (gateway.lmq_reader).

Why direct: the end-to-end tests see a queue only through a client; here the
order of a priority queue's buffer and of requeued messages, the spill past
the memory limit (and its order across the lanes of two brokers), the read-back
that skips what was acknowledged out of order, and resuming from a durable
cursor saved by an earlier version of the door are checked on the objects
themselves, with a stand-in for the broker and the processor.
"""

from __future__ import annotations

import json
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from adapters.amqp.lease import Lease
from adapters.amqp.priority_buffer import PriorityBuffer, merge_back
from adapters.amqp.queue_state import QueueState
from adapters.amqp.vhost import VHost
from core_broker.model import GetResult, GetStatus, Message, StoredMessage
from gateway.context import RequestContext
from gateway.lmq_reader import SpillLane

# ---------------------------------------------------------------------------- ready buffers


def _lease(offset: int, priority: int = 0) -> Any:
    return SimpleNamespace(offset=offset, priority=priority)


def test_priority_buffer_hands_out_the_highest_priority_first_then_offset_order() -> None:
    buf = PriorityBuffer(5)
    for off, prio in ((0, 0), (1, 5), (2, 1), (3, 5), (4, 0), (5, 9)):  # above the maximum counts as it
        buf.append(_lease(off, min(prio, 5)))
    assert len(buf) == 6
    assert buf[0].offset == 1
    with pytest.raises(IndexError):
        buf[1]
    assert [buf.popleft().offset for _ in range(6)] == [1, 3, 5, 2, 0, 4]
    assert len(buf) == 0 and not buf
    with pytest.raises(IndexError):
        buf.popleft()


def test_released_messages_go_back_to_their_positions() -> None:
    buf = PriorityBuffer(2)
    for off, prio in ((3, 2), (5, 0), (6, 2), (9, 0)):
        buf.append(_lease(off, prio))
    buf.merge_back([_lease(1, 0), _lease(4, 2), _lease(7, 0)])  # sorted by offset, as the queue hands them
    assert len(buf) == 7
    assert [buf.popleft().offset for _ in range(7)] == [3, 4, 6, 1, 5, 7, 9]
    buf.append(_lease(0, 1))
    buf.clear()
    assert len(buf) == 0


def test_merge_back_into_a_plain_deque_keeps_the_object() -> None:
    d: deque[Any] = deque(_lease(o) for o in (4, 6, 8))
    same = d
    merge_back(d, [_lease(1), _lease(2)])  # all before the head: put in front
    merge_back(d, [_lease(5), _lease(9)])  # interleaved: merged in place
    assert d is same and [x.offset for x in d] == [1, 2, 4, 5, 6, 8, 9]


# ---------------------------------------------------------------------------- the queue's lanes


class FakeProcessor:
    """The two processor calls a queue's read-back makes, over in-memory LMQ parts per broker."""

    def __init__(self, parts: dict[str, list[int]]) -> None:
        self.parts = parts  # broker -> the offsets its part of the LMQ still holds
        self.hosted: list[tuple[str, str]] = []
        self.pulls: list[tuple[str, int, int]] = []

    async def host_lmq(self, ctx: RequestContext, lmq: str, broker: str) -> None:
        self.hosted.append((lmq, broker))

    async def pull(self, ctx: RequestContext, topic: str, queue_id: int, offset: int, n: int,
                   broker: str = "") -> GetResult:
        self.pulls.append((broker, offset, n))
        held = [o for o in self.parts[broker] if o >= offset][:n]
        msgs = [StoredMessage(topic, f"{broker}-{o}".encode(), queue_offset=o) for o in held]
        nxt = held[-1] + 1 if held else offset
        return GetResult(GetStatus.FOUND if held else GetStatus.NO_MESSAGE_IN_QUEUE, msgs, nxt, 0, nxt)


def _queue(processor: Any = None, durable: bool = True, mem_limit: int = 20000) -> tuple[QueueState, list[Any]]:
    saved: list[Any] = []
    broker = SimpleNamespace(processor=processor, ctx=RequestContext(protocol="amqp", client_id="test"),
                             mem_limit=mem_limit, mem_bytes_limit=1 << 30, stopping=True,
                             save_cursor=saved.append)
    q = QueueState(broker, VHost("/"), "jobs", durable, None, False, {})  # type: ignore[arg-type]
    q.wake = lambda: None  # type: ignore[method-assign]  # no pump in these tests
    return q, saved


# What the door wrote before its queues read their LMQ through gateway.lmq_reader (the same
# keys): floor 3, delivered up to 7, 5 and 6 acknowledged out of order, 9..10 purged.
OLD_CURSOR = b'{"l":{"broker-a":{"f":3,"h":7,"s":[[5,7]],"j":[[9,11]]}}}'


def test_a_cursor_saved_by_an_earlier_door_resumes() -> None:
    q, _ = _queue()
    q.restore(OLD_CURSOR, {"broker-a": (0, 12)})
    lane = q.lanes["broker-a"]
    assert isinstance(lane, SpillLane)
    assert (lane.floor, lane.hw, lane.end, lane.spill_next) == (3, 7, 12, 3)
    assert q.count == 5  # 3, 4, 7, 8, 11
    assert [r[:] for r in q.spill_runs] == [[lane, 9]]
    assert json.loads(q.cursor_json()) == json.loads(OLD_CURSOR)  # written back the same way
    for off in (3, 4, 7, 8):
        lane.settle(off)
    assert json.loads(q.cursor_json()) == {"l": {"broker-a": {"f": 11, "h": 7}}}  # the purged range folded in


def test_a_cursor_below_what_retention_kept_starts_at_the_store() -> None:
    q, _ = _queue()
    q.restore(OLD_CURSOR, {"broker-a": (6, 12)})
    lane = q.lanes["broker-a"]
    assert lane.floor == 7 and q.count == 3  # 7, 8, 11
    q2, _ = _queue()
    q2.restore(b"not json", {"broker-a": (0, 4)})  # unreadable: redelivered from the start
    assert q2.lanes["broker-a"].floor == 0 and q2.count == 4


async def test_read_back_skips_what_was_acknowledged_and_flags_redeliveries() -> None:
    proc = FakeProcessor({"broker-a": list(range(12))})
    q, _ = _queue(proc)
    q.restore(OLD_CURSOR, {"broker-a": (0, 12)})
    got = await q._pull_spill(100)
    assert [(x.offset, x.attempt, x.read_back) for x in q.buffer] == [
        (3, 2, True), (4, 2, True), (7, 1, True), (8, 1, True), (11, 1, True)]
    assert got == 5
    assert proc.hosted == [(q.topic, "broker-a")]  # the LMQ made known on the lane's broker once
    assert q.lanes["broker-a"].spill_next is None and q.store_empty


def _msg(body: bytes = b"x") -> Message:
    return Message("t", body)


async def test_spill_past_the_memory_limit_and_read_back_in_order_across_lanes() -> None:
    proc = FakeProcessor({"a": [0, 1, 2, 3], "b": [0]})
    q, _ = _queue(proc, mem_limit=2)
    for off in range(4):  # broker a stores 0..3: two held in memory, then the lane spills
        q.on_enqueued(_msg(), off, "a")
    q.on_enqueued(_msg(), 0, "b")  # broker b's lane waits behind a's spilled part
    a, b = q.lanes["a"], q.lanes["b"]
    assert [x.offset for x in q.buffer] == [0, 1]
    assert (a.end, a.spill_next, b.end, b.spill_next) == (4, 2, 1, 0)
    assert [r[:] for r in q.spill_runs] == [[a, 2], [b, 1]]
    assert q.count == 5
    q.buffer.clear()
    order: list[tuple[str, int]] = []
    while await q._pull_spill(1):
        order.extend((x.lane.broker, x.offset) for x in q.buffer)
        q.buffer.clear()
    assert order == [("a", 2), ("a", 3), ("b", 0)]  # stored order, across the two brokers
    assert not q.spill_runs and q.store_empty


def test_settling_moves_the_durable_floor_and_asks_for_a_save() -> None:
    q, saved = _queue()
    leases = []
    for off in range(3):
        q.on_enqueued(_msg(), off, "a")
        leases.append(q.buffer[-1])
    assert all(isinstance(x, Lease) for x in leases)
    q.settle(leases[1])  # out of order
    assert q.lanes["a"].floor == 0 and saved == [q]
    q.settle(leases[0])
    assert q.lanes["a"].floor == 2
    transient, saved2 = _queue(durable=False)
    transient.on_enqueued(_msg(), 0, "a")
    transient.settle(transient.buffer[0])
    assert transient.lanes["a"].floor == 0 and not saved2  # no cursor for a transient queue
