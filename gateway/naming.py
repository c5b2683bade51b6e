"""The cross-protocol naming conventions: one message stored once, read by every door.

Why one module: an MQTT topic, an AMQP ``amq.topic`` routing key and a unified
(RocketMQ) topic name the same stream, and every door, the CloudEvents mapping
and Spark must agree on how. The rules (README, "One model, many protocols"):

- MQTT topic ``a/b/c`` is stored in unified topic ``a`` (its first level), with
  the full MQTT topic in property :data:`P_MQTT_TOPIC`. A first level that cannot
  be a topic name maps to :data:`MQTT_OTHER_TOPIC`.
- AMQP ``amq.topic`` routing key ``a.b.c`` is the MQTT topic ``a/b/c``
  (RabbitMQ's MQTT-plugin convention: ``.`` and ``/`` swap), so both doors write
  and read one stream.
- MQTT topic filters (``+`` one level, ``#`` the rest) are the pattern syntax for
  MQTT topics wherever they are matched (subscriptions, ACL rules).

Standard library only: Spark executors and every door import it.
"""

from __future__ import annotations

import re

__all__ = [
    "P_MQTT_TOPIC",
    "P_MQTT_QOS",
    "MQTT_OTHER_TOPIC",
    "AMQP_TOPIC_EXCHANGE",
    "unified_topic_of_mqtt",
    "mqtt_topic_of_routing_key",
    "routing_key_of_mqtt_topic",
    "mqtt_filter_matches",
]

#: The full MQTT topic of a message (written by the MQTT door, AMQP ``amq.topic``, ...):
#: what MQTT subscriptions match and AMQP topic bindings route on.
P_MQTT_TOPIC = "mqtt_topic"
#: The MQTT QoS a message was published with ("0", "1", "2"; absent: 1).
P_MQTT_QOS = "mqtt_qos"
#: The MQTT client id that published a message (a CloudEvent made of it names it as its source).
P_MQTT_CLIENT_ID = "mqtt_client_id"
#: The CloudEvents extension attribute that routes an event to MQTT subscribers and AMQP
#: ``amq.topic`` bindings: its value becomes the message's ``mqtt_topic`` (CloudEvents extension
#: names are lowercase letters and digits only, so no extension can be called ``mqtt_topic``).
CE_MQTT_TOPIC_EXTENSION = "mqtttopic"
#: The unified topic of MQTT topics whose first level cannot be a topic name.
MQTT_OTHER_TOPIC = "mqtt-other"
#: The AMQP exchange whose routing keys are MQTT topics.
AMQP_TOPIC_EXCHANGE = "amq.topic"

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SWAP = str.maketrans({".": "/", "/": "."})


def unified_topic_of_mqtt(mqtt_topic: str) -> str:
    """The unified topic an MQTT topic is stored in: its first level (``a/b/c`` -> ``a``).

    A first level that is empty (``/a``), starts with ``%`` (reserved for the
    broker), is longer than 255 characters or holds control characters maps to
    :data:`MQTT_OTHER_TOPIC`; the full MQTT topic is always in :data:`P_MQTT_TOPIC`.
    """
    first = mqtt_topic.split("/", 1)[0]
    if not first or first[0] == "%" or len(first) > 255 or _CONTROL.search(first):
        return MQTT_OTHER_TOPIC
    return first


def mqtt_topic_of_routing_key(routing_key: str) -> str:
    """``amq.topic`` routing key -> MQTT topic (``a.b.c`` -> ``a/b/c``; a ``/`` becomes ``.``)."""
    return routing_key.translate(_SWAP)


def routing_key_of_mqtt_topic(mqtt_topic: str) -> str:
    """MQTT topic -> ``amq.topic`` routing key (the inverse of :func:`mqtt_topic_of_routing_key`)."""
    return mqtt_topic.translate(_SWAP)


def mqtt_filter_matches(flt: str, topic: str) -> bool:
    """Does MQTT topic filter ``flt`` (``+`` one level, ``#`` the rest) match topic name ``topic``?

    A filter starting with a wildcard does not match a topic starting with ``$``
    (MQTT 4.7.2). One filter against one topic: retained lookups, ACL rules; the
    MQTT door's routing matches many filters at once with its trie."""
    if flt == topic:
        return True
    if topic.startswith("$") and flt[:1] in ("+", "#"):
        return False
    fl = flt.split("/")
    tl = topic.split("/")
    for i, f in enumerate(fl):
        if f == "#":
            return True
        if i >= len(tl):
            return False
        if f != "+" and f != tl[i]:
            return False
    return len(fl) == len(tl)
