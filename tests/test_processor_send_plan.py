"""The send planner (gateway/send_plan.py), imported directly: per-topic type table and
producer load balancing, on real routes and messages (no broker needed: a plan is pure)."""

from __future__ import annotations

from collections import Counter

import pytest

from core_broker.model import Message, MessageType
from core_broker.topic_config import PERM_READ, PERM_RW, TopicConfig
from gateway.api import NoWritableQueueError
from gateway.broker_client import QueueRoute, TopicRoute
from gateway.send_plan import TopicPlan, message_type_of, select_queue


def route(mtype: MessageType = MessageType.NORMAL, queues: int = 4, perm: int = PERM_RW) -> TopicRoute:
    tc = TopicConfig("t", queues=queues, message_type=mtype)
    return TopicRoute(tc, [QueueRoute("b" + str(q % 2), q, perm) for q in range(queues)])


def test_message_types() -> None:
    assert message_type_of(Message("t", b""), transactional=True) is MessageType.TRANSACTION
    assert message_type_of(Message("t", b"", message_group="g"), False) is MessageType.FIFO
    assert message_type_of(Message("t", b"", delivery_time_ms=5), False) is MessageType.DELAY
    assert message_type_of(Message("t", b""), False) is MessageType.NORMAL


@pytest.mark.parametrize("mtype, takes", [
    (MessageType.NORMAL, {"NORMAL", "FIFO", "DELAY"}),
    (MessageType.FIFO, {"FIFO", "NORMAL"}),
    (MessageType.DELAY, {"DELAY", "NORMAL"}),
    (MessageType.TRANSACTION, {"TRANSACTION"}),
])
def test_a_plan_knows_what_its_topic_takes(mtype: MessageType, takes: set[str]) -> None:
    assert TopicPlan(route(mtype), 0).accepts == takes


def test_round_robin_over_writable_queues_continues_from_its_position() -> None:
    plan = TopicPlan(route(queues=4), rr=2)
    picks = [plan.select(Message("t", b"")).queue_id for _ in range(8)]
    assert picks == [2, 3, 0, 1, 2, 3, 0, 1]


def test_a_fifo_group_always_lands_on_one_queue() -> None:
    plan = TopicPlan(route(MessageType.FIFO, queues=8), 0)
    for g in ("g1", "g2", "g3"):
        assert len({plan.select(Message("t", b"", message_group=g)).queue_id for _ in range(20)}) == 1
    spread = {plan.select(Message("t", b"", message_group=f"g{i}")).queue_id for i in range(200)}
    assert len(spread) > 1


def test_read_only_queues_are_never_chosen() -> None:
    r = route(queues=4)
    r.queues[1] = QueueRoute("b1", 1, PERM_READ)
    plan = TopicPlan(r, 0)
    assert 1 not in {plan.select(Message("t", b"")).queue_id for _ in range(12)}
    with pytest.raises(NoWritableQueueError) as e:
        TopicPlan(route(perm=PERM_READ), 0).select(Message("t", b""))
    assert e.value.code == "FORBIDDEN"


def test_select_queue_outside_a_plan_keeps_a_position_per_topic() -> None:
    rr: dict[str, int] = {}
    picks = Counter(select_queue(route(queues=4), Message("t", b""), rr).queue_id for _ in range(40))
    assert picks == {0: 10, 1: 10, 2: 10, 3: 10}
    assert rr == {"t": 40}
