"""How an MQTT PUBLISH maps onto the one model, and back (README, "MQTT door").

A PUBLISH to ``a/b/c`` is one stored message in unified topic ``a``
(``gateway.naming``) with ``protocol = "mqtt"``, the full MQTT topic in property
``mqtt_topic``, the QoS in ``mqtt_qos``, v5 user properties as plain properties
and the other v5 properties as ``mqtt_*`` properties, so any processor pop or
pull of topic ``a`` reads it, body and properties intact. :class:`Outgoing` is
the way back: what a PUBLISH to a subscriber is built from, whether the message
came from memory, the store or another door.
"""

from __future__ import annotations

import base64
import time
from typing import Any

from gateway.naming import P_MQTT_CLIENT_ID, P_MQTT_QOS, P_MQTT_TOPIC

from . import codec as C

__all__ = ["Outgoing", "message_properties", "forward_props", "v5_props_of", "outgoing_from_stored", "PubItem",
           "now_ms"]

# message properties this door writes (everything else is a user property)
P_TOPIC = P_MQTT_TOPIC
P_QOS = P_MQTT_QOS
P_RETAIN = "mqtt_retain"
P_EXPIRY_AT = "mqtt_expiry_at"
P_CONTENT_TYPE = "mqtt_content_type"
P_RESPONSE_TOPIC = "mqtt_response_topic"
P_CORRELATION = "mqtt_correlation_data"  # base64
P_PAYLOAD_FORMAT = "mqtt_payload_format"
# several gateways: the gateway that stored the message and its number there (adapters/mqtt/tail.py)
P_ORIGIN = "mqtt_gw"
QOS_STR = ("0", "1", "2")
# The MQTT 5 user property whose value (comma-separated) becomes the message's keys, so query by
# key (the console's message search, ``unimq admin messages search --key``) finds MQTT messages.
USER_KEYS = "keys"
MQTT_KEYS = frozenset({P_MQTT_CLIENT_ID, P_TOPIC, P_QOS, P_RETAIN, P_EXPIRY_AT, P_CONTENT_TYPE, P_RESPONSE_TOPIC, P_CORRELATION,
                       P_PAYLOAD_FORMAT, P_ORIGIN})


def now_ms() -> int:
    return int(time.time() * 1000)


class Outgoing:
    """One application message on its way out: what a PUBLISH to a subscriber is built from."""

    # ``trace``: (message id, topic) of a traced message (adapters/mqtt/tracing.py); left unset,
    # not set to None, so messages pay nothing for it while tracing is off
    __slots__ = ("topic", "tb", "payload", "qos", "retain", "props", "expiry_at", "_v5", "raw", "ut", "trace", "q0")

    def __init__(self, topic: str, payload: bytes, qos: int, retain: bool, props: dict[str, Any] | None,
                 expiry_at: int = 0, tb: bytes | None = None, ut: str = "") -> None:
        self.topic = topic
        # The unified topic its deliveries are counted under in the processor's metrics
        # ("messages_out"); empty for a message read back from the store (the processor
        # counted that read) and for $SYS values (never stored).
        self.ut = ut
        self.tb = topic.encode() if tb is None else tb  # the topic encoded (shared when the caller has it)
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.props = props  # v5 properties to forward (no alias, no subscription ids, no expiry)
        self.expiry_at = expiry_at  # absolute ms, 0 = never
        self._v5: bytes | None = None
        # its 3.1.1 QoS 0 PUBLISH once built (Connection.deliver_q0): encoded once for every subscriber
        self.q0: bytes | None = None
        self.raw: dict[str, str] | None = None  # stored properties, when props are still to derive

    def v5props(self) -> dict[str, Any] | None:
        if self.raw is not None:
            self.props = v5_props_of(self.raw)
            self.raw = None
        return self.props

    def expired(self, now_ms: int) -> bool:
        return bool(self.expiry_at) and now_ms >= self.expiry_at


def message_properties(topic: str, qos: int, retain: bool, props: dict[str, Any] | None) -> dict[str, str]:
    """The unified-model properties of an MQTT PUBLISH."""
    out = {P_TOPIC: topic, P_QOS: str(qos)}
    if retain:
        out[P_RETAIN] = "1"
    if props:
        for k, v in props.get("user_property", ()):
            out[k] = v
        if "message_expiry_interval" in props:
            out[P_EXPIRY_AT] = str(now_ms() + props["message_expiry_interval"] * 1000)
        if "content_type" in props:
            out[P_CONTENT_TYPE] = props["content_type"]
        if "response_topic" in props:
            out[P_RESPONSE_TOPIC] = props["response_topic"]
        if "correlation_data" in props:
            out[P_CORRELATION] = base64.b64encode(props["correlation_data"]).decode()
        if "payload_format_indicator" in props:
            out[P_PAYLOAD_FORMAT] = str(props["payload_format_indicator"])
    return out


def forward_props(props: dict[str, Any] | None) -> dict[str, Any] | None:
    """The v5 properties of a received PUBLISH that are forwarded to subscribers as they are."""
    if not props:
        return None
    fwd = {k: v for k, v in props.items() if k not in ("topic_alias", "message_expiry_interval",
                                                         "subscription_identifier")}
    return fwd or None


def v5_props_of(props: dict[str, str]) -> dict[str, Any] | None:
    """The v5 PUBLISH properties a stored message carries (for v5 subscribers only)."""
    v5: dict[str, Any] = {}
    users = [(k, v) for k, v in props.items() if k not in MQTT_KEYS and not k.startswith("__")]
    if P_PAYLOAD_FORMAT in props:
        v5["payload_format_indicator"] = 1 if props[P_PAYLOAD_FORMAT] == "1" else 0
    if P_CONTENT_TYPE in props:
        v5["content_type"] = props[P_CONTENT_TYPE]
    if P_RESPONSE_TOPIC in props:
        v5["response_topic"] = props[P_RESPONSE_TOPIC]
    if P_CORRELATION in props:
        try:
            v5["correlation_data"] = base64.b64decode(props[P_CORRELATION])
        except (ValueError, TypeError):
            pass
    if users:
        v5["user_property"] = users
    return v5 or None


def outgoing_from_stored(props: dict[str, str], body: bytes, fallback_topic: str) -> Outgoing:
    """Rebuild the outbound form of a stored message (LMQ delivery, retained reload).

    The v5 properties are derived lazily (only a v5 subscriber needs them)."""
    topic = props.get(P_TOPIC) or fallback_topic
    q = props.get(P_QOS)
    qos = 1 if q is None else (0 if q == "0" else 2 if q == "2" else 1)
    expiry_at = 0
    e = props.get(P_EXPIRY_AT)
    if e is not None:
        try:
            expiry_at = int(e)
        except ValueError:
            expiry_at = 0
    out = Outgoing(topic, body, qos, props.get(P_RETAIN) == "1", None, expiry_at)
    out.raw = props
    return out


def PubItem(topic: str, payload: bytes, qos: int, retain: bool, props: dict[str, Any] | None) -> C.Publish:
    """One message to publish: a PUBLISH packet's fields (client publishes are passed as they are)."""
    return C.Publish(topic, payload, qos, retain, False, 0, props)
