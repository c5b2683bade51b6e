"""Malformed input closes only the offending connection, with the right reason code.

Why over real sockets: the codec's unit tests show each violation is detected;
here the server must answer it the way the protocol says (v5: CONNACK or
DISCONNECT with the reason code; 3.1.1: CONNACK return code where one exists,
else a plain close) while a well-behaved client connected all along keeps
working and new clients keep being served.
"""

from __future__ import annotations

import pytest

from adapters.mqtt import codec as C
from mqtt_fixtures import config_file, Paho, RawClient, start_unimq

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    cfg = config_file(tmp_path_factory.mktemp("cfg"), "mqtt_max_packet_size = 4096\n")
    srv = start_unimq(tmp_path_factory, "--config", cfg)
    yield srv.ports["mqtt"]
    srv.stop()


@pytest.fixture(scope="module")
def bystander(port):
    c = Paho(port, "bystander")
    c.subscribe("by/#", qos=1)
    yield c
    c.disconnect()


def still_serving(port: int, bystander: Paho) -> None:
    fresh = Paho(port)
    fresh.publish("by/x", b"ping", qos=1)
    assert bystander.get().payload == b"ping"
    fresh.disconnect()


def connected(port: int, version: int) -> RawClient:
    raw = RawClient(port, version)
    assert raw.connect("bad-" + str(version)).reason_code == 0
    return raw


CASES_CONNECTED = {
    "bad remaining length": b"\x30\xff\xff\xff\xff\x01",
    "invalid utf-8 topic": b"\x30\x06\x00\x02\xc3\x28\x00x",
    "qos 3 publish": b"\x36\x05\x00\x01a\x00\x01",
    "subscribe with wrong flags": b"\x80\x06\x00\x01\x00\x01a\x00",
    "second connect": C.encode(C.Connect("again")),
    "server-only packet": b"\x90\x03\x00\x01\x00",
    "oversized packet": b"\x30\x80\x80\x01",  # announces 16 KiB > mqtt_max_packet_size
    "puback with packet id 0": b"\x40\x02\x00\x05\x40\x02\x00\x00",  # the PUBACK fast path's exit
}
EXPECTED_V5 = {
    "bad remaining length": C.RC_MALFORMED_PACKET,
    "invalid utf-8 topic": C.RC_MALFORMED_PACKET,
    "qos 3 publish": C.RC_MALFORMED_PACKET,
    "subscribe with wrong flags": C.RC_MALFORMED_PACKET,
    "second connect": C.RC_PROTOCOL_ERROR,
    "server-only packet": C.RC_PROTOCOL_ERROR,
    "oversized packet": C.RC_PACKET_TOO_LARGE,
    "puback with packet id 0": C.RC_MALFORMED_PACKET,
}


@pytest.mark.parametrize("case", list(CASES_CONNECTED))
@pytest.mark.parametrize("version", [C.MQTT_311, C.MQTT_5], ids=["v311", "v5"])
def test_malformed_after_connect(port: int, bystander: Paho, case: str, version: int) -> None:
    raw = connected(port, version)
    data = CASES_CONNECTED[case]
    if version == C.MQTT_5 and case == "second connect":
        data = C.encode(C.Connect("again", protocol_level=C.MQTT_5), C.MQTT_5)
    raw.send(data)
    got = raw.closed_by_server()
    if version == C.MQTT_5:
        assert got and isinstance(got[-1], C.Disconnect), got
        assert got[-1].reason_code == EXPECTED_V5[case]
        assert got[-1].properties.get("reason_string")
    else:
        assert not any(isinstance(p, C.Disconnect) for p in got)  # 3.1.1 just closes
    still_serving(port, bystander)


def test_packet_before_connect(port: int, bystander: Paho) -> None:
    for data in (b"\xc0\x00", C.encode(C.Publish("by/x", b"sneaky", 0)), b"\x82\x06\x00\x01\x00\x01#\x00"):
        raw = RawClient(port)
        raw.send(data)
        assert raw.closed_by_server() == []
    bystander.nothing(0.3)
    still_serving(port, bystander)


def test_wrong_protocol_name_and_level(port: int, bystander: Paho) -> None:
    raw = RawClient(port)
    raw.send(b"\x10\x0c\x00\x04MQTX\x04\x02\x00\x3c\x00\x00")  # wrong protocol name: closed
    assert raw.closed_by_server() == []
    raw = RawClient(port)
    raw.send(b"\x10\x0c\x00\x04MQTT\x07\x02\x00\x3c\x00\x00")  # unknown level: CONNACK 0x01 (3.1.1 3.1.2.2)
    got = raw.closed_by_server()
    assert len(got) == 1 and isinstance(got[0], C.Connack) and got[0].reason_code == 0x01
    still_serving(port, bystander)


def test_malformed_v5_connect_gets_connack_reason(port: int, bystander: Paho) -> None:
    raw = RawClient(port, C.MQTT_5)
    # v5 CONNECT whose properties hold a PUBLISH-only property (topic alias)
    body = b"\x00\x04MQTT\x05\x02\x00\x3c" + b"\x03\x23\x00\x01" + b"\x00\x01x"
    raw.send(bytes((0x10, len(body))) + body)
    got = raw.closed_by_server()
    assert len(got) == 1 and isinstance(got[0], C.Connack) and got[0].reason_code == C.RC_MALFORMED_PACKET
    raw = RawClient(port, C.MQTT_5)  # enhanced authentication is refused with 0x8C
    ack = raw.connect("auth", properties={"authentication_method": "SCRAM-SHA-1"})
    assert ack.reason_code == C.RC_BAD_AUTH_METHOD
    still_serving(port, bystander)


def test_garbage_flood_does_not_hurt_others(port: int, bystander: Paho) -> None:
    import os

    for _ in range(20):
        raw = RawClient(port)
        try:
            raw.send(os.urandom(512))
        except OSError:
            pass
        raw.close()
    still_serving(port, bystander)
