"""Unit tests of adapters.amqp.mapping: the AMQP publish <-> unified message contract.

Why: every other door reads the ``amqp_*`` properties this module writes, so the
names, the header copies and the routing-key / MQTT-topic rules are a contract
(module docstring, README "AMQP 0-9-1 door"). Tests call the module directly.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import struct

import pytest
from pamqp import encode as pencode

from adapters.amqp import codec, mapping
from core_broker.model import Message
from gateway.naming import MQTT_OTHER_TOPIC, P_MQTT_TOPIC

pytestmark = pytest.mark.timeout(30)


def _decode(enc: bytes) -> dict:
    """Decode encoded content properties (flags + fields) as a full content header payload."""
    payload = struct.pack(">HHQ", 60, 0, 0) + enc
    _cls, _size, props, _raw = codec.decode_properties(payload)
    return props


ALL_PROPS = {
    "content_type": "application/json",
    "content_encoding": "gzip",
    "delivery_mode": 2,
    "priority": 7,
    "correlation_id": "corr-1",
    "reply_to": "amq.rabbitmq.reply-to",
    "expiration": "60000",
    "message_id": "mid-42",
    "timestamp": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
    "message_type": "order.created",
    "user_id": "guest",
    "app_id": "billing",
    "cluster_id": "c1",
}


def test_basic_properties_become_amqp_properties() -> None:
    m = mapping.build_message("orders", None, "orders", "rk", dict(ALL_PROPS), None, b"x", ())
    p = m.properties
    assert p["amqp_content_type"] == "application/json"
    assert p["amqp_content_encoding"] == "gzip"
    assert p["amqp_delivery_mode"] == "2"
    assert p["amqp_priority"] == "7"
    assert p["amqp_correlation_id"] == "corr-1"
    assert p["amqp_reply_to"] == "amq.rabbitmq.reply-to"
    assert p["amqp_expiration"] == "60000"
    assert p["amqp_message_id"] == "mid-42"
    assert p["amqp_timestamp"] == str(int(ALL_PROPS["timestamp"].timestamp()))  # seconds
    assert p["amqp_type"] == "order.created"
    assert p["amqp_user_id"] == "guest"
    assert p["amqp_app_id"] == "billing"
    assert p["amqp_cluster_id"] == "c1"
    assert p["amqp_exchange"] == "orders"
    assert all(isinstance(v, str) for v in p.values())
    assert m.protocol == "amqp"
    assert m.keys == ("mid-42",)  # message-id is the key
    assert m.tag == "rk"  # routing key is the tag
    assert m.body == b"x"


def test_properties_round_trip_through_delivery_encoding() -> None:
    m = mapping.build_message("orders", None, "orders", "rk", dict(ALL_PROPS), None, b"x", ())
    enc, exchange, rk = mapping.encoded_delivery(m)
    assert (exchange, rk) == ("orders", "rk")
    got = _decode(enc)
    for name, v in ALL_PROPS.items():
        if name == "timestamp":
            ts = got[name]
            secs = ts if isinstance(ts, int) else int(ts.timestamp())
            assert secs == int(v.timestamp())
        else:
            assert got[name] == v, name


def test_default_exchange_absent_and_tag_none_for_empty_key() -> None:
    m = mapping.build_message("amq.default", None, "", "", {}, None, b"", ())
    assert "amqp_exchange" not in m.properties
    assert m.tag is None
    assert mapping.route_of(m) == ("", "")
    assert m.keys == ()


def test_long_routing_key_kept_in_property_and_tag_truncated() -> None:
    rk = "k" * 200
    m = mapping.build_message("ex", None, "ex", rk, {}, None, b"", ())
    assert m.tag == rk[: mapping.TAG_MAX]
    assert m.properties["amqp_routing_key"] == rk
    assert mapping.route_of(m) == ("ex", rk)
    _, _, exchange, got_rk = mapping.delivery_of(m)
    assert (exchange, got_rk) == ("ex", rk)


def test_routing_key_at_tag_limit_is_not_duplicated() -> None:
    rk = "k" * mapping.TAG_MAX
    m = mapping.build_message("ex", None, "ex", rk, {}, None, b"", ())
    assert m.tag == rk
    assert "amqp_routing_key" not in m.properties


RABBIT_HEADERS = {
    "s": "text",
    "i": 42,
    "neg": -7,
    "big": 2**40,
    "f": 1.5,
    "yes": True,
    "no": False,
    "dec": decimal.Decimal("3.14"),
    "when": datetime.datetime(2024, 5, 6, 7, 8, 9),
    "tbl": {"nested": "v"},
    "arr": ["a", 1],
    "void": None,
    "__internal": "hidden",
    "amqp_content_type": "spoof",
}


def test_headers_table_kept_exactly_and_plain_values_copied() -> None:
    raw = pencode.field_table(RABBIT_HEADERS)
    m = mapping.build_message("ex", None, "ex", "rk", {"headers": dict(RABBIT_HEADERS)}, raw, b"", ())
    p = m.properties
    assert base64.b64decode(p["amqp_headers"]) == raw  # byte for byte
    assert p["s"] == "text"
    assert p["i"] == "42"
    assert p["neg"] == "-7"
    assert p["big"] == str(2**40)
    assert p["f"] == "1.5"
    assert p["yes"] == "true" and p["no"] == "false"
    assert p["dec"] == "3.14"
    for k in ("when", "tbl", "arr", "void", "__internal"):
        assert k not in p, k  # not string / number / boolean, or reserved
    assert "amqp_content_type" not in p  # a header cannot spoof a basic property
    back = mapping.headers_of(m)
    assert back["s"] == "text" and back["i"] == 42 and back["tbl"] == {"nested": "v"}
    assert back["arr"] == ["a", 1]


def test_headers_encoded_when_raw_table_not_given() -> None:
    m = mapping.build_message("ex", None, "ex", "rk", {"headers": {"a": "b", "n": 3}}, None, b"", ())
    assert mapping.headers_of(m) == {"a": "b", "n": 3}
    out, raw, _, _ = mapping.delivery_of(m)
    assert raw == base64.b64decode(m.properties["amqp_headers"])
    assert "headers" not in out  # passed on raw, not re-built from properties


def test_headers_delivered_byte_for_byte() -> None:
    raw = pencode.field_table({"x": "y", "n": 1})
    m = mapping.build_message("ex", None, "ex", "rk", {"headers": {"x": "y", "n": 1}}, raw, b"", ())
    enc, _, _ = mapping.encoded_delivery(m)
    assert raw in enc
    assert _decode(enc)["headers"] == {"x": "y", "n": 1}


def test_corrupt_stored_headers_decode_as_empty() -> None:
    m = Message("ex", b"", properties={"amqp_headers": "!!!not base64!!!"}, protocol="amqp")
    assert mapping.headers_of(m) == {}
    m2 = Message("ex", b"", properties={"amqp_headers": base64.b64encode(b"\xff\xff").decode()}, protocol="amqp")
    assert mapping.headers_of(m2) == {}


def test_amqp_message_without_headers_has_none() -> None:
    m = Message("ex", b"", properties={"amqp_exchange": "ex", "foo": "bar"}, protocol="amqp")
    assert mapping.headers_of(m) == {}


def test_bad_integer_property_is_dropped_on_delivery() -> None:
    m = Message("ex", b"", properties={"amqp_priority": "high", "amqp_delivery_mode": "2"}, protocol="amqp")
    out, _, _, _ = mapping.delivery_of(m)
    assert "priority" not in out
    assert out["delivery_mode"] == 2


def test_other_protocol_properties_become_headers() -> None:
    m = Message("sensors", b"", tag="t", properties={"color": "red", "amqp_app_id": "a"}, protocol="http")
    assert mapping.headers_of(m) == {"color": "red"}
    out, raw, exchange, rk = mapping.delivery_of(m)
    assert raw is None
    assert out["headers"] == {"color": "red"}
    assert out["app_id"] == "a"
    assert (exchange, rk) == ("", "sensors")  # default exchange, routing key = topic
    enc, ex2, rk2 = mapping.encoded_delivery(m)
    assert (ex2, rk2) == ("", "sensors")
    assert _decode(enc)["headers"] == {"color": "red"}


def test_mqtt_published_message_delivered_via_amq_topic() -> None:
    m = Message("home", b"", properties={P_MQTT_TOPIC: "home/kitchen/temp.c"}, protocol="mqtt")
    _, _, exchange, rk = mapping.delivery_of(m)
    assert exchange == "amq.topic"
    assert rk == "home.kitchen.temp/c"  # '.' and '/' swap


@pytest.mark.parametrize(
    ("vhost", "exchange", "rk", "topic", "mqtt"),
    [
        ("/", "amq.topic", "a.b.c", "a", "a/b/c"),
        ("/", "amq.topic", "x/y.z", "x.y", "x.y/z"),
        ("/", "amq.topic", ".a", MQTT_OTHER_TOPIC, "/a"),
        ("/", "amq.topic", "%sys.x", MQTT_OTHER_TOPIC, "%sys/x"),
        ("/", "amq.topic", "", "amq.topic", None),
        ("/", "orders", "a.b", "orders", None),
        ("/", "", "q1", "amq.default", None),
        ("/", "%weird", "k", "amqp-%weird", None),
        ("/", "bad\x01name", "k", "amqp-bad\x01name", None),
        ("prod", "orders", "k", "prod~orders", None),
        ("prod", "amq.topic", "a.b", "prod~a", "a/b"),
        ("%v", "orders", "k", "amqp-%v~orders", None),
    ],
)
def test_unified_topic_rules(vhost: str, exchange: str, rk: str, topic: str, mqtt: str | None) -> None:
    assert mapping.unified_topic(vhost, exchange, rk) == (topic, mqtt)


def test_unified_topic_never_longer_than_255() -> None:
    topic, _ = mapping.unified_topic("v" * 200, "e" * 200, "k")
    assert len(topic) <= 255


def test_amq_topic_publish_stores_mqtt_topic_property() -> None:
    topic, mq = mapping.unified_topic("/", "amq.topic", "a.b.c")
    m = mapping.build_message(topic, mq, "amq.topic", "a.b.c", {}, None, b"", ())
    assert m.topic == "a"
    assert m.properties[P_MQTT_TOPIC] == "a/b/c"
    assert mapping.route_of(m) == ("amq.topic", "a.b.c")


def test_lmq_topic_percent_encodes_and_bounds_length() -> None:
    assert mapping.lmq_topic("/", "q1") == "%LMQ%amqp/%2F/q1"
    assert mapping.lmq_topic("v h", "a/b") == "%LMQ%amqp/v%20h/a%2Fb"
    long_a = mapping.lmq_topic("/", "q" * 300)
    long_b = mapping.lmq_topic("/", "q" * 301)
    assert len(long_a) <= 255 and len(long_b) <= 255
    assert long_a != long_b  # the hash keeps distinct queues distinct


def test_property_template_cache_gives_same_result_and_is_not_shared_when_mutated() -> None:
    props = {"content_type": "text/plain", "headers": {"h": "v"}}
    raw_props = codec.encode_properties(props)
    a = mapping.build_message("amq.default", None, "", "q", props, None, b"1", (), raw_props=raw_props)
    b = mapping.build_message("ex", None, "ex", "q", props, None, b"2", (), raw_props=raw_props)
    assert a.properties["amqp_content_type"] == "text/plain" and a.properties["h"] == "v"
    assert "amqp_exchange" not in a.properties
    assert b.properties["amqp_exchange"] == "ex"
    # the per-message exchange must not leak into the cached template shared by later publishes
    c = mapping.build_message("amq.default", None, "", "q", props, None, b"3", (), raw_props=raw_props)
    assert "amqp_exchange" not in c.properties


def test_set_route_adds_and_removes() -> None:
    p = {"amqp_exchange": "old", "amqp_routing_key": "x" * 200}
    assert mapping.set_route(p, "", "short") == "short"
    assert "amqp_exchange" not in p and "amqp_routing_key" not in p
    assert mapping.set_route(p, "ex", "") is None
    assert p["amqp_exchange"] == "ex"
    long_rk = "r" * 129
    assert mapping.set_route(p, "ex", long_rk) == long_rk[:128]
    assert p["amqp_routing_key"] == long_rk


def test_with_headers_replaces_header_copies() -> None:
    m = mapping.build_message("ex", None, "ex", "rk", {"headers": {"old": "1", "keep": "k"}}, None, b"", ())
    m.properties = dict(m.properties, other="o")
    p = mapping.with_headers(m, {"keep": "k2", "x-death": [{"count": 1}], "amqp_bad": "no", "n": 5})
    assert "old" not in p  # copies of the old table's headers are dropped
    assert p["keep"] == "k2"
    assert p["n"] == "5"
    assert "amqp_bad" not in p
    assert p["amqp_exchange"] == "ex"  # other properties kept
    m2 = Message("ex", b"", properties=p, protocol="amqp")
    assert mapping.headers_of(m2) == {"keep": "k2", "x-death": [{"count": 1}], "amqp_bad": "no", "n": 5}
    assert m.properties.get("keep") == "k"  # the original is not mutated


def test_with_headers_accepts_decoded_non_utf8_bytes() -> None:
    m = Message("ex", b"", properties={}, protocol="amqp")
    p = mapping.with_headers(m, {"bin": b"\xff\xfe", "nested": {"b": b"\x80"}, "lst": [b"\x81"]})
    back = mapping.headers_of(Message("ex", b"", properties=p, protocol="amqp"))
    assert bytes(back["bin"]) == b"\xff\xfe"
    assert bytes(back["nested"]["b"]) == b"\x80"
