"""MQTT 5.0 features of the door, with paho-mqtt in v5 mode and raw v5 packets.

Why both: paho exercises what applications use (shared subscriptions, user
properties, subscription identifiers, no-local, retain handling); raw packets
check the flow-control and size rules paho enforces on its own side (receive
maximum, topic aliases, maximum packet size) and the exact reason codes.
One `unimq up` serves the module; tests use distinct topics and client ids.
"""

from __future__ import annotations

import time

import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.mqtt import codec as C
from mqtt_fixtures import config_file, Paho, RawClient, start_unimq, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    srv = start_unimq(tmp_path_factory, "--config", config_file(tmp_path_factory.mktemp("cfg")))
    yield srv.ports["mqtt"]
    srv.stop()


def opts(qos: int = 1, **kw) -> paho.SubscribeOptions:
    return paho.SubscribeOptions(qos=qos, **kw)


def test_shared_subscription_splits_the_load(port: int) -> None:
    a = Paho(port, "share-a", v5=True)
    b = Paho(port, "share-b", v5=True)
    everyone = Paho(port, "share-all", v5=True)
    a.subscribe("$share/workers/jobs/#", options=opts(1))
    b.subscribe("$share/workers/jobs/#", options=opts(1))
    everyone.subscribe("jobs/#", options=opts(1))
    pub = Paho(port, v5=True)
    n = 60
    for i in range(n):
        pub.publish(f"jobs/{i % 3}", str(i).encode(), qos=1)
    assert sorted(int(m.payload) for m in everyone.get_n(n)) == list(range(n))
    wait_for(lambda: len(a.received) + len(b.received) >= n, what="all jobs delivered to the group")
    got_a = [int(m.payload) for m in a.received]
    got_b = [int(m.payload) for m in b.received]
    assert sorted(got_a + got_b) == list(range(n))  # each job once
    assert got_a and got_b  # and both members worked
    # QoS 0 is split too
    for i in range(20):
        pub.publish("jobs/q0", b"z", qos=0)
    wait_for(lambda: len(a.received) + len(b.received) >= n + 20, what="QoS 0 shared deliveries")
    time.sleep(0.3)
    assert len(a.received) + len(b.received) == n + 20
    # a member that leaves hands its share to the others
    a.disconnect()
    for i in range(10):
        pub.publish("jobs/late", str(i).encode(), qos=1)
    wait_for(lambda: len([m for m in b.received if m.topic == "jobs/late"]) == 10, what="the rest of the group")
    for c in (b, everyone, pub):
        c.disconnect()


def test_shared_subscription_releases_unacked_messages_of_a_member_that_dies(port: int) -> None:
    raw = RawClient(port, C.MQTT_5)
    raw.connect("share-dies")
    raw.send(C.Subscribe(1, [("$share/g2/w/#", C.SubOptions(1))]))
    raw.recv_type(C.Suback)
    pub = Paho(port, v5=True)
    for i in range(5):
        pub.publish("w/x", str(i).encode(), qos=1)
    got = [raw.recv_type(C.Publish) for _ in range(5)]
    raw.send(C.PubAck(got[0].packet_id))
    raw.send(C.PingReq())
    raw.recv_type(C.PingResp)
    other = Paho(port, "share-survivor", v5=True)
    other.subscribe("$share/g2/w/#", options=opts(1))
    other.nothing(0.3)  # everything is in flight to the first member
    raw.close()  # it dies with four un-acked messages: they go to the survivor
    assert sorted(int(m.payload) for m in other.get_n(4)) == [1, 2, 3, 4]
    other.disconnect()
    pub.disconnect()


def test_properties_pass_through_and_subscription_identifiers(port: int) -> None:
    sub = Paho(port, v5=True)
    sp = Properties(PacketTypes.SUBSCRIBE)
    sp.SubscriptionIdentifier = 42
    sub.subscribe("props/#", options=opts(1), properties=sp)
    sp2 = Properties(PacketTypes.SUBSCRIBE)
    sp2.SubscriptionIdentifier = 7
    sub.subscribe("props/+/x", options=opts(0), properties=sp2)
    pub = Paho(port, v5=True)
    pp = Properties(PacketTypes.PUBLISH)
    pp.UserProperty = [("a", "1"), ("b", "two")]
    pp.ContentType = "application/json"
    pp.ResponseTopic = "reply/here"
    pp.CorrelationData = b"\x00\x01corr"
    pp.PayloadFormatIndicator = 1
    pp.MessageExpiryInterval = 300
    pub.publish("props/y/x", b'{"v": 1}', qos=1, properties=pp)
    m = sub.get()
    p = m.properties
    assert m.payload == b'{"v": 1}' and m.qos == 1
    assert p.UserProperty == [("a", "1"), ("b", "two")]
    assert (p.ContentType, p.ResponseTopic, p.CorrelationData) == ("application/json", "reply/here", b"\x00\x01corr")
    assert p.PayloadFormatIndicator == 1
    assert 0 < p.MessageExpiryInterval <= 300
    assert sorted(p.SubscriptionIdentifier) == [7, 42]
    sub.nothing(0.3)  # one copy for overlapping subscriptions
    sub.disconnect()
    pub.disconnect()


def test_no_local_and_retain_as_published(port: int) -> None:
    me = Paho(port, "nl-me", v5=True)
    me.subscribe("nl/#", options=opts(1, noLocal=True, retainAsPublished=True))
    other = Paho(port, v5=True)
    me.publish("nl/1", b"mine", qos=1)
    other.publish("nl/1", b"theirs", qos=1, retain=True)
    m = me.get()
    assert (m.payload, m.retain) == (b"theirs", True)  # retain as published
    me.nothing(0.3)
    other.publish("nl/1", b"", qos=1, retain=True)
    me.get()
    me.disconnect()
    other.disconnect()


def test_retain_handling(port: int) -> None:
    pub = Paho(port, v5=True)
    pub.publish("rh/x", b"kept", qos=1, retain=True)
    c = Paho(port, v5=True)
    c.subscribe("rh/#", options=opts(1, retainHandling=2))  # never send retained
    c.nothing(0.3)
    c2 = Paho(port, v5=True)
    c2.subscribe("rh/#", options=opts(1, retainHandling=1))  # only for a new subscription
    assert c2.get().payload == b"kept"
    c2.subscribe("rh/#", options=opts(1, retainHandling=1))
    c2.nothing(0.3)
    c2.subscribe("rh/#", options=opts(1, retainHandling=0))  # always
    assert c2.get().payload == b"kept"
    pub.publish("rh/x", b"", qos=1, retain=True)
    for x in (pub, c, c2):
        x.disconnect()


def test_message_expiry_while_offline(port: int) -> None:
    dev = Paho(port, "exp-dev", v5=True, clean=False, session_expiry=600)
    dev.subscribe("exp/#", options=opts(1))
    dev.disconnect()
    pub = Paho(port, v5=True)
    short = Properties(PacketTypes.PUBLISH)
    short.MessageExpiryInterval = 1
    long = Properties(PacketTypes.PUBLISH)
    long.MessageExpiryInterval = 600
    pub.publish("exp/a", b"short-lived", qos=1, properties=short)
    pub.publish("exp/a", b"long-lived", qos=1, properties=long)
    time.sleep(2.2)
    dev = Paho(port, "exp-dev", v5=True, clean=False, session_expiry=600)
    m = dev.get()
    assert m.payload == b"long-lived" and m.properties.MessageExpiryInterval <= 600
    dev.nothing(0.3)
    dev.disconnect()
    pub.disconnect()


def test_topic_aliases_both_ways_raw(port: int) -> None:
    raw = RawClient(port, C.MQTT_5)
    ack = raw.connect("alias", properties={"topic_alias_maximum": 4})
    server_max = ack.properties["topic_alias_maximum"]
    assert server_max >= 1
    raw.send(C.Subscribe(1, [("al/#", C.SubOptions(1))]))
    raw.recv_type(C.Suback)
    # inbound: set alias 1, then publish by alias only
    raw.send(C.Publish("al/long/topic/name", b"first", 1, packet_id=1, properties={"topic_alias": 1}))
    raw.send(C.Publish("", b"second", 1, packet_id=2, properties={"topic_alias": 1}))
    got = []
    while len(got) < 2:
        p = raw.recv()
        if isinstance(p, C.PubAck):
            continue
        assert isinstance(p, C.Publish)
        got.append(p)
        raw.send(C.PubAck(p.packet_id))
    # outbound: the server aliases the topic for us after the first message
    assert got[0].topic == "al/long/topic/name" and got[0].properties["topic_alias"] >= 1
    assert got[1].topic == "" and got[1].properties["topic_alias"] == got[0].properties["topic_alias"]
    assert [g.payload for g in got] == [b"first", b"second"]
    # an unknown alias is a protocol error; an alias above the maximum is 0x94
    raw.send(C.Publish("", b"x", 0, properties={"topic_alias": 2}))
    got = raw.closed_by_server()
    assert isinstance(got[-1], C.Disconnect) and got[-1].reason_code == C.RC_PROTOCOL_ERROR
    raw = RawClient(port, C.MQTT_5)
    raw.connect("alias2")
    raw.send(C.Publish("t", b"x", 0, properties={"topic_alias": server_max + 1}))
    got = raw.closed_by_server()
    assert isinstance(got[-1], C.Disconnect) and got[-1].reason_code == C.RC_TOPIC_ALIAS_INVALID
    assert got[-1].properties.get("reason_string")  # reason strings on errors


def test_receive_maximum_flow_control_raw(port: int) -> None:
    raw = RawClient(port, C.MQTT_5)
    raw.connect("recvmax", properties={"receive_maximum": 2})
    raw.send(C.Subscribe(1, [("rm/#", C.SubOptions(1))]))
    raw.recv_type(C.Suback)
    pub = Paho(port, v5=True)
    for i in range(5):
        pub.publish("rm/x", str(i).encode(), qos=1)
    first = [raw.recv_type(C.Publish) for _ in range(2)]
    with pytest.raises(AssertionError):
        raw.recv(timeout=0.5)  # the window is full: nothing more until we acknowledge
    raw.send(C.PubAck(first[0].packet_id))
    third = raw.recv_type(C.Publish)
    assert [p.payload for p in first + [third]] == [b"0", b"1", b"2"]
    for p in first[1:] + [third]:
        raw.send(C.PubAck(p.packet_id))
    rest = [raw.recv_type(C.Publish) for _ in range(2)]
    assert [p.payload for p in rest] == [b"3", b"4"]
    raw.close()
    pub.disconnect()


def test_maximum_packet_size_both_ways_raw(port: int) -> None:
    raw = RawClient(port, C.MQTT_5)
    ack = raw.connect("maxpkt", properties={"maximum_packet_size": 200})
    raw.send(C.Subscribe(1, [("mp/#", C.SubOptions(1))]))
    raw.recv_type(C.Suback)
    pub = Paho(port, v5=True)
    pub.publish("mp/x", b"x" * 500, qos=1)  # too big for this client: dropped for it
    pub.publish("mp/x", b"small", qos=1)
    p = raw.recv_type(C.Publish)
    assert p.payload == b"small"
    raw.send(C.PubAck(p.packet_id))
    pub.disconnect()
    # a packet above the server's maximum closes the connection with 0x95
    limit = ack.properties["maximum_packet_size"]
    header = C.encode(C.Publish("mp/big", b"x" * (limit + 10), 0))[:64]
    raw.send(header)  # the server judges by the announced length, before the body arrives
    got = raw.closed_by_server()
    assert isinstance(got[-1], C.Disconnect) and got[-1].reason_code == C.RC_PACKET_TOO_LARGE


def test_server_keepalive_and_small_packet_limit(tmp_path_factory, tmp_path) -> None:
    cfg = config_file(tmp_path, "mqtt_server_keepalive = 7\nmqtt_max_packet_size = 1000\n")
    srv = start_unimq(tmp_path_factory, "--config", cfg)
    try:
        raw = RawClient(srv.ports["mqtt"], C.MQTT_5)
        ack = raw.connect("ka", keepalive=300)
        assert ack.properties["server_keep_alive"] == 7
        assert ack.properties["maximum_packet_size"] == 1000
        raw.send(C.encode(C.Publish("big", b"x" * 2000, 0))[:100])
        got = raw.closed_by_server()
        assert isinstance(got[-1], C.Disconnect) and got[-1].reason_code == C.RC_PACKET_TOO_LARGE
        c = Paho(srv.ports["mqtt"], v5=True)  # the server keeps serving
        c.subscribe("ok", options=opts(1))
        c.publish("ok", b"fine", qos=1)
        assert c.get().payload == b"fine"
        c.disconnect()
    finally:
        srv.stop()


def test_will_delay_and_will_properties_raw(port: int) -> None:
    watcher = Paho(port, v5=True)
    watcher.subscribe("wd/#", options=opts(1))
    # a delayed will is published after its delay when the client does not come back
    raw = RawClient(port, C.MQTT_5)
    will = C.Will("wd/late", b"gone for good", 1, False,
                  {"will_delay_interval": 1, "user_property": [("why", "crash")], "content_type": "text/plain"})
    raw.connect("wd-1", clean=True, will=will, properties={"session_expiry_interval": 60})
    raw.close()
    m = watcher.get()
    assert (m.topic, m.payload) == ("wd/late", b"gone for good")
    assert m.properties.UserProperty == [("why", "crash")] and m.properties.ContentType == "text/plain"
    # ... and not at all when the client reconnects within the delay
    raw = RawClient(port, C.MQTT_5)
    raw.connect("wd-2", clean=True, will=C.Will("wd/never", b"x", 1, False, {"will_delay_interval": 30}),
                properties={"session_expiry_interval": 60})
    raw.close()
    time.sleep(0.3)
    back = RawClient(port, C.MQTT_5)
    assert back.connect("wd-2", clean=False, properties={"session_expiry_interval": 60}).session_present
    back.send(C.Disconnect())
    back.close()
    # DISCONNECT with reason 0x04 publishes the will at once
    raw = RawClient(port, C.MQTT_5)
    raw.connect("wd-3", will=C.Will("wd/asked", b"by request", 1, False))
    raw.send(C.Disconnect(C.RC_DISCONNECT_WITH_WILL))
    raw.close()
    m = watcher.get()
    assert (m.topic, m.payload) == ("wd/asked", b"by request")
    watcher.nothing(0.5)
    watcher.disconnect()


def test_receive_maximum_enforced_for_publishes_written_in_one_send_raw(port: int) -> None:
    raw = RawClient(port, C.MQTT_5)
    ack = raw.connect("recvmax-in")
    limit = ack.properties["receive_maximum"]
    # one more unacknowledged QoS 2 PUBLISH than allowed, all in one write
    data = b"".join(C.encode(C.Publish("rmi/x", b"%d" % i, 2, packet_id=i + 1, properties={}), C.MQTT_5)
                    for i in range(limit + 1))
    raw.send(data)
    got = raw.closed_by_server()
    assert isinstance(got[-1], C.Disconnect) and got[-1].reason_code == C.RC_RECEIVE_MAX_EXCEEDED, got[-3:]
    assert sum(isinstance(p, C.PubRec) for p in got) <= limit  # no PUBREC past the limit


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A server with a small Receive Maximum and a keepalive cap (Mosquitto's max_keepalive)."""
    cfg = config_file(tmp_path_factory.mktemp("cfg-capped"), "mqtt_receive_maximum = 10\nmqtt_max_keepalive = 3\n")
    srv = start_unimq(tmp_path_factory, "--config", cfg)
    yield srv.ports["mqtt"]
    srv.stop()


def test_receive_maximum_counts_the_publishes_of_one_read_raw(capped: int) -> None:
    raw = RawClient(capped, C.MQTT_5)
    ack = raw.connect("recvmax-batch")
    limit = ack.properties["receive_maximum"]
    assert limit == 10
    # eleven unacknowledged QoS 2 PUBLISHes in one write: the server reads them in one batch
    raw.send(b"".join(C.encode(C.Publish("rmb/x", b"%d" % i, 2, packet_id=i + 1), C.MQTT_5)
                      for i in range(limit + 1)))
    got = raw.closed_by_server()
    assert isinstance(got[-1], C.Disconnect) and got[-1].reason_code == C.RC_RECEIVE_MAX_EXCEEDED, got[-3:]
    assert [p.packet_id for p in got if isinstance(p, C.PubRec)] == list(range(1, limit + 1))


def _silent_with_will(port: int, keepalive: int, topic: str) -> Paho:
    """A paho v5 client with a will that goes silent (its network loop stops, the socket stays open)."""
    c = Paho(port, v5=True, keepalive=keepalive, will=(topic, b"gone", 1, False))
    c.c.loop_stop()
    return c


def test_keepalive_cap_holds_a_long_keepalive_to_it_paho(capped: int) -> None:
    watcher = Paho(capped, v5=True)
    watcher.subscribe("kacap/#", options=opts(1))
    c = _silent_with_will(capped, 600, "kacap/long")
    flags, rc, props = c.connack[-1]
    assert props.ServerKeepAlive == 3  # asked for 600, capped
    assert watcher.get(timeout=15).topic == "kacap/long"  # dropped after 1.5 x 3 s of silence
    # a 3.1.1 client asking for no keepalive at all is held to the cap too (no way to tell it)
    raw = RawClient(capped)
    raw.connect("kacap-zero", keepalive=0, will=C.Will("kacap/zero", b"gone", 1, False))
    assert watcher.get(timeout=15).topic == "kacap/zero"
    raw.close()
    watcher.disconnect()


def test_keepalive_below_the_cap_is_the_clients_own_paho(capped: int) -> None:
    watcher = Paho(capped, v5=True)
    watcher.subscribe("kaown/#", options=opts(1))
    c = _silent_with_will(capped, 1, "kaown/short")
    flags, rc, props = c.connack[-1]
    assert not hasattr(props, "ServerKeepAlive")  # its own 1 s stands
    m = watcher.get(timeout=15)
    assert (m.topic, m.payload) == ("kaown/short", b"gone")
    watcher.disconnect()
