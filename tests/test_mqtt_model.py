"""The one-model mapping of the MQTT door, checked through the processor itself.

Why in-process: the point of the mapping is that a message published over
MQTT is an ordinary stored message every other door reads. Here the door and
a MessagingProcessor share one event loop over a real store in a temp dir, a
real paho client publishes over a real socket, and the test reads the result
with the processor's own pull and pop, as the AMQP, HTTP and gRPC doors and
Spark do.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.mqtt.broker import MQTTBroker, MQTTConfig
from adapters.mqtt.server import MQTTDoor
from core_broker.model import GetStatus
from gateway.context import RequestContext
from mqtt_fixtures import Paho, door  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(60)
CTX = RequestContext(protocol="test", client_id="model-test")


async def athread(fn, *a, **kw):
    return await asyncio.to_thread(fn, *a, **kw)


async def pull_all(p, topic: str) -> list:
    route = await p.query_route(CTX, topic)
    out = []
    for q in route.queues:
        r = await p.pull(CTX, topic, q.queue_id, 0, 100)
        if r.status == GetStatus.FOUND:
            out.extend(r.messages)
    return out


async def pull_until(p, topic: str, n: int) -> list:
    deadline = time.monotonic() + 10
    while True:
        try:
            msgs = await pull_all(p, topic)
        except Exception:
            msgs = []
        if len(msgs) >= n or time.monotonic() > deadline:
            return msgs
        await asyncio.sleep(0.05)


async def test_publish_lands_in_first_level_topic_with_properties(door) -> None:
    c = await athread(Paho, door.port, v5=True)
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("region", "eu"), ("temp", "31")]
    props.ContentType = "application/json"
    await athread(c.publish, "a/b/c", b'{"t": 31}', 1, False, props)
    await athread(c.publish, "a/x", b"second", 0)
    msgs = await pull_until(door.processor, "a", 2)  # QoS 0: no ack to wait for
    assert [m.body for m in sorted(msgs, key=lambda m: m.born_timestamp_ms)] == [b'{"t": 31}', b"second"]
    m = next(m for m in msgs if m.body == b'{"t": 31}')
    assert m.protocol == "mqtt"
    assert m.properties["mqtt_topic"] == "a/b/c"
    assert m.properties["region"] == "eu" and m.properties["temp"] == "31"
    assert m.properties["mqtt_content_type"] == "application/json"
    # pop consumption of the same topic by an unrelated consumer group
    popped = await door.processor.pop(CTX, "spark-like", "a", 10, 30_000)
    assert {p.message.body for p in popped} == {b"{\"t\": 31}", b"second"}
    # SQL92 filters work on the MQTT properties
    from core_broker.model import FilterExpression, FilterType

    flt = FilterExpression("region = 'eu' AND temp > 30", FilterType.SQL92)
    popped = await door.processor.pop(CTX, "filtered", "a", 10, 30_000, flt)
    assert [p.message.body for p in popped] == [b'{"t": 31}']
    await athread(c.disconnect)


async def test_wildcard_subscriptions_are_multi_dispatched_into_lmqs(door) -> None:
    s1 = await athread(Paho, door.port, "s1")
    s2 = await athread(Paho, door.port, "s2")
    await athread(s1.subscribe, "sensors/#", 1)
    await athread(s2.subscribe, "sensors/+/temp", 1)
    pub = await athread(Paho, door.port)
    await athread(pub.publish, "sensors/k1/temp", b"21.5", 1)
    await athread(pub.publish, "sensors/k1/hum", b"40", 1)
    assert {m.payload for m in await athread(s1.get_n, 2)} == {b"21.5", b"40"}
    assert (await athread(s2.get)).payload == b"21.5"
    # the messages are stored once in "sensors" and indexed into one LMQ per subscription
    topics = {t.name for t in await door.processor.list_topics(CTX, include_system=True)}
    lmqs = sorted(t for t in topics if t.startswith("%LMQ%mqtt/"))
    assert lmqs == ["%LMQ%mqtt/s1/1", "%LMQ%mqtt/s2/1"]
    r1 = await door.processor.pull(CTX, "%LMQ%mqtt/s1/1", 0, 0, 10)
    r2 = await door.processor.pull(CTX, "%LMQ%mqtt/s2/1", 0, 0, 10)
    assert [m.body for m in r1.messages] == [b"21.5", b"40"]
    assert [m.body for m in r2.messages] == [b"21.5"]
    stored = await pull_all(door.processor, "sensors")
    assert len(stored) == 2
    assert {m.commitlog_offset for m in stored} == {m.commitlog_offset for m in r1.messages}  # body stored once
    # the subscriber's progress is the committed offset of group "mqtt" (flushed every 200 ms)
    deadline = time.monotonic() + 10
    while await door.processor.get_offset(CTX, "mqtt", "%LMQ%mqtt/s1/1", 0) != 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    # unsubscribing removes the subscription's LMQ
    await athread(s2.c.unsubscribe, "sensors/+/temp")
    deadline = time.monotonic() + 10
    while "%LMQ%mqtt/s2/1" in {t.name for t in await door.processor.list_topics(CTX, include_system=True)}:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    for c in (s1, s2, pub):
        await athread(c.disconnect)


async def test_qos0_to_online_subscribers_does_not_create_lmqs(door) -> None:
    s = await athread(Paho, door.port, "zero")
    await athread(s.subscribe, "z/#", 0)
    pub = await athread(Paho, door.port)
    await athread(pub.publish, "z/1", b"a", 1)
    assert (await athread(s.get)).payload == b"a"
    topics = {t.name for t in await door.processor.list_topics(CTX, include_system=True)}
    assert not any(t.startswith("%LMQ%mqtt/zero") for t in topics)
    assert [m.body for m in await pull_until(door.processor, "z", 1)] == [b"a"]  # still stored for other readers
    await athread(s.disconnect)
    await athread(pub.disconnect)


async def test_messages_other_doors_send_on_mqtt_topics_reach_mqtt_subscribers(door) -> None:
    """The processor's router seam: e.g. AMQP amq.topic 'fleet.k1.pos' is stored as MQTT 'fleet/k1/pos'."""
    from core_broker.model import Message

    q1 = await athread(Paho, door.port, "x-q1", v5=True)
    await athread(q1.subscribe, "fleet/+/pos", 1)
    q0 = await athread(Paho, door.port, "x-q0")
    await athread(q0.subscribe, "fleet/#", 0)
    amqp = RequestContext(protocol="amqp", client_id="amqp-door")
    m = Message("fleet", b"52.1,4.3", properties={"mqtt_topic": "fleet/k1/pos", "x-source": "amqp"}, protocol="amqp")
    await door.processor.send(amqp, [m])
    got = await athread(q1.get)
    assert (got.topic, got.payload, got.qos) == ("fleet/k1/pos", b"52.1,4.3", 1)
    assert ("x-source", "amqp") in got.properties.UserProperty
    got0 = await athread(q0.get)
    assert (got0.topic, got0.payload) == ("fleet/k1/pos", b"52.1,4.3")
    # stored once in "fleet", indexed into the QoS 1 subscription's LMQ
    r = await door.processor.pull(CTX, "%LMQ%mqtt/x-q1/1", 0, 0, 10)
    assert [x.body for x in r.messages] == [b"52.1,4.3"]
    for c in (q1, q0):
        await athread(c.disconnect)


async def test_session_saved_before_lanes_restores_one_lane_on_the_route_broker(door) -> None:
    """A session record without lanes (the format before them) and its offset committed
    without a broker: after a restart the door reads on from that committed offset."""
    import json

    from adapters.mqtt.broker import message_properties
    from core_broker.model import DispatchTarget, Message

    p = door.processor
    lmq = "%LMQ%mqtt/old-dev/1"
    await p.create_topic(CTX, lmq, queues=1, exist_ok=True)
    await p.send(CTX, [Message("old", f"m{i}".encode(), properties=message_properties("old/x", 1, False, None),
                               protocol="mqtt", extra_dispatch=(DispatchTarget(lmq, 0),)) for i in range(5)])
    await p.commit_offset(CTX, "mqtt", lmq, 0, 2)  # as the door did before lanes: no broker named
    old = {"v": 4, "e": 0xFFFFFFFF, "n": 1, "d": 0, "s": [["old/#", 1, 0, 0, 0, 0, lmq]], "q": []}
    await p.kv_put(CTX, "mqtt.sessions", "old-dev", json.dumps(old).encode())
    d2 = MQTTDoor(SimpleNamespace(processor=p, settings=None), MQTTBroker(p, MQTTConfig()), host="127.0.0.1", port=0)
    _, port2 = await d2.start()  # loads the record, as a restarted door does
    try:
        s = d2.broker.sessions["old-dev"]
        assert [(k[0], c.read) for k, c in s.cursors.items()] == [(lmq, 2)]
        c = Paho(port2, "old-dev", clean=False, connect=False)
        await athread(c.connect)
        got = await athread(c.get_n, 3)
        assert [m.payload for m in got] == [b"m2", b"m3", b"m4"]
        await athread(c.disconnect)
    finally:
        await d2.stop()
