"""The sans-io MQTT codec: round trips, strict validation, and a property-based fuzz.

Why these: the codec is the door's attack surface. Every packet a client may
send must decode to what was encoded (3.1.1 and 5.0, every property type), a
violation must surface as MQTTProtocolError with the v5 reason code the server
answers with, and no byte string whatsoever may make ``feed`` raise anything
else (hypothesis generates them, both random and mutated valid packets).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.mqtt import codec as C
from adapters.mqtt.topics import TopicTrie, filter_matches, unified_topic, validate_filter


def roundtrip(pkt: C.Packet, version: int, *, server_side: bool = True) -> C.Packet:
    data = C.encode(pkt, version)
    d = C.Decoder(server_side=server_side, version=None if server_side else version)
    if server_side and pkt.type != C.CONNECT:
        d.feed(C.encode(C.Connect("x", protocol_level=version), version))
    out = []
    for i in range(len(data)):  # byte by byte: the decoder must buffer partial packets
        out.extend(d.feed(data[i : i + 1]))
    assert len(out) == 1, out
    return out[0]


V5_PUBLISH_PROPS = {
    "payload_format_indicator": 1,
    "message_expiry_interval": 3600,
    "topic_alias": 3,
    "response_topic": "resp/x",
    "correlation_data": b"\x00\xff",
    "user_property": [("k", "v"), ("k", "v2"), ("ünï", "cødé")],
    "content_type": "text/plain",
}


@pytest.mark.parametrize("version", [C.MQTT_311, C.MQTT_5])
def test_roundtrip_client_packets(version: int) -> None:
    v5 = version == C.MQTT_5
    will = C.Will("w/t", b"bye", 1, True, {"will_delay_interval": 5, "content_type": "x"} if v5 else {})
    pkts: list[C.Packet] = [
        C.Publish("a/b", b"payload", 0),
        C.Publish("a/b", b"x" * 300, 1, retain=True, packet_id=1),
        C.Publish("a/b", b"", 2, dup=True, packet_id=65535, properties=V5_PUBLISH_PROPS if v5 else None),
        C.PubAck(5), C.PubRec(6), C.PubRel(7), C.PubComp(8),
        C.Subscribe(9, [("a/+", C.SubOptions(1)), ("b/#", C.SubOptions(2, *(True, True, 2) if v5 else ()))],
                    {"subscription_identifier": [268_435_455]} if v5 else {}),
        C.Unsubscribe(10, ["a/+", "b/#"]),
        C.PingReq(),
        C.Disconnect(),
    ]
    if v5:
        pkts += [C.PubAck(11, 0x10, {"reason_string": "no subscribers"}), C.Disconnect(0x04, {"session_expiry_interval": 9}),
                 C.Auth(0x18, {"authentication_method": "m"})]
    for p in pkts:
        assert roundtrip(p, version) == p, p
    connect = C.Connect("cid", protocol_level=version, clean_start=False, keepalive=30, will=will,
                        username="u", password=b"p\x00w",
                        properties={"session_expiry_interval": 60, "receive_maximum": 10} if v5 else {})
    assert roundtrip(connect, version) == connect


@pytest.mark.parametrize("version", [C.MQTT_311, C.MQTT_5])
def test_roundtrip_server_packets(version: int) -> None:
    v5 = version == C.MQTT_5
    pkts: list[C.Packet] = [
        C.Connack(True, 0, {"assigned_client_identifier": "x", "receive_maximum": 5} if v5 else {}),
        C.Suback(3, [0, 1, 2, 0x80]),
        C.PingResp(),
        C.Publish("t", b"x", 1, packet_id=3, properties={"subscription_identifier": [1, 2]} if v5 else None),
    ]
    if v5:
        pkts.append(C.Unsuback(4, [0, 0x11]))
    for p in pkts:
        assert roundtrip(p, version, server_side=False) == p, p


def feed_all(data: bytes, version: int | None = None) -> list[C.Packet]:
    d = C.Decoder()
    if version is not None:
        d.feed(C.encode(C.Connect("x", protocol_level=version), version))
    return d.feed(data)


def err(data: bytes, version: int | None = C.MQTT_311) -> C.MQTTProtocolError:
    with pytest.raises(C.MQTTProtocolError) as ei:
        feed_all(data, version)
    return ei.value


def test_malformed_inputs_raise_protocol_errors_with_reason_codes() -> None:
    # remaining length of 5 bytes
    assert err(b"\x30\xff\xff\xff\xff\x7f").reason_code == C.RC_MALFORMED_PACKET
    # invalid UTF-8 in a topic name
    assert err(b"\x30\x05\x00\x02\xc3\x28x").reason_code == C.RC_MALFORMED_PACKET
    # U+0000 in a topic
    assert err(b"\x30\x05\x00\x02a\x00x").reason_code == C.RC_MALFORMED_PACKET
    # wildcard in a topic name
    assert err(b"\x30\x05\x00\x02a#x").reason_code == C.RC_TOPIC_NAME_INVALID
    # QoS 3, DUP at QoS 0, packet id 0
    assert err(b"\x36\x05\x00\x01ax\x00").reason_code == C.RC_MALFORMED_PACKET
    assert err(b"\x38\x04\x00\x01ax").reason_code == C.RC_MALFORMED_PACKET
    assert err(b"\x32\x05\x00\x01a\x00\x00").reason_code == C.RC_MALFORMED_PACKET
    # wrong reserved flags on SUBSCRIBE / PUBREL
    assert err(b"\x80\x06\x00\x01\x00\x01a\x00").reason_code == C.RC_MALFORMED_PACKET
    assert err(b"\x60\x02\x00\x01").reason_code == C.RC_MALFORMED_PACKET
    # a packet before CONNECT
    assert err(b"\xc0\x00", version=None).reason_code == C.RC_PROTOCOL_ERROR
    # a second CONNECT
    assert err(C.encode(C.Connect("y"))).reason_code == C.RC_PROTOCOL_ERROR
    # a packet type only servers send
    assert err(b"\x20\x02\x00\x00").reason_code == C.RC_PROTOCOL_ERROR
    # wrong protocol name / unsupported level
    e = err(b"\x10\x0c\x00\x04MQTX\x04\x02\x00\x3c\x00\x00", version=None)
    assert e.reason_code == C.RC_MALFORMED_PACKET
    e = err(b"\x10\x0c\x00\x04MQTT\x07\x02\x00\x3c\x00\x00", version=None)
    assert e.reason_code == C.RC_UNSUPPORTED_PROTOCOL_VERSION and e.connack_v3 == C.CONNACK_V3_UNACCEPTABLE_VERSION
    # reserved CONNECT flag
    assert err(b"\x10\x0c\x00\x04MQTT\x04\x03\x00\x3c\x00\x00", version=None).reason_code == C.RC_MALFORMED_PACKET
    # v5: duplicate property, property not allowed in that packet, topic alias 0
    dup_prop = b"\x30\x0e\x00\x01a\x0a\x02\x00\x00\x00\x01\x02\x00\x00\x00\x01"
    assert err(dup_prop, C.MQTT_5).reason_code == C.RC_PROTOCOL_ERROR
    assert err(b"\x30\x06\x00\x01a\x02\x11\x00", C.MQTT_5).reason_code == C.RC_MALFORMED_PACKET
    assert err(b"\x30\x07\x00\x01a\x03\x23\x00\x00", C.MQTT_5).reason_code == C.RC_TOPIC_ALIAS_INVALID
    # packets decoded before the bad one are handed over with the error
    e = err(b"\xc0\x00\xc0\x00\x36\x00")
    assert len(e.packets) == 2


def test_packet_too_large_is_seen_from_the_header() -> None:
    d = C.Decoder(max_packet_size=100)
    d.feed(C.encode(C.Connect("x")))
    with pytest.raises(C.MQTTProtocolError) as ei:
        d.feed(b"\x30\xe8\x07")  # announces 1000 bytes; nothing more sent yet
    assert ei.value.reason_code == C.RC_PACKET_TOO_LARGE


def test_topic_helpers() -> None:
    assert unified_topic("a/b/c") == "a"
    assert unified_topic("a") == "a"
    assert unified_topic("/a/b") == "mqtt-other"
    assert unified_topic("%SYS/x") == "mqtt-other"
    assert unified_topic("$SYS/broker") == "$SYS"
    for ok in ("a", "a/b", "+", "#", "a/+/b", "a/#", "+/+", "/", "$SYS/#"):
        validate_filter(ok)
    for bad in ("", "a#", "a/#/b", "a+", "a/b+/c", "##"):
        with pytest.raises(C.MQTTProtocolError):
            validate_filter(bad)
    owners = {}  # entry -> its key (the trie asks an entry's key of its owner)
    trie = TopicTrie(owners.__getitem__)

    def add(f: str, key: object, entry: str) -> None:
        owners[entry] = key
        trie.add(f, key, entry)

    filters = ["#", "+", "a/#", "a/+", "a/b", "+/b", "$SYS/#", "+/+/+", "a/+/c/#"]
    for i, f in enumerate(filters):
        add(f, i, f)
    for topic in ("a", "a/b", "a/b/c", "a/x/c/d", "$SYS/x", "$SYS", "x/b", "/b", "a//c"):
        assert sorted(trie.match(topic)) == sorted(f for f in filters if filter_matches(f, topic)), topic
    trie.remove("a/+", 3)
    assert "a/+" not in trie.match("a/b")
    # filters without wildcards are kept whole: one owner, several, one replaced, removed
    add("a/b", "x", "a/b by x")
    add("a/b", "y", "a/b by y")
    add("a/b", "y", "a/b by y again")
    assert sorted(trie.match("a/b")) == ["#", "+/b", "a/#", "a/b", "a/b by x", "a/b by y again"]
    assert trie.remove("a/b", 4) == "a/b" and trie.remove("a/b", "x") == "a/b by x"
    assert trie.remove("a/b", "x") is None and trie.remove("c", "x") is None
    assert sorted(trie.match("a/b")) == ["#", "+/b", "a/#", "a/b by y again"]
    assert trie.count == len(list(trie)) == len(filters) - 1  # - "a/+" - "a/b" + "a/b by y"
    add("a/b", "z", "a/b by z")  # a second owner after the first one was left alone
    assert trie.remove("a/b", "y") == "a/b by y again" and trie.match("a/b")[0] == "a/b by z"


# ------------------------------------------------------------------ fuzz

VALID = [
    C.encode(C.Connect("fuzz", protocol_level=C.MQTT_5, will=C.Will("w", b"x", 1, False, {"user_property": [("a", "b")]}),
                       username="u", password=b"p", properties={"session_expiry_interval": 5}), C.MQTT_5),
    C.encode(C.Publish("a/b", b"hello", 1, packet_id=3, properties=V5_PUBLISH_PROPS), C.MQTT_5),
    C.encode(C.Subscribe(1, [("a/+", C.SubOptions(1, True, True, 1))], {"subscription_identifier": [3]}), C.MQTT_5),
    C.encode(C.Unsubscribe(2, ["a/+"], {"user_property": [("x", "y")]}), C.MQTT_5),
    C.encode(C.PubRel(4, 0x92, {"reason_string": "r"}), C.MQTT_5),
    C.encode(C.Disconnect(0x04, {"session_expiry_interval": 1}), C.MQTT_5),
]


def _decode_all(chunks: list[bytes], connect_first: bool, version: int) -> None:
    d = C.Decoder()
    if connect_first:
        d.feed(C.encode(C.Connect("x", protocol_level=version), version))
    try:
        for c in chunks:
            d.feed(c)
    except C.MQTTProtocolError as e:
        assert isinstance(e.reason_code, int) and 0x80 <= e.reason_code <= 0xFF


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=64), max_size=6), st.booleans(), st.sampled_from([C.MQTT_311, C.MQTT_5]))
def test_fuzz_random_bytes_raise_only_protocol_errors(chunks: list[bytes], connect_first: bool, version: int) -> None:
    _decode_all(chunks, connect_first, version)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID), st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), min_size=1, max_size=4),
       st.integers(0, 400), st.booleans())
def test_fuzz_mutated_valid_packets(base: bytes, flips: list[tuple[int, int]], cut: int, connect_first: bool) -> None:
    data = bytearray(base)
    for pos, val in flips:
        if data:
            data[pos % len(data)] = val
    data = data[: max(cut, 1)] if cut < len(data) else data
    _decode_all([bytes(data)], connect_first and base[0] >> 4 != C.CONNECT, C.MQTT_5)
