"""Retained messages and persistent sessions survive a unimq restart.

Why a restart in the middle: the issue's promise is that a device's session
(clean session 0 in 3.1.1, a session expiry interval in 5.0) and a retained
topic outlive the broker process, not only the client's connection. Each test
stops `unimq up` with SIGTERM and starts it again on the same data directory.
"""

from __future__ import annotations

import time

import pytest

from adapters.mqtt import codec as C
from mqtt_fixtures import Paho, RawClient, config_file

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def cfg(tmp_path) -> str:
    return config_file(tmp_path)


def restart(unimq_server, srv):
    assert srv.stop() == 0
    new = unimq_server("--config", srv.config, data_dir=srv.data_dir)
    new.config = srv.config
    return new


def start(unimq_server, cfg: str):
    srv = unimq_server("--config", cfg)
    srv.config = cfg
    return srv


def test_retained_messages_survive_restart_and_clear(unimq_server, cfg: str) -> None:
    srv = start(unimq_server, cfg)
    port = srv.ports["mqtt"]
    pub = Paho(port)
    pub.publish("home/kitchen/temp", b"21", qos=1, retain=True)
    pub.publish("home/hall/temp", b"19", qos=0, retain=True)
    pub.publish("home/hall/temp", b"20", qos=1, retain=True)  # replaces
    pub.publish("home/attic/temp", b"5", qos=1, retain=True)
    pub.publish("home/attic/temp", b"", qos=1, retain=True)  # empty payload clears
    late = Paho(port)
    late.subscribe("home/+/temp", qos=1)
    got = {m.topic: (m.payload, m.retain) for m in late.get_n(2)}
    assert got == {"home/kitchen/temp": (b"21", True), "home/hall/temp": (b"20", True)}
    late.nothing(0.3)
    # a live subscriber gets new retained publishes with retain = 0 (3.1.1 3.3.1.3)
    pub.publish("home/kitchen/temp", b"22", qos=1, retain=True)
    m = late.get()
    assert (m.payload, m.retain) == (b"22", False)
    pub.disconnect()
    late.disconnect()

    srv = restart(unimq_server, srv)
    port = srv.ports["mqtt"]
    after = Paho(port, v5=True)
    after.subscribe("home/#", qos=1)
    got = {m.topic: m.payload for m in after.get_n(2)}
    assert got == {"home/kitchen/temp": b"22", "home/hall/temp": b"20"}
    after.nothing(0.3)
    after.publish("home/hall/temp", b"", qos=1, retain=True)
    after.disconnect()

    srv = restart(unimq_server, srv)
    again = Paho(srv.ports["mqtt"])
    again.subscribe("home/#", qos=1)
    assert [m.topic for m in again.get_n(1)] == ["home/kitchen/temp"]
    again.nothing(0.3)
    again.disconnect()


@pytest.mark.parametrize("v5", [pytest.param(False, id="v311-clean0"), pytest.param(True, id="v5-expiry")])
def test_persistent_session_survives_restart_in_order(unimq_server, cfg: str, v5: bool) -> None:
    srv = start(unimq_server, cfg)
    port = srv.ports["mqtt"]
    kw = {"v5": v5, "clean": False}
    if v5:
        kw["session_expiry"] = 3600
    dev = Paho(port, "device-1", **kw)
    dev.subscribe("cmd/device-1/#", qos=1)
    dev.subscribe("fleet/+", qos=2)
    dev.disconnect()
    pub = Paho(port)
    for i in range(20):
        pub.publish("cmd/device-1/set", f"c{i}".encode(), qos=1)
    pub.publish("fleet/all", b"q2-before", qos=2)
    pub.publish("cmd/device-1/set", b"qos0 is not queued", qos=0)
    pub.disconnect()

    srv = restart(unimq_server, srv)
    port = srv.ports["mqtt"]
    pub = Paho(port)
    for i in range(20, 25):  # while the device is still away, after the restart
        pub.publish("cmd/device-1/set", f"c{i}".encode(), qos=1)
    pub.disconnect()
    dev = Paho(port, "device-1", **kw)
    flags, rc, _ = dev.connack[-1]
    assert flags.session_present
    got = dev.get_n(26)
    cmds = [m.payload.decode() for m in got if m.topic == "cmd/device-1/set"]
    assert cmds == [f"c{i}" for i in range(25)]
    assert [(m.payload, m.qos) for m in got if m.topic == "fleet/all"] == [(b"q2-before", 2)]
    dev.nothing(0.5)
    # the subscriptions themselves came back: live messages still arrive
    pub = Paho(port)
    pub.publish("fleet/x", b"live", qos=1)
    assert dev.get().payload == b"live"
    pub.disconnect()
    dev.disconnect()

    # acknowledged messages are not delivered again after one more restart
    srv = restart(unimq_server, srv)
    dev = Paho(srv.ports["mqtt"], "device-1", **kw)
    assert dev.connack[-1][0].session_present
    dev.nothing(1.0)
    dev.disconnect()


def test_clean_session_discards_state(unimq_server, cfg: str) -> None:
    srv = start(unimq_server, cfg)
    port = srv.ports["mqtt"]
    dev = Paho(port, "dev-clean", clean=False)
    dev.subscribe("cs/#", qos=1)
    dev.disconnect()
    # reconnect with clean session 1: the old session and its subscriptions are gone
    dev = Paho(port, "dev-clean", clean=True)
    assert not dev.connack[-1][0].session_present
    pub = Paho(port)
    pub.publish("cs/x", b"nobody", qos=1)
    dev.nothing(0.5)
    dev.disconnect()
    pub.disconnect()


def test_v5_session_expiry_and_expiry_on_disconnect(unimq_server, cfg: str) -> None:
    srv = start(unimq_server, cfg)
    port = srv.ports["mqtt"]
    # session expiry 1 s: gone after it elapses
    raw = RawClient(port, C.MQTT_5)
    raw.connect("short", clean=True, properties={"session_expiry_interval": 1})
    raw.send(C.Subscribe(1, [("se/#", C.SubOptions(1))]))
    raw.recv_type(C.Suback)
    raw.send(C.Disconnect())
    raw.close()
    time.sleep(2.5)
    raw = RawClient(port, C.MQTT_5)
    assert raw.connect("short", clean=False, properties={"session_expiry_interval": 60}).session_present is False
    # DISCONNECT may change the expiry: 0 ends the session at once
    raw.send(C.Subscribe(1, [("se/#", C.SubOptions(1))]))
    raw.recv_type(C.Suback)
    raw.send(C.Disconnect(0, {"session_expiry_interval": 0}))
    raw.close()
    time.sleep(0.3)
    raw = RawClient(port, C.MQTT_5)
    assert raw.connect("short", clean=False, properties={"session_expiry_interval": 60}).session_present is False
    raw.send(C.Disconnect())
    raw.close()
    # expiry 0 at CONNECT and non-zero at DISCONNECT is a protocol error
    raw = RawClient(port, C.MQTT_5)
    raw.connect("zero", clean=True)
    raw.send(C.Disconnect(0, {"session_expiry_interval": 30}))
    got = raw.closed_by_server()
    assert got and isinstance(got[-1], C.Disconnect) and got[-1].reason_code == C.RC_PROTOCOL_ERROR


def test_qos2_inbound_packet_ids_survive_restart(unimq_server, cfg: str) -> None:
    """A QoS 2 message stored before a restart is not stored again when the client resends it.

    The client saw no PUBREC (say), so after the restart it resends the PUBLISH with
    DUP and the same packet id; the restored session remembers the id, answers PUBREC
    without storing a second copy, and completes PUBREL/PUBCOMP with success (0x92,
    packet identifier not found, if the id had been forgotten). The id is free again
    after PUBCOMP: a new message with it is stored.
    """
    srv = start(unimq_server, cfg)
    port = srv.ports["mqtt"]
    watcher = Paho(port, "q2-watcher", clean=False)
    watcher.subscribe("q2/#", qos=2)
    dev = RawClient(port, C.MQTT_5)
    expiry = {"session_expiry_interval": 3600}
    assert not dev.connect("q2-dev", clean=False, properties=expiry).session_present
    dev.send(C.Publish("q2/x", b"once", 2, packet_id=7))
    rec = dev.recv_type(C.PubRec)
    assert (rec.packet_id, rec.reason_code) == (7, 0)
    assert watcher.get().payload == b"once"
    watcher.disconnect()
    dev.sock.close()

    srv = restart(unimq_server, srv)
    port = srv.ports["mqtt"]
    dev = RawClient(port, C.MQTT_5)
    assert dev.connect("q2-dev", clean=False, properties=expiry).session_present
    dev.send(C.Publish("q2/x", b"once", 2, dup=True, packet_id=7))
    rec = dev.recv_type(C.PubRec)
    assert (rec.packet_id, rec.reason_code) == (7, 0)
    dev.send(C.PubRel(7))
    comp = dev.recv_type(C.PubComp)
    assert (comp.packet_id, comp.reason_code) == (7, 0)
    dev.send(C.Publish("q2/x", b"twice", 2, packet_id=7))
    assert dev.recv_type(C.PubRec).reason_code == 0
    dev.send(C.PubRel(7))
    assert dev.recv_type(C.PubComp).reason_code == 0
    dev.sock.close()
    watcher = Paho(port, "q2-watcher", clean=False)
    assert [m.payload for m in watcher.get_n(1)] == [b"twice"]
    watcher.nothing(0.5)
    watcher.disconnect()


def test_qos2_outbound_pubrel_survives_restart(unimq_server, cfg: str) -> None:
    """A subscriber that PUBRECed a QoS 2 message before a restart gets its PUBREL after it.

    paho (and most clients) hand an inbound QoS 2 message to the application only
    on PUBREL. The door acknowledges the message's queue offset at PUBREC, so if
    the PUBREL owed were forgotten in a restart the message would be lost for that
    subscriber; re-sending it as a new PUBLISH instead would deliver it twice.
    """
    srv = start(unimq_server, cfg)
    port = srv.ports["mqtt"]
    expiry = {"session_expiry_interval": 3600}
    sub = RawClient(port, C.MQTT_5)
    assert not sub.connect("q2-sub", clean=False, properties=expiry).session_present
    sub.send(C.Subscribe(1, [("q2o/#", C.SubOptions(qos=2))]))
    assert sub.recv_type(C.Suback).reason_codes == [2]
    pub = Paho(port)
    pub.publish("q2o/a", b"exactly-once", qos=2)
    pub.disconnect()
    p = sub.recv_type(C.Publish)
    assert (p.payload, p.qos) == (b"exactly-once", 2)
    sub.send(C.PubRec(p.packet_id))
    assert sub.recv_type(C.PubRel).packet_id == p.packet_id
    sub.close()  # gone before PUBCOMP: its application has not seen the message yet

    srv = restart(unimq_server, srv)
    port = srv.ports["mqtt"]
    sub = RawClient(port, C.MQTT_5)
    assert sub.connect("q2-sub", clean=False, properties=expiry).session_present
    rel = sub.recv_type(C.PubRel)
    assert (rel.packet_id, rel.reason_code) == (p.packet_id, 0)
    sub.send(C.PubComp(p.packet_id))
    pub = Paho(port)
    pub.publish("q2o/a", b"next", qos=2)
    pub.disconnect()
    nxt = sub.recv_type(C.Publish)  # the next message, not the completed one again
    assert (nxt.payload, nxt.dup) == (b"next", False)
    sub.send(C.PubRec(nxt.packet_id))
    assert sub.recv_type(C.PubRel).packet_id == nxt.packet_id
    sub.send(C.PubComp(nxt.packet_id))
    sub.close()
