"""adapters.mqtt.delivery: a session's LMQ lanes, acknowledged floors and their commits, over a real processor.

The session here is offline (no network connection): what is checked is the
bookkeeping a connection later reads from -- lanes made on the first message a
broker stored, floors settled by acknowledgements and committed as the ``mqtt``
consumer group's offset, lanes restored from those commits after a restart.
Delivery to a connected client is the end-to-end suites' (test_mqtt_*.py).
"""

from __future__ import annotations

import asyncio

import pytest

from adapters.mqtt.acl import AccessControl
from adapters.mqtt.config import MQTTConfig
from adapters.mqtt.delivery import OFFSET_GROUP, Delivery
from adapters.mqtt.mapping import Outgoing
from adapters.mqtt.routing import Routing
from adapters.mqtt.session import SESSION_NEVER_EXPIRES, Inflight, Session, Subscription
from adapters.mqtt.shared import SharedDelivery
from adapters.mqtt.sys_topics import Counters
from core_broker.model import DispatchTarget, Message
from gateway.context import RequestContext
from mqtt_fixtures import processor  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(60)
CTX = RequestContext(protocol="mqtt", client_id="mqtt-door")


def delivery(processor) -> tuple[Delivery, list[Session]]:
    saved: list[Session] = []

    async def save(s: Session) -> None:
        saved.append(s)

    def spawn(coro):
        return asyncio.get_running_loop().create_task(coro)

    routing = Routing(AccessControl(processor, enforced=False), processor_ensure(processor))
    shared = SharedDelivery(processor, CTX, routing, spawn)
    return Delivery(processor, CTX, MQTTConfig(), Counters(), spawn, save, Routing.sub_ids, shared), saved


def processor_ensure(processor):
    async def ensure_lmq(name: str) -> None:
        await processor.create_topic(CTX, name, queues=1, exist_ok=True)

    return ensure_lmq


async def stored(processor, lmq: str, n: int) -> list:
    await processor.create_topic(CTX, lmq, queues=1, exist_ok=True)
    return await processor.send(CTX, [Message("t", f"m{i}".encode(), protocol="mqtt",
                                              extra_dispatch=(DispatchTarget(lmq, 0),)) for i in range(n)])


async def test_offline_session_gets_a_lane_and_its_floor_is_committed(processor) -> None:
    d, saved = delivery(processor)
    s = Session("dev", expiry=SESSION_NEVER_EXPIRES)
    sub = Subscription("t/#", 1, s, lmq="%LMQ%mqtt/dev/1")
    s.subs[sub.filter] = sub
    results = await stored(processor, sub.lmq, 3)
    broker = results[0].broker
    for r in results:
        d.offer(s, sub, Outgoing("t/x", b"", 1, False, None), r.extra_offsets[0], broker)
    key = (sub.lmq, broker)
    lane = s.cursors[key]
    assert (lane.end, lane.read, lane.floor) == (3, 0, 0) and not lane.window  # offline: it waits in the store
    await asyncio.sleep(0)  # the lane list is saved with a persistent session
    assert saved == [s]
    # two of them handed on and acknowledged, out of order
    lane.read = 2
    d.acked(s, Inflight(Outgoing("t/x", b"", 1, False, None), 1, key, 1, None, None))
    assert lane.floor == 0
    d.acked(s, Inflight(Outgoing("t/x", b"", 1, False, None), 1, key, 0, None, None))
    assert lane.floor == 2
    await d.commit_offsets()
    assert await processor.get_offset(CTX, OFFSET_GROUP, sub.lmq, 0, broker=broker) == 2
    # after a restart the lane is read on from its committed floor
    back = Session("dev", expiry=SESSION_NEVER_EXPIRES)
    bsub = Subscription("t/#", 1, back, lmq=sub.lmq)
    await d.restore_lanes(back, bsub, [broker])
    again = back.cursors[key]
    assert (again.read, again.floor, again.must_pull) == (2, 2, True) and back.pending[key] == 1


async def test_dropped_subscription_forgets_its_lanes_and_deletes_its_lmq(processor) -> None:
    d, _ = delivery(processor)
    s = Session("dev2")
    sub = Subscription("t/#", 1, s, lmq="%LMQ%mqtt/dev2/1")
    s.subs[sub.filter] = sub
    results = await stored(processor, sub.lmq, 1)
    d.offer(s, sub, Outgoing("t/x", b"", 1, False, None), 0, results[0].broker)
    assert s.cursors
    d.drop_lanes(s, sub.lmq)
    assert not s.cursors and not s.pending
    await d.delete_lmq(sub.lmq)
    assert sub.lmq not in [t.name for t in await processor.list_topics(CTX, include_system=True)]
