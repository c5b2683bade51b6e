"""The MQTT door against paho-mqtt (3.1.1 and 5.0) and raw packets, over `unimq up`.

Why paho: it is the reference client library devices and dashboards use; if
paho in both protocol versions sees a broker it cannot tell from Mosquitto,
devices connect unchanged. Raw packets (the door's own codec driving a plain
socket) check what paho hides: DUP flags, packet ids, QoS 2 handshakes, silence.
"""

from __future__ import annotations

import time

import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.mqtt import codec as C
from mqtt_fixtures import Paho, RawClient, config_file, start_unimq, wait_for

pytestmark = pytest.mark.timeout(120)

VERSIONS = [pytest.param(False, id="v311"), pytest.param(True, id="v5")]


@pytest.fixture(scope="module")
def port(tmp_path_factory) -> int:
    """One `unimq up` for the module (tests use their own topics and client ids)."""
    srv = start_unimq(tmp_path_factory, "--config", config_file(tmp_path_factory.mktemp("cfg")))
    yield srv.ports["mqtt"]
    srv.stop()


@pytest.mark.parametrize("v5", VERSIONS)
def test_publish_qos_0_1_2_end_to_end(port: int, v5: bool) -> None:
    sub = Paho(port, v5=v5)
    sub.subscribe(f"a{v5}/#", qos=2)
    sub1 = Paho(port, v5=v5)
    sub1.subscribe(f"a{v5}/b/+", qos=1)
    pub = Paho(port, v5=v5)
    for q in (0, 1, 2):
        pub.publish(f"a{v5}/b/c", f"m{q}".encode(), qos=q)
    got = sub.get_n(3)
    assert sorted((m.payload, m.qos) for m in got) == [(b"m0", 0), (b"m1", 1), (b"m2", 2)]
    got1 = sub1.get_n(3)
    assert sorted((m.payload, m.qos) for m in got1) == [(b"m0", 0), (b"m1", 1), (b"m2", 1)]
    assert all(m.topic == f"a{v5}/b/c" and not m.retain for m in got + got1)
    # in-order delivery per topic at QoS 1
    for i in range(50):
        pub.publish(f"a{v5}/order", str(i).encode(), qos=1)
    got = [int(m.payload) for m in sub.get_n(50)]
    assert got == list(range(50))
    for c in (sub, sub1, pub):
        c.disconnect()


def test_wildcards_and_dollar_topics(port: int) -> None:
    subs = {f: Paho(port) for f in ("#", "+/b", "sport/#", "sport/+", "+/+/c", "$SYS/#", "+/x")}
    for f, c in subs.items():
        c.subscribe(f, qos=1)
    pub = Paho(port)
    for t in ("a/b", "sport", "sport/tennis", "x/y/c", "$SYS/x", "$SYS/b"):
        pub.publish(t, t.encode(), qos=1)
    expected = {
        "#": {"a/b", "sport", "sport/tennis", "x/y/c"},  # not the $ topics
        "+/b": {"a/b"},  # not $SYS/b
        "sport/#": {"sport", "sport/tennis"},  # '#' includes the parent level
        "sport/+": {"sport/tennis"},
        "+/+/c": {"x/y/c"},
        "$SYS/#": {"$SYS/x", "$SYS/b"},
        "+/x": set(),  # not $SYS/x
    }
    for f, want in expected.items():
        c = subs[f]
        if f == "$SYS/#":  # the broker's own $SYS/broker/... statistics come too
            wait_for(lambda: want <= set(c.topics()), what="$SYS/x and $SYS/b")
            assert {t for t in c.topics() if not t.startswith("$SYS/broker/")} == want
            continue
        got = {m.topic for m in c.get_n(len(want))}
        assert got == want, f
        c.nothing(0.3)
    for c in [*subs.values(), pub]:
        c.disconnect()


@pytest.mark.parametrize("v5", VERSIONS)
def test_unsubscribe_and_granted_qos(port: int, v5: bool) -> None:
    c = Paho(port, v5=v5)
    topic = f"u/{v5}"
    rcs = c.subscribe(topic, qos=2)
    granted = [r.value if hasattr(r, "value") else r for r in rcs]
    assert granted == [2]
    c.publish(topic, b"one", qos=1)
    assert c.get().payload == b"one"
    c.c.unsubscribe(topic)
    time.sleep(0.3)
    c.publish(topic, b"two", qos=1)
    c.nothing(0.5)
    c.disconnect()


@pytest.mark.parametrize("v5", VERSIONS)
def test_session_takeover(port: int, v5: bool) -> None:
    cid = f"same-id-{v5}"
    first = Paho(port, cid, v5=v5)
    first.c.reconnect_delay_set(60, 120)  # no auto-reconnect fight with the second client
    second = Paho(port, cid, v5=v5)
    wait_for(lambda: first.disconnects, what="the first client to be disconnected")
    if v5:
        assert first.disconnects[0].value == C.RC_SESSION_TAKEN_OVER
    second.subscribe(f"t/o/{v5}", qos=1)
    second.publish(f"t/o/{v5}", b"still here", qos=1)
    assert second.get().payload == b"still here"
    first.c.loop_stop()
    second.disconnect()


@pytest.mark.parametrize("v5", VERSIONS)
def test_will_on_abrupt_close_not_on_disconnect(port: int, v5: bool) -> None:
    watcher = Paho(port, v5=v5)
    watcher.subscribe(f"will/{v5}/#", qos=1)
    clean = Paho(port, v5=v5, will=(f"will/{v5}/clean", b"should not", 1, False))
    clean.disconnect()
    dying = Paho(port, v5=v5, will=(f"will/{v5}/dying", b"gone", 1, False))
    dying.kill()
    m = watcher.get()
    assert (m.topic, m.payload) == (f"will/{v5}/dying", b"gone")
    watcher.nothing(0.5)
    watcher.disconnect()


def test_will_on_keepalive_expiry_raw(port: int) -> None:
    watcher = Paho(port)
    watcher.subscribe("ka/#", qos=1)
    raw = RawClient(port)
    ack = raw.connect("silent", keepalive=1, will=C.Will("ka/silent", b"timeout", 1, False))
    assert ack.reason_code == 0
    # say nothing: the server must drop us after 1.5 x keepalive and publish the will
    raw.closed_by_server(timeout=10)
    m = watcher.get()
    assert (m.topic, m.payload) == ("ka/silent", b"timeout")
    # a client that pings stays connected past 1.5 x keepalive
    alive = RawClient(port)
    alive.connect("pinger", keepalive=1)
    for _ in range(4):
        time.sleep(0.5)
        alive.send(C.PingReq())
        assert isinstance(alive.recv(), C.PingResp)
    alive.send(C.Disconnect())
    alive.close()
    watcher.disconnect()


def test_v5_keepalive_timeout_reason_code(port: int) -> None:
    raw = RawClient(port, C.MQTT_5)
    raw.connect("silent5", keepalive=1)
    got = raw.closed_by_server(timeout=10)
    assert got and isinstance(got[-1], C.Disconnect) and got[-1].reason_code == C.RC_KEEP_ALIVE_TIMEOUT


def test_qos2_handshake_and_duplicate_publish_raw(port: int) -> None:
    watcher = Paho(port)
    watcher.subscribe("q2/#", qos=2)
    raw = RawClient(port)
    raw.connect("q2pub")
    pub = C.Publish("q2/x", b"exactly once", qos=2, packet_id=7)
    raw.send(pub)
    assert raw.recv_type(C.PubRec).packet_id == 7
    # the client did not see PUBREC (say) and sends the PUBLISH again with DUP
    raw.send(C.Publish("q2/x", b"exactly once", qos=2, packet_id=7, dup=True))
    assert raw.recv_type(C.PubRec).packet_id == 7
    raw.send(C.PubRel(7))
    assert raw.recv_type(C.PubComp).packet_id == 7
    m = watcher.get()
    assert (m.payload, m.qos) == (b"exactly once", 2)
    watcher.nothing(0.5)
    # outbound QoS 2: the server's PUBLISH, our PUBREC, its PUBREL, our PUBCOMP
    raw.send(C.Subscribe(1, [("q2/in", C.SubOptions(2))]))
    assert raw.recv_type(C.Suback).reason_codes == [2]
    watcher.publish("q2/in", b"to raw", qos=2)
    p = raw.recv_type(C.Publish)
    assert (p.qos, p.payload) == (2, b"to raw")
    raw.send(C.PubRec(p.packet_id))
    assert raw.recv_type(C.PubRel).packet_id == p.packet_id
    raw.send(C.PubComp(p.packet_id))
    raw.send(C.PingReq())
    assert isinstance(raw.recv(), C.PingResp)
    raw.close()
    watcher.disconnect()


def test_dup_redelivery_on_reconnect_raw(port: int) -> None:
    raw = RawClient(port)
    assert raw.connect("dupper", clean=False).session_present is False
    raw.send(C.Subscribe(1, [("d/#", C.SubOptions(1))]))
    raw.recv_type(C.Suback)
    pub = Paho(port)
    for i in range(3):
        pub.publish("d/x", f"m{i}".encode(), qos=1)
    first = [raw.recv_type(C.Publish) for _ in range(3)]
    assert [p.payload for p in first] == [b"m0", b"m1", b"m2"] and not any(p.dup for p in first)
    raw.send(C.PubAck(first[0].packet_id))  # ack only the first
    raw.send(C.PingReq())
    raw.recv_type(C.PingResp)
    raw.close()  # abrupt
    time.sleep(0.2)
    pub.publish("d/x", b"m3", qos=1)  # while away
    raw = RawClient(port)
    assert raw.connect("dupper", clean=False).session_present is True
    again = [raw.recv_type(C.Publish) for _ in range(3)]
    assert [(p.payload, p.dup, p.packet_id) for p in again[:2]] == [
        (b"m1", True, first[1].packet_id),
        (b"m2", True, first[2].packet_id),
    ]
    assert (again[2].payload, again[2].dup) == (b"m3", False)
    for p in again:
        raw.send(C.PubAck(p.packet_id))
    raw.send(C.Disconnect())
    raw.close()
    pub.disconnect()


def test_client_id_assignment(port: int) -> None:
    raw = RawClient(port, C.MQTT_5)
    ack = raw.connect("")
    assert ack.reason_code == 0 and ack.properties["assigned_client_identifier"]
    raw.close()
    raw = RawClient(port)
    assert raw.connect("").reason_code == 0  # 3.1.1, clean session: the server assigns one
    raw.close()
    raw = RawClient(port)
    assert raw.connect("", clean=False).reason_code == C.CONNACK_V3_IDENTIFIER_REJECTED
    raw.close()
    c = Paho(port, "", v5=True)
    assert c.connack[-1][2].AssignedClientIdentifier
    c.disconnect()


def test_pingreq_and_connack_properties_v5(port: int) -> None:
    raw = RawClient(port, C.MQTT_5)
    ack = raw.connect("props")
    for k in ("receive_maximum", "topic_alias_maximum", "maximum_packet_size", "shared_subscription_available",
              "wildcard_subscription_available", "subscription_identifier_available", "retain_available"):
        assert k in ack.properties
    raw.send(C.PingReq())
    assert isinstance(raw.recv(), C.PingResp)
    raw.close()


@pytest.mark.parametrize("v5", VERSIONS)
def test_authentication(unimq_server, tmp_path, v5: bool) -> None:
    cfg = config_file(tmp_path, 'mqtt_allow_anonymous = false\n[mqtt_users]\nalice = "secret"\n')
    srv = unimq_server("--config", cfg)
    port = srv.ports["mqtt"]
    ok = Paho(port, v5=v5, username="alice", password="secret")
    ok.disconnect()
    bad = Paho(port, v5=v5, username="alice", password="wrong", connect=False)
    _, rc, _ = bad.connect(expect_ok=False)
    assert rc.is_failure and rc.value == C.RC_BAD_USERNAME_OR_PASSWORD  # paho maps 3.1.1's 4 to 0x86
    bad.c.loop_stop()
    anon = Paho(port, v5=v5, connect=False)
    _, rc, _ = anon.connect(expect_ok=False)
    assert rc.is_failure and rc.value == (C.RC_NOT_AUTHORIZED if v5 else C.RC_BAD_USERNAME_OR_PASSWORD)
    anon.c.loop_stop()


def test_takeover_of_a_clean_session_starts_fresh_raw(port: int) -> None:
    first = RawClient(port)
    assert first.connect("tk", clean=True).reason_code == 0
    first.send(C.Subscribe(1, [("tk/#", C.SubOptions(1))]))
    first.recv_type(C.Suback)
    second = RawClient(port)
    ack = second.connect("tk", clean=False)
    assert ack.reason_code == 0 and ack.session_present is False  # the clean session ended with its connection
    first.closed_by_server()
    third = RawClient(port)
    ack = third.connect("tk", clean=False)
    assert ack.session_present is True  # a persistent session is taken over with its state
    second.closed_by_server()
    third.send(C.Disconnect())
    third.close()
