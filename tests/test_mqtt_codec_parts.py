"""The codec's parts imported directly: properties, encoder and decoder agree byte for byte."""

from __future__ import annotations

import pytest

from adapters.mqtt.decoder import Decoder
from adapters.mqtt.encoder import encode, encode_publish, encode_publish0
from adapters.mqtt.packets import MQTT_5, PUBLISH, RC_MALFORMED_PACKET, MQTTProtocolError, Publish
from adapters.mqtt.properties import _read_properties, encode_properties


def test_properties_round_trip():
    props = {"content_type": "text/plain", "user_property": [("a", "1"), ("a", "2")], "message_expiry_interval": 9,
             "subscription_identifier": [300]}
    raw = encode_properties(props)
    got, end = _read_properties(raw, 0, len(raw), PUBLISH)
    assert got == props and end == len(raw)


def test_property_not_allowed_in_the_packet_is_refused():
    raw = encode_properties({"session_expiry_interval": 5})  # a CONNECT property
    with pytest.raises(MQTTProtocolError):
        _read_properties(raw, 0, len(raw), PUBLISH)


def test_fast_publish_encoder_matches_the_general_one_and_decodes():
    fast = encode_publish(b"a/b", b"payload", 1, True, False, 7, encode_properties({"content_type": "x"}))
    general = encode(Publish("a/b", b"payload", 1, True, False, 7, {"content_type": "x"}), MQTT_5)
    assert fast == general
    client = Decoder(server_side=False, version=MQTT_5)
    [p] = client.feed(fast)
    assert (p.topic, p.payload, p.qos, p.retain, p.packet_id, p.properties) == ("a/b", b"payload", 1, True, 7,
                                                                                   {"content_type": "x"})


@pytest.mark.parametrize("topic_len", [1, 8, 123, 124, 300])
@pytest.mark.parametrize("payload_len", [0, 1, 100, 125, 126, 127, 128, 16_383, 16_384, 2_097_152])
def test_qos0_publish_encoder_gives_the_same_bytes(topic_len: int, payload_len: int):
    """The QoS 0 delivery encoder (one concatenation) against the general one, around every
    remaining-length boundary (1, 2, 3 and 4 bytes), and decoded back."""
    topic = ("t/" * topic_len)[:topic_len].encode()
    payload = bytes(i & 0xFF for i in range(payload_len))
    fast = encode_publish0(topic, payload)
    assert fast == encode_publish(topic, payload) == encode(Publish(topic.decode(), payload, 0, False, False, 0))
    [p] = Decoder(server_side=False).feed(fast)
    assert (p.topic, bytes(p.payload), p.qos, p.retain, p.dup) == (topic.decode(), payload, 0, False, False)


def test_truncated_remaining_length_is_malformed():
    d = Decoder(server_side=False, version=MQTT_5)
    with pytest.raises(MQTTProtocolError) as e:
        d.feed(b"\x30\xff\xff\xff\xff\x01")
    assert e.value.reason_code == RC_MALFORMED_PACKET
