"""adapters.mqtt.connection and adapters.mqtt.shared, in process: one door over a real store, raw sockets.

The connection consults its protocol state machine for every packet it handles;
here the cases the decoder alone does not decide: AUTH once connected, and
packets written after DISCONNECT. Shared subscriptions' pop/ack bookkeeping is
driven directly against the processor.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from adapters.mqtt import codec as C
from adapters.mqtt.broker import MQTTBroker, MQTTConfig
from adapters.mqtt.server import MQTTDoor
from adapters.mqtt.mapping import Outgoing
from adapters.mqtt.session import Inflight, Session, Subscription
from core_broker.model import DispatchTarget, Message
from gateway.context import RequestContext
from mqtt_fixtures import RawClient, processor  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(60)
CTX = RequestContext(protocol="test", client_id="connection-test")


@pytest.fixture
async def door(processor):  # noqa: F811 - the fixture above
    d = MQTTDoor(SimpleNamespace(processor=processor, settings=None), MQTTBroker(processor, MQTTConfig()),
                 host="127.0.0.1", port=0)
    _, port = await d.start()
    try:
        yield SimpleNamespace(processor=processor, port=port, broker=d.broker)
    finally:
        await d.stop()


async def test_auth_once_connected_is_a_protocol_error(door) -> None:
    def client() -> list:
        raw = RawClient(door.port, C.MQTT_5)
        raw.connect("auth-late")
        raw.send(C.Auth(0x18, {"authentication_method": "m"}))
        return raw.closed_by_server()

    got = await asyncio.to_thread(client)
    assert isinstance(got[-1], C.Disconnect) and got[-1].reason_code == C.RC_PROTOCOL_ERROR


async def test_packets_after_disconnect_are_not_handled(door) -> None:
    def client() -> None:
        raw = RawClient(door.port, C.MQTT_5)
        raw.connect("bye")
        raw.send(C.encode(C.Disconnect(), C.MQTT_5) + C.encode(C.Publish("after/x", b"late", 1, packet_id=1), C.MQTT_5))
        raw.closed_by_server()

    await asyncio.to_thread(client)
    p = door.processor
    if "after" in [t.name for t in await p.list_topics(CTX)]:  # (a topic may exist without messages)
        for q in (await p.query_route(CTX, "after")).queues:
            assert (await p.pull(CTX, "after", q.queue_id, 0, 10)).messages == []


async def test_shared_member_releases_popped_messages_to_the_others(door) -> None:
    p, broker = door.processor, door.broker
    shared = broker.shared
    s = Session("member")
    sub = Subscription("t/#", 1, s, group="g")
    s.subs[sub.key()] = sub
    broker.routing.index(sub)
    g = broker.routing.groups[("g", "t/#")]
    lmq, group = g.lmq, g.cgroup
    await p.create_topic(CTX, lmq, queues=1, exist_ok=True)
    await p.send(CTX, [Message("t", b"job", protocol="test", extra_dispatch=(DispatchTarget(lmq, 0),))])
    [got] = await p.pop(CTX, group, lmq, 8, 60_000)
    f = Inflight(Outgoing("t/x", b"job", 1, False, None), 1, lmq, 0, got.receipt_handle, None)
    await shared.release(s, f)  # the member left: the message is the others' at once
    [again] = await p.pop(CTX, group, lmq, 8, 60_000)  # (without the release: invisible for a minute)
    assert again.message.body == b"job"
    await shared.ack(s, Inflight(f.msg, 1, lmq, 0, again.receipt_handle, None))  # settles without error


async def test_a_connection_without_connect_is_closed_after_the_connect_timeout(processor) -> None:  # noqa: F811
    """One timer for the door (``deadlines.py``): silent connections are closed once their
    deadline passes, one that sent CONNECT in time stays open and leaves no deadline behind."""
    d = MQTTDoor(SimpleNamespace(processor=processor, settings=None),
                 MQTTBroker(processor, MQTTConfig(connect_timeout_s=0.5)), host="127.0.0.1", port=0)
    _, port = await d.start()
    try:
        def clients() -> tuple[list, list, C.Connack]:
            silent = [RawClient(port) for _ in range(3)]
            ok = RawClient(port)
            ack = ok.connect("in-time")
            closed = [raw.closed_by_server(timeout=10) for raw in silent]
            ok.send(C.encode(C.PingReq(), C.MQTT_311))  # still served after every deadline passed
            return closed, [ok.recv()], ack

        closed, pong, ack = await asyncio.to_thread(clients)
        assert closed == [[], [], []] and ack.reason_code == 0 and isinstance(pong[0], C.PingResp)
        assert len(d.broker.connect_deadlines) == 0
    finally:
        await d.stop()
