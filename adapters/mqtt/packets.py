"""MQTT packet types, reason codes and the protocol error: what the codec's two halves share.

The packet classes are plain data (``__slots__``, no behaviour); the decoder
(``decoder.py``) makes them from bytes and the encoder (``encoder.py``) bytes
from them. Reason codes are MQTT 5.0's (section 2.4); 3.1.1 CONNACK return
codes beside them.
"""

from __future__ import annotations

from typing import Any

# ------------------------------------------------------------------ constants

MQTT_31, MQTT_311, MQTT_5 = 3, 4, 5

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15

# v5 reason codes used by the server (MQTT 5.0 section 2.4)
RC_SUCCESS = 0x00
RC_GRANTED_QOS1 = 0x01
RC_GRANTED_QOS2 = 0x02
RC_DISCONNECT_WITH_WILL = 0x04
RC_NO_MATCHING_SUBSCRIBERS = 0x10
RC_NO_SUBSCRIPTION_EXISTED = 0x11
RC_UNSPECIFIED_ERROR = 0x80
RC_MALFORMED_PACKET = 0x81
RC_PROTOCOL_ERROR = 0x82
RC_IMPLEMENTATION_SPECIFIC = 0x83
RC_UNSUPPORTED_PROTOCOL_VERSION = 0x84
RC_CLIENT_ID_NOT_VALID = 0x85
RC_BAD_USERNAME_OR_PASSWORD = 0x86
RC_NOT_AUTHORIZED = 0x87
RC_SERVER_UNAVAILABLE = 0x88
RC_SERVER_BUSY = 0x89
RC_SERVER_SHUTTING_DOWN = 0x8B
RC_BAD_AUTH_METHOD = 0x8C
RC_KEEP_ALIVE_TIMEOUT = 0x8D
RC_SESSION_TAKEN_OVER = 0x8E
RC_TOPIC_FILTER_INVALID = 0x8F
RC_TOPIC_NAME_INVALID = 0x90
RC_PACKET_ID_IN_USE = 0x91
RC_PACKET_ID_NOT_FOUND = 0x92
RC_RECEIVE_MAX_EXCEEDED = 0x93
RC_TOPIC_ALIAS_INVALID = 0x94
RC_PACKET_TOO_LARGE = 0x95
RC_QUOTA_EXCEEDED = 0x97
RC_ADMINISTRATIVE_ACTION = 0x98
RC_PAYLOAD_FORMAT_INVALID = 0x99
RC_RETAIN_NOT_SUPPORTED = 0x9A
RC_QOS_NOT_SUPPORTED = 0x9B
RC_SHARED_SUB_NOT_SUPPORTED = 0x9E
RC_CONNECTION_RATE_EXCEEDED = 0x9F
RC_SUB_ID_NOT_SUPPORTED = 0xA1
RC_WILDCARD_SUB_NOT_SUPPORTED = 0xA2

# 3.1.1 CONNACK return codes
CONNACK_V3_UNACCEPTABLE_VERSION = 0x01
CONNACK_V3_IDENTIFIER_REJECTED = 0x02
CONNACK_V3_SERVER_UNAVAILABLE = 0x03
CONNACK_V3_BAD_CREDENTIALS = 0x04
CONNACK_V3_NOT_AUTHORIZED = 0x05

# v5 -> 3.1.1 CONNACK code, for refusing a 3.1.1 client with the nearest code
V5_TO_V3_CONNACK = {
    RC_SUCCESS: 0,
    RC_UNSUPPORTED_PROTOCOL_VERSION: CONNACK_V3_UNACCEPTABLE_VERSION,
    RC_CLIENT_ID_NOT_VALID: CONNACK_V3_IDENTIFIER_REJECTED,
    RC_BAD_USERNAME_OR_PASSWORD: CONNACK_V3_BAD_CREDENTIALS,
    RC_NOT_AUTHORIZED: CONNACK_V3_NOT_AUTHORIZED,
    RC_BAD_AUTH_METHOD: CONNACK_V3_NOT_AUTHORIZED,
    RC_SERVER_UNAVAILABLE: CONNACK_V3_SERVER_UNAVAILABLE,
    RC_SERVER_BUSY: CONNACK_V3_SERVER_UNAVAILABLE,
}

MAX_REMAINING_LENGTH = 268_435_455
MAX_VARINT = 268_435_455


class MQTTProtocolError(Exception):
    """The peer broke the protocol. ``reason_code`` is the v5 code to answer with.

    ``connack_v3`` is set for CONNECT problems that 3.1.1 answers with a CONNACK
    return code (for instance an unsupported protocol level). ``packets`` holds
    what :meth:`Decoder.feed` decoded before the bad packet, so the server can act
    on them before closing.
    """

    def __init__(self, reason_code: int, message: str, connack_v3: int | None = None) -> None:
        super().__init__(message)
        self.reason_code = reason_code
        self.message = message
        self.connack_v3 = connack_v3
        self.packets: list[Any] = []


def _malformed(msg: str) -> MQTTProtocolError:
    return MQTTProtocolError(RC_MALFORMED_PACKET, msg)


def _proto(msg: str) -> MQTTProtocolError:
    return MQTTProtocolError(RC_PROTOCOL_ERROR, msg)


# ------------------------------------------------------------------ packets


class Packet:
    __slots__ = ()
    type: int = 0

    def __repr__(self) -> str:
        fields = ", ".join(f"{s}={getattr(self, s)!r}" for s in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(getattr(self, s) == getattr(other, s) for s in self.__slots__)


class Will:
    __slots__ = ("topic", "payload", "qos", "retain", "properties")

    def __init__(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                 properties: dict[str, Any] | None = None) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties or {}

    __repr__ = Packet.__repr__
    __eq__ = Packet.__eq__  # type: ignore[assignment]


class Connect(Packet):
    __slots__ = ("protocol_name", "protocol_level", "clean_start", "keepalive", "client_id", "will",
                 "username", "password", "properties")
    type = CONNECT

    def __init__(self, client_id: str = "", *, protocol_level: int = MQTT_311, clean_start: bool = True,
                 keepalive: int = 60, will: Will | None = None, username: str | None = None,
                 password: bytes | None = None, properties: dict[str, Any] | None = None,
                 protocol_name: str | None = None) -> None:
        self.protocol_name = protocol_name or ("MQIsdp" if protocol_level == MQTT_31 else "MQTT")
        self.protocol_level = protocol_level
        self.clean_start = clean_start
        self.keepalive = keepalive
        self.client_id = client_id
        self.will = will
        self.username = username
        self.password = password
        self.properties = properties or {}


class Connack(Packet):
    __slots__ = ("session_present", "reason_code", "properties")
    type = CONNACK

    def __init__(self, session_present: bool = False, reason_code: int = 0,
                 properties: dict[str, Any] | None = None) -> None:
        self.session_present = session_present
        self.reason_code = reason_code
        self.properties = properties or {}


class Publish(Packet):
    __slots__ = ("topic", "payload", "qos", "retain", "dup", "packet_id", "properties")
    type = PUBLISH

    def __init__(self, topic: str, payload: bytes = b"", qos: int = 0, retain: bool = False, dup: bool = False,
                 packet_id: int = 0, properties: dict[str, Any] | None = None) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties = properties  # None when absent (the common case: no dict allocated)


class _Ack(Packet):
    __slots__ = ("packet_id", "reason_code", "properties")

    def __init__(self, packet_id: int, reason_code: int = 0, properties: dict[str, Any] | None = None) -> None:
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = properties or {}


class PubAck(_Ack):
    __slots__ = ()
    type = PUBACK


class PubRec(_Ack):
    __slots__ = ()
    type = PUBREC


class PubRel(_Ack):
    __slots__ = ()
    type = PUBREL


class PubComp(_Ack):
    __slots__ = ()
    type = PUBCOMP


class SubOptions:
    __slots__ = ("qos", "no_local", "retain_as_published", "retain_handling")

    def __init__(self, qos: int = 0, no_local: bool = False, retain_as_published: bool = False,
                 retain_handling: int = 0) -> None:
        self.qos = qos
        self.no_local = no_local
        self.retain_as_published = retain_as_published
        self.retain_handling = retain_handling

    __repr__ = Packet.__repr__
    __eq__ = Packet.__eq__  # type: ignore[assignment]

    def to_byte(self) -> int:
        return self.qos | (self.no_local << 2) | (self.retain_as_published << 3) | (self.retain_handling << 4)


class Subscribe(Packet):
    __slots__ = ("packet_id", "subscriptions", "properties")
    type = SUBSCRIBE

    def __init__(self, packet_id: int, subscriptions: list[tuple[str, SubOptions]],
                 properties: dict[str, Any] | None = None) -> None:
        self.packet_id = packet_id
        self.subscriptions = subscriptions
        self.properties = properties or {}


class Suback(Packet):
    __slots__ = ("packet_id", "reason_codes", "properties")
    type = SUBACK

    def __init__(self, packet_id: int, reason_codes: list[int], properties: dict[str, Any] | None = None) -> None:
        self.packet_id = packet_id
        self.reason_codes = reason_codes
        self.properties = properties or {}


class Unsubscribe(Packet):
    __slots__ = ("packet_id", "filters", "properties")
    type = UNSUBSCRIBE

    def __init__(self, packet_id: int, filters: list[str], properties: dict[str, Any] | None = None) -> None:
        self.packet_id = packet_id
        self.filters = filters
        self.properties = properties or {}


class Unsuback(Packet):
    __slots__ = ("packet_id", "reason_codes", "properties")
    type = UNSUBACK

    def __init__(self, packet_id: int, reason_codes: list[int] | None = None,
                 properties: dict[str, Any] | None = None) -> None:
        self.packet_id = packet_id
        self.reason_codes = reason_codes or []
        self.properties = properties or {}


class PingReq(Packet):
    __slots__ = ()
    type = PINGREQ


class PingResp(Packet):
    __slots__ = ()
    type = PINGRESP


class Disconnect(Packet):
    __slots__ = ("reason_code", "properties")
    type = DISCONNECT

    def __init__(self, reason_code: int = 0, properties: dict[str, Any] | None = None) -> None:
        self.reason_code = reason_code
        self.properties = properties or {}


class Auth(Packet):
    __slots__ = ("reason_code", "properties")
    type = AUTH

    def __init__(self, reason_code: int = 0, properties: dict[str, Any] | None = None) -> None:
        self.reason_code = reason_code
        self.properties = properties or {}


_PINGREQ = PingReq()
_PINGRESP = PingResp()

_ACKS = {PUBACK: PubAck, PUBREC: PubRec, PUBREL: PubRel, PUBCOMP: PubComp}
