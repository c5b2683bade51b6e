"""The one-model mapping: an AMQP publish as a unified message, and back.

Why here and written down: every other door (HTTP, gRPC, MQTT, Spark) reads
what this door stores, so the property names are a contract (README, "AMQP
0-9-1 door").

- Unified topic. A publish to ``amq.topic`` with routing key ``a.b.c`` is
  the MQTT topic ``a/b/c`` (RabbitMQ's MQTT-plugin convention: ``.`` and
  ``/`` swap), stored in unified topic ``a`` with property ``mqtt_topic`` =
  ``a/b/c`` — the MQTT door's own rule (``adapters.mqtt.topics``), so both
  doors write one stream. Any other exchange ``X`` is stored in unified
  topic ``X`` (the default exchange as ``amq.default``); names that cannot
  be topics (empty, starting with ``%``) get an ``amqp-`` prefix. Vhosts
  other than ``/`` prefix the topic with ``<vhost>~``.
- Each AMQP queue the publish reaches is a light message queue
  ``%LMQ%amqp/<vhost>/<queue>`` (names percent-encoded) that the one stored
  record is also indexed into.
- Basic properties become ``amqp_<name>`` properties (``amqp_content_type``,
  ``amqp_delivery_mode``, ``amqp_correlation_id``, ``amqp_reply_to``,
  ``amqp_expiration``, ``amqp_message_id``, ``amqp_timestamp`` (seconds),
  ``amqp_type``, ``amqp_user_id``, ``amqp_app_id``, ``amqp_priority``,
  ``amqp_content_encoding``, ``amqp_cluster_id``). The routing key is the
  message's tag (``amqp_routing_key`` only when longer than 128
  characters) and ``amqp_exchange`` names the exchange (absent: the default
  exchange). The headers table is
  kept exactly (``amqp_headers``: base64 of the table as the publisher
  encoded it) and, for other protocols and SQL92 filters, every header whose
  value is a string, number or boolean is also a plain property of the same
  name. The AMQP ``message-id`` is the message's key (query by key), the
  routing key its tag.
- Delivered to an AMQP consumer, a message published by another protocol
  gets all its properties as headers.
"""

from __future__ import annotations

import base64
import decimal
import urllib.parse
from typing import Any

from pamqp import decode as pdecode
from pamqp import encode as pencode

from core_broker.model import DispatchTarget, Message, StoredMessage

from .codec import encode_properties

# The cross-protocol rules (a/b/c -> unified topic a; routing key a.b.c <-> MQTT a/b/c) are
# gateway.naming's, shared with the MQTT door, so both doors write the same stream.
from gateway.naming import P_MQTT_TOPIC, mqtt_topic_of_routing_key, unified_topic_of_mqtt

P_PREFIX = "amqp_"
P_EXCHANGE = "amqp_exchange"
P_ROUTING_KEY = "amqp_routing_key"
P_HEADERS = "amqp_headers"

# pamqp attribute name -> stored property key
PROP_KEYS: dict[str, str] = {
    "content_type": "amqp_content_type",
    "content_encoding": "amqp_content_encoding",
    "delivery_mode": "amqp_delivery_mode",
    "priority": "amqp_priority",
    "correlation_id": "amqp_correlation_id",
    "reply_to": "amqp_reply_to",
    "expiration": "amqp_expiration",
    "message_id": "amqp_message_id",
    "timestamp": "amqp_timestamp",
    "message_type": "amqp_type",
    "user_id": "amqp_user_id",
    "app_id": "amqp_app_id",
    "cluster_id": "amqp_cluster_id",
}
_INT_PROPS = ("delivery_mode", "priority", "timestamp")
_PROP_ITEMS = tuple(PROP_KEYS.items())

DEFAULT_EXCHANGE_TOPIC = "amq.default"


def lmq_topic(vhost: str, queue: str) -> str:
    """The light message queue an AMQP queue lives in."""
    name = f"%LMQ%amqp/{urllib.parse.quote(vhost, safe='')}/{urllib.parse.quote(queue, safe='')}"
    if len(name) > 255:
        import hashlib

        name = name[:200] + "~" + hashlib.sha1(name.encode()).hexdigest()
    return name


mqtt_topic_of = mqtt_topic_of_routing_key  # amq.topic routing key -> MQTT topic ('.' and '/' swap)


def _safe_topic(name: str) -> str:
    if not name or name[0] == "%" or any(ord(c) < 32 for c in name):
        name = "amqp-" + name
    return name[:255]


def unified_topic(vhost: str, exchange: str, routing_key: str) -> tuple[str, str | None]:
    """(unified topic, MQTT topic or None) a publish is stored under."""
    mqtt = None
    if exchange == "amq.topic" and routing_key:
        mqtt = mqtt_topic_of(routing_key)
        topic = unified_topic_of_mqtt(mqtt)
    else:
        topic = _safe_topic(exchange or DEFAULT_EXCHANGE_TOPIC)
    if vhost != "/":
        topic = _safe_topic(f"{vhost}~{topic}")
    return topic, mqtt


def _plain(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, decimal.Decimal)):
        return str(v)
    return None


_TEMPLATES: dict[bytes, tuple[dict[str, str], str | None]] = {}


def _props_part(props: dict[str, Any], raw_headers: bytes | None) -> tuple[dict[str, str], str | None]:
    """The stored properties a publish's basic properties and headers become, and its message id."""
    p: dict[str, str] = {}
    if props:
        headers = props.get("headers")
        if headers:
            for k, v in headers.items():
                if k[:2] == "__" or k.startswith(P_PREFIX):
                    continue
                s = _plain(v)
                if s is not None:
                    p[k] = s
            if raw_headers is None:
                raw_headers = pencode.field_table(headers)
            p[P_HEADERS] = base64.b64encode(raw_headers).decode("ascii")
        for name, v in props.items():
            key = PROP_KEYS.get(name)
            if key is not None and v is not None:
                p[key] = v if v.__class__ is str else str(int(v.timestamp()) if hasattr(v, "timestamp") else v)
    mid = props.get("message_id") if props else None
    return p, mid


def build_message(
    topic: str,
    mqtt_topic: str | None,
    exchange: str,
    routing_key: str,
    props: dict[str, Any],
    raw_headers: bytes | None,
    body: bytes,
    targets: tuple[DispatchTarget, ...],
    raw_props: bytes | None = None,
) -> Message:
    """The unified message for one publish (protocol amqp), dispatched into ``targets`` (queues' LMQs).

    ``raw_props`` (the property block as received) keys a small cache of the
    property part: publishers repeat a few property sets, so most publishes
    copy a prepared dict instead of converting every property again.
    """
    part = None
    if raw_props is not None:
        part = _TEMPLATES.get(raw_props)
        if part is None and len(raw_props) <= 512:
            part = _props_part(props, raw_headers)
            if len(_TEMPLATES) >= 4096:
                _TEMPLATES.clear()
            _TEMPLATES[raw_props] = part
    if part is None:
        part = _props_part(props, raw_headers)
    long_rk = len(routing_key) > TAG_MAX
    tag: str | None = routing_key[:TAG_MAX] if long_rk else (routing_key or None)
    if not exchange and not long_rk and mqtt_topic is None and raw_props is not None:
        # nothing per message to add: messages share the (never mutated) property dict;
        # whoever changes a message's properties assigns a new dict (the processor, dead-lettering)
        p = part[0]
    else:
        p = {}
        if exchange:
            p[P_EXCHANGE] = exchange
        if long_rk:
            p[P_ROUTING_KEY] = routing_key
        if part[0]:
            p.update(part[0])
        if mqtt_topic is not None:
            p[P_MQTT_TOPIC] = mqtt_topic
    mid = part[1]
    return Message(
        topic,
        body,
        tag=tag,
        keys=(mid,) if mid else (),
        properties=p,
        protocol="amqp",
        extra_dispatch=targets,
    )


TAG_MAX = 128


def set_route(p: dict[str, str], exchange: str, routing_key: str) -> str | None:
    """Record where a message was published; returns its tag (the routing key).

    The routing key is the message's tag (so RocketMQ-style tag filters see it);
    ``amqp_routing_key`` holds it only when it is longer than a tag may be, and
    ``amqp_exchange`` is left out for the default exchange (fewer properties on
    the hot path: absent means "").
    """
    if exchange:
        p[P_EXCHANGE] = exchange
    else:
        p.pop(P_EXCHANGE, None)
    if len(routing_key) > TAG_MAX:
        p[P_ROUTING_KEY] = routing_key
        return routing_key[:TAG_MAX]
    p.pop(P_ROUTING_KEY, None)
    return routing_key or None


def route_of(m: Message) -> tuple[str, str]:
    """(exchange, routing key) an AMQP-published message was published with."""
    props = m.properties
    return props.get(P_EXCHANGE, ""), props.get(P_ROUTING_KEY) or m.tag or ""


def headers_of(m: Message) -> dict[str, Any]:
    """The AMQP headers table of a stored message (decoded)."""
    props = m.properties
    raw = props.get(P_HEADERS)
    if raw is not None:
        try:
            return pdecode.field_table(base64.b64decode(raw))[1]
        except (ValueError, TypeError):
            return {}
    if m.protocol == "amqp":
        return {}
    return {k: v for k, v in props.items() if not k.startswith(P_PREFIX)}


def delivery_of(m: Message) -> tuple[dict[str, Any], bytes | None, str, str]:
    """(properties for the content header, raw headers table or None, exchange, routing key)."""
    props = m.properties
    out: dict[str, Any] = {}
    raw: bytes | None = None
    for name, key in _PROP_ITEMS:
        v = props.get(key)
        if v is not None:
            if name in _INT_PROPS:
                try:
                    out[name] = int(v)
                except ValueError:
                    continue
            else:
                out[name] = v
    h = props.get(P_HEADERS)
    if h is not None:
        try:
            raw = base64.b64decode(h)
        except (ValueError, TypeError):
            raw = None
    elif m.protocol != "amqp":
        headers = {k: v for k, v in props.items() if not k.startswith(P_PREFIX)}
        if headers:
            out["headers"] = headers
    if m.protocol == "amqp":
        return out, raw, props.get(P_EXCHANGE, ""), props.get(P_ROUTING_KEY) or m.tag or ""
    mq = props.get(P_MQTT_TOPIC)
    if mq is not None:
        return out, raw, "amq.topic", mqtt_topic_of(mq)
    return out, raw, "", m.topic


_PROP_KEY_LIST = tuple(PROP_KEYS.values()) + (P_HEADERS,)
_ENCODED: dict[tuple[Any, ...], bytes] = {}


def encoded_delivery(m: Message) -> tuple[bytes, str, str]:
    """(content header properties, encoded; exchange; routing key) for delivering ``m``.

    The encoding of an AMQP-published message's properties is cached by their
    values: most traffic repeats a few property sets (content type, delivery
    mode), so the hot path is one tuple build and one dict lookup.
    """
    props = m.properties
    if m.protocol == "amqp":
        get = props.get
        key = tuple([get(k) for k in _PROP_KEY_LIST])
        enc = _ENCODED.get(key)
        if enc is None:
            out, raw, _, _ = delivery_of(m)
            enc = encode_properties(out, raw)
            if len(_ENCODED) >= 4096:
                _ENCODED.clear()
            _ENCODED[key] = enc
        return enc, get(P_EXCHANGE, ""), get(P_ROUTING_KEY) or m.tag or ""
    out, raw, exchange, rk = delivery_of(m)
    return encode_properties(out, raw), exchange, rk


def with_headers(m: Message, headers: dict[str, Any]) -> dict[str, str]:
    """A copy of ``m``'s properties with the headers table replaced (dead-lettering)."""
    p = {k: v for k, v in m.properties.items()}
    old = headers_of(m)
    for k in old:
        if p.get(k) is not None and not k.startswith(P_PREFIX):
            p.pop(k, None)
    for k, v in headers.items():
        if k[:2] == "__" or k.startswith(P_PREFIX):
            continue
        s = _plain(v)
        if s is not None:
            p[k] = s
    p[P_HEADERS] = base64.b64encode(pencode.field_table(_encodable(headers))).decode("ascii")
    return p


def _encodable(v: Any) -> Any:
    """pamqp decodes non-UTF-8 long strings as bytes but encodes only bytearray."""
    if isinstance(v, bytes):
        return bytearray(v)
    if isinstance(v, dict):
        return {k: _encodable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_encodable(x) for x in v]
    return v
