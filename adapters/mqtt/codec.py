"""A sans-io MQTT 3.1, 3.1.1 and 5.0 codec: bytes in, packets out; packets in, bytes out.

Why hand-written: unimq needs the *server* side of MQTT 5 (decoding CONNECT
with its will and properties, SUBSCRIBE options, AUTH, every v5 reason code)
with strict validation, in the sans-io style the architecture asks for
(h11/wsproto: no sockets, no event loop, fuzzable). Checked on PyPI before
writing this: ``mqtt-codec`` (last release 2019) covers only 3.1.1;
``mqttproto`` (sans-io, v5) is client-side only and not even published on the
package index this project installs from; ``gmqtt``, ``aiomqtt`` and
``paho-mqtt`` are clients bound to their own I/O; ``amqtt`` is a whole broker
whose codec lives inside its asyncio streams and stops at 3.1.1. None is a
well-kept sans-io codec covering v5 on the server side, so this module is one,
kept small: the hot path (PUBLISH and its acknowledgements) is decoded inline
without per-field function calls.

Use: :class:`Decoder` (``feed(data) -> list[packet]``) and :func:`encode`
(``encode(packet, version) -> bytes``). The decoder learns the protocol
version from CONNECT (server side) or is told it (client side). Every
violation raises :class:`MQTTProtocolError` carrying the v5 reason code (and,
for CONNECT, the 3.1.1 CONNACK return code), so the server can answer with the
right code before closing; nothing else ever escapes ``feed``.
"""

from __future__ import annotations

import struct
from typing import Any, Iterable

__all__ = [
    "MQTTProtocolError",
    "Decoder",
    "encode",
    "encode_publish",
    "Connect",
    "Will",
    "Connack",
    "Publish",
    "PubAck",
    "PubRec",
    "PubRel",
    "PubComp",
    "Subscribe",
    "SubOptions",
    "Suback",
    "Unsubscribe",
    "Unsuback",
    "PingReq",
    "PingResp",
    "Disconnect",
    "Auth",
    "Packet",
]

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
RC_PAYLOAD_FORMAT_INVALID = 0x99
RC_RETAIN_NOT_SUPPORTED = 0x9A
RC_QOS_NOT_SUPPORTED = 0x9B
RC_SHARED_SUB_NOT_SUPPORTED = 0x9E
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


# ------------------------------------------------------------------ properties

# property id -> (name, type); types: b byte, h two-byte int, i four-byte int,
# v variable byte int, s UTF-8 string, d binary data, p UTF-8 string pair
_BYTE, _TWO, _FOUR, _VAR, _STR, _BIN, _PAIR = "b", "h", "i", "v", "s", "d", "p"
PROPERTIES: dict[int, tuple[str, str]] = {
    0x01: ("payload_format_indicator", _BYTE),
    0x02: ("message_expiry_interval", _FOUR),
    0x03: ("content_type", _STR),
    0x08: ("response_topic", _STR),
    0x09: ("correlation_data", _BIN),
    0x0B: ("subscription_identifier", _VAR),
    0x11: ("session_expiry_interval", _FOUR),
    0x12: ("assigned_client_identifier", _STR),
    0x13: ("server_keep_alive", _TWO),
    0x15: ("authentication_method", _STR),
    0x16: ("authentication_data", _BIN),
    0x17: ("request_problem_information", _BYTE),
    0x18: ("will_delay_interval", _FOUR),
    0x19: ("request_response_information", _BYTE),
    0x1A: ("response_information", _STR),
    0x1C: ("server_reference", _STR),
    0x1F: ("reason_string", _STR),
    0x21: ("receive_maximum", _TWO),
    0x22: ("topic_alias_maximum", _TWO),
    0x23: ("topic_alias", _TWO),
    0x24: ("maximum_qos", _BYTE),
    0x25: ("retain_available", _BYTE),
    0x26: ("user_property", _PAIR),
    0x27: ("maximum_packet_size", _FOUR),
    0x28: ("wildcard_subscription_available", _BYTE),
    0x29: ("subscription_identifier_available", _BYTE),
    0x2A: ("shared_subscription_available", _BYTE),
}
PROPERTY_IDS: dict[str, int] = {name: pid for pid, (name, _) in PROPERTIES.items()}

_W = "will"  # pseudo packet kind for will properties
# which properties each packet may carry (MQTT 5.0 section 2.2.2.2)
_ALLOWED: dict[Any, frozenset[int]] = {
    PUBLISH: frozenset({0x01, 0x02, 0x03, 0x08, 0x09, 0x0B, 0x23, 0x26}),
    _W: frozenset({0x01, 0x02, 0x03, 0x08, 0x09, 0x18, 0x26}),
    CONNECT: frozenset({0x11, 0x15, 0x16, 0x17, 0x19, 0x21, 0x22, 0x26, 0x27}),
    CONNACK: frozenset({0x11, 0x12, 0x13, 0x15, 0x16, 0x1A, 0x1C, 0x1F, 0x21, 0x22, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2A}),
    PUBACK: frozenset({0x1F, 0x26}),
    PUBREC: frozenset({0x1F, 0x26}),
    PUBREL: frozenset({0x1F, 0x26}),
    PUBCOMP: frozenset({0x1F, 0x26}),
    SUBSCRIBE: frozenset({0x0B, 0x26}),
    SUBACK: frozenset({0x1F, 0x26}),
    UNSUBSCRIBE: frozenset({0x26}),
    UNSUBACK: frozenset({0x1F, 0x26}),
    DISCONNECT: frozenset({0x11, 0x1C, 0x1F, 0x26}),
    AUTH: frozenset({0x15, 0x16, 0x1F, 0x26}),
}
_REPEATABLE = frozenset({0x26, 0x0B})

_unpack_h = struct.Struct(">H").unpack_from
_unpack_i = struct.Struct(">I").unpack_from
_pack_h = struct.Struct(">H").pack
_pack_i = struct.Struct(">I").pack


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    for _ in range(4):
        if pos >= end:
            raise _malformed("truncated variable byte integer")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise _malformed("variable byte integer longer than 4 bytes")


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_str(buf: bytes, pos: int, end: int, what: str = "string") -> tuple[str, int]:
    if pos + 2 > end:
        raise _malformed(f"truncated {what}")
    (n,) = _unpack_h(buf, pos)
    pos += 2
    if pos + n > end:
        raise _malformed(f"truncated {what}")
    raw = buf[pos : pos + n]
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed(f"{what} is not valid UTF-8") from None
    if "\x00" in s:
        raise _malformed(f"{what} contains U+0000")
    return s, pos + n


def _read_bin(buf: bytes, pos: int, end: int, what: str = "binary data") -> tuple[bytes, int]:
    if pos + 2 > end:
        raise _malformed(f"truncated {what}")
    (n,) = _unpack_h(buf, pos)
    pos += 2
    if pos + n > end:
        raise _malformed(f"truncated {what}")
    return bytes(buf[pos : pos + n]), pos + n


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > 65535:
        raise ValueError("string longer than 65535 bytes")
    return _pack_h(len(b)) + b


def _bin(b: bytes) -> bytes:
    if len(b) > 65535:
        raise ValueError("binary data longer than 65535 bytes")
    return _pack_h(len(b)) + bytes(b)


def _read_properties(buf: bytes, pos: int, end: int, kind: Any) -> tuple[dict[str, Any], int]:
    length, pos = _read_varint(buf, pos, end)
    pend = pos + length
    if pend > end:
        raise _malformed("property length exceeds the packet")
    props: dict[str, Any] = {}
    if not length:
        return props, pos
    allowed = _ALLOWED[kind]
    seen: set[int] = set()
    while pos < pend:
        pid, pos = _read_varint(buf, pos, pend)
        spec = PROPERTIES.get(pid)
        if spec is None or pid not in allowed:
            raise _malformed(f"property 0x{pid:02X} is not allowed here")
        if pid in seen and pid not in _REPEATABLE:
            raise _proto(f"property {spec[0]} appears twice")
        seen.add(pid)
        name, t = spec
        if t == _BYTE:
            if pos >= pend:
                raise _malformed("truncated property")
            val: Any = buf[pos]
            pos += 1
            if val > 1 and pid != 0x24:
                raise _proto(f"property {name} must be 0 or 1")
        elif t == _TWO:
            if pos + 2 > pend:
                raise _malformed("truncated property")
            (val,) = _unpack_h(buf, pos)
            pos += 2
        elif t == _FOUR:
            if pos + 4 > pend:
                raise _malformed("truncated property")
            (val,) = _unpack_i(buf, pos)
            pos += 4
        elif t == _VAR:
            val, pos = _read_varint(buf, pos, pend)
        elif t == _STR:
            val, pos = _read_str(buf, pos, pend, name)
        elif t == _BIN:
            val, pos = _read_bin(buf, pos, pend, name)
        else:  # pair
            k, pos = _read_str(buf, pos, pend, "user property name")
            v, pos = _read_str(buf, pos, pend, "user property value")
            val = (k, v)
        if pid in _REPEATABLE:
            props.setdefault(name, []).append(val)
        else:
            props[name] = val
    if pos != pend:
        raise _malformed("properties overrun their length")
    # values that are protocol errors whatever the packet
    if props.get("receive_maximum") == 0:
        raise _proto("receive maximum must not be 0")
    if props.get("maximum_packet_size") == 0:
        raise _proto("maximum packet size must not be 0")
    if props.get("topic_alias") == 0:
        raise MQTTProtocolError(RC_TOPIC_ALIAS_INVALID, "topic alias 0 is invalid")
    for sid in props.get("subscription_identifier", ()):
        if sid == 0:
            raise _proto("subscription identifier must not be 0")
    return props, pos


def encode_properties(props: dict[str, Any] | None) -> bytes:
    """Encode a v5 property dict (``user_property``: list of pairs; ``subscription_identifier``: list)."""
    if not props:
        return b"\x00"
    out = bytearray()
    for name, val in props.items():
        if val is None:
            continue
        pid = PROPERTY_IDS[name]
        t = PROPERTIES[pid][1]
        vals = val if pid in _REPEATABLE else (val,)
        for v in vals:
            out += _varint(pid)
            if t == _BYTE:
                out.append(v)
            elif t == _TWO:
                out += _pack_h(v)
            elif t == _FOUR:
                out += _pack_i(v)
            elif t == _VAR:
                out += _varint(v)
            elif t == _STR:
                out += _str(v)
            elif t == _BIN:
                out += _bin(v)
            else:
                out += _str(v[0]) + _str(v[1])
    return _varint(len(out)) + bytes(out)


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

# ------------------------------------------------------------------ decoder

_CLIENT_TO_SERVER = frozenset({CONNECT, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE,
                               PINGREQ, DISCONNECT, AUTH})
_SERVER_TO_CLIENT = frozenset({CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, PINGRESP,
                               DISCONNECT, AUTH})
_ACKS = {PUBACK: PubAck, PUBREC: PubRec, PUBREL: PubRel, PUBCOMP: PubComp}


def _check_topic_name(topic: str) -> None:
    if "+" in topic or "#" in topic:
        raise MQTTProtocolError(RC_TOPIC_NAME_INVALID, "a topic name must not contain wildcards")


class Decoder:
    """Incremental decoder for one connection.

    ``server_side=True`` (the default) accepts only packets a client sends and
    requires CONNECT first; ``server_side=False`` decodes what a server sends
    (test helpers and the bench use it) and needs ``version``.
    ``max_packet_size`` bounds a whole packet (fixed header included); a bigger
    one raises ``RC_PACKET_TOO_LARGE`` as soon as its header is seen.
    """

    __slots__ = ("server_side", "version", "max_packet_size", "_buf", "_connected")

    def __init__(self, server_side: bool = True, version: int | None = None,
                 max_packet_size: int = MAX_REMAINING_LENGTH + 5) -> None:
        self.server_side = server_side
        self.version = version
        self.max_packet_size = max_packet_size
        self._buf = b""
        self._connected = not server_side

    def feed(self, data: bytes) -> list[Packet]:
        """Add ``data``; return every complete packet. Raises only MQTTProtocolError."""
        buf = self._buf + data if self._buf else bytes(data)
        n = len(buf)
        pos = 0
        out: list[Packet] = []
        try:
            while n - pos >= 2:
                b0 = buf[pos]
                # remaining length (inline: the hot path)
                i = pos + 1
                b = buf[i]
                i += 1
                rl = b & 0x7F
                if b & 0x80:
                    shift = 7
                    while True:
                        if i >= n:
                            rl = -1
                            break
                        b = buf[i]
                        i += 1
                        rl |= (b & 0x7F) << shift
                        if not b & 0x80:
                            break
                        shift += 7
                        if shift > 21:
                            raise _malformed("remaining length longer than 4 bytes")
                    if rl < 0:
                        break  # header incomplete
                end = i + rl
                if end - pos > self.max_packet_size:
                    raise MQTTProtocolError(RC_PACKET_TOO_LARGE, f"packet of {end - pos} bytes exceeds the maximum "
                                            f"packet size {self.max_packet_size}")
                if end > n:
                    break
                out.append(self._packet(b0, buf, i, end))
                pos = end
        except MQTTProtocolError as e:
            e.packets = out
            self._buf = b""
            raise
        except (IndexError, ValueError, struct.error) as e:  # defensive: never leak anything else
            err = _malformed(f"malformed packet: {e}")
            err.packets = out
            self._buf = b""
            raise err from None
        self._buf = buf[pos:] if pos < n else b""
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)

    # -- one packet

    def _packet(self, b0: int, buf: bytes, pos: int, end: int) -> Packet:
        ptype = b0 >> 4
        flags = b0 & 0x0F
        v5 = self.version == MQTT_5
        if ptype == PUBLISH:
            if not self._connected:
                raise _proto("PUBLISH before CONNECT")
            qos = (flags >> 1) & 3
            if qos == 3:
                raise _malformed("PUBLISH with QoS 3")
            dup = bool(flags & 8)
            if dup and not qos:
                raise _malformed("PUBLISH with DUP set at QoS 0")
            if pos + 2 > end:
                raise _malformed("truncated topic name")
            tl = (buf[pos] << 8) | buf[pos + 1]
            p = pos + 2 + tl
            if p > end:
                raise _malformed("truncated topic name")
            try:
                topic = buf[pos + 2 : p].decode("utf-8")
            except UnicodeDecodeError:
                raise _malformed("topic name is not valid UTF-8") from None
            if "\x00" in topic or "+" in topic or "#" in topic:
                if "\x00" in topic:
                    raise _malformed("topic name contains U+0000")
                _check_topic_name(topic)
            pid = 0
            if qos:
                if p + 2 > end:
                    raise _malformed("truncated packet identifier")
                pid = (buf[p] << 8) | buf[p + 1]
                p += 2
                if not pid:
                    raise _malformed("packet identifier 0")
            props = None
            if v5:
                if p >= end:
                    raise _malformed("missing properties")
                if buf[p] == 0:
                    p += 1
                else:
                    props, p = _read_properties(buf, p, end, PUBLISH)
                    if "subscription_identifier" in props and self.server_side:
                        raise _proto("a client must not send subscription identifiers in PUBLISH")
            if not topic and not (props and "topic_alias" in props):
                raise MQTTProtocolError(RC_TOPIC_NAME_INVALID if v5 else RC_MALFORMED_PACKET, "empty topic name")
            return Publish(topic, buf[p:end], qos, bool(flags & 1), dup, pid, props)

        if ptype in _ACKS:
            if not self._connected:
                raise _proto("packet before CONNECT")
            want = 2 if ptype == PUBREL else 0
            if flags != want:
                raise _malformed("reserved flags of an acknowledgement are wrong")
            if end - pos < 2:
                raise _malformed("truncated acknowledgement")
            pid = (buf[pos] << 8) | buf[pos + 1]
            if not pid:
                raise _malformed("packet identifier 0")
            rc = 0
            props: dict[str, Any] = {}  # type: ignore[no-redef]
            if end - pos > 2:
                if not v5:
                    raise _malformed("acknowledgement longer than 2 bytes")
                rc = buf[pos + 2]
                if end - pos > 3:
                    props, p = _read_properties(buf, pos + 3, end, ptype)
                    if p != end:
                        raise _malformed("trailing bytes after properties")
            return _ACKS[ptype](pid, rc, props)

        if self.server_side and ptype not in _CLIENT_TO_SERVER:
            raise _proto(f"a client must not send packet type {ptype}")
        if not self.server_side and ptype not in _SERVER_TO_CLIENT:
            raise _proto(f"a server must not send packet type {ptype}")

        if ptype == CONNECT:
            if self._connected:
                raise _proto("a second CONNECT")
            if flags:
                raise _malformed("reserved flags of CONNECT are not 0")
            pkt = self._connect(buf, pos, end)
            self._connected = True
            return pkt
        if not self._connected:
            raise _proto("packet before CONNECT")
        if ptype == PINGREQ or ptype == PINGRESP:
            if flags or end != pos:
                raise _malformed("PINGREQ/PINGRESP with flags or a body")
            return _PINGREQ if ptype == PINGREQ else _PINGRESP
        if ptype == SUBSCRIBE:
            if flags != 2:
                raise _malformed("reserved flags of SUBSCRIBE are not 0010")
            return self._subscribe(buf, pos, end, v5)
        if ptype == UNSUBSCRIBE:
            if flags != 2:
                raise _malformed("reserved flags of UNSUBSCRIBE are not 0010")
            if end - pos < 2:
                raise _malformed("truncated UNSUBSCRIBE")
            pid = _unpack_h(buf, pos)[0]
            if not pid:
                raise _malformed("packet identifier 0")
            p = pos + 2
            props = {}
            if v5:
                props, p = _read_properties(buf, p, end, UNSUBSCRIBE)
            filters: list[str] = []
            while p < end:
                f, p = _read_str(buf, p, end, "topic filter")
                filters.append(f)
            if not filters:
                raise MQTTProtocolError(RC_PROTOCOL_ERROR, "UNSUBSCRIBE without topic filters")
            return Unsubscribe(pid, filters, props)
        if ptype == DISCONNECT:
            if flags:
                raise _malformed("reserved flags of DISCONNECT are not 0")
            rc = 0
            props = {}
            if end > pos:
                if not v5:
                    raise _malformed("DISCONNECT with a body")
                rc = buf[pos]
                if end - pos > 1:
                    props, p = _read_properties(buf, pos + 1, end, DISCONNECT)
                    if p != end:
                        raise _malformed("trailing bytes after properties")
            return Disconnect(rc, props)
        if ptype == AUTH:
            if not v5:
                raise _malformed("AUTH exists only in MQTT 5")
            if flags:
                raise _malformed("reserved flags of AUTH are not 0")
            rc = 0
            props = {}
            if end > pos:
                rc = buf[pos]
                if end - pos > 1:
                    props, p = _read_properties(buf, pos + 1, end, AUTH)
                    if p != end:
                        raise _malformed("trailing bytes after properties")
            return Auth(rc, props)
        # client side only from here
        if flags:
            raise _malformed("reserved flags are not 0")
        if ptype == CONNACK:
            if end - pos < 2:
                raise _malformed("truncated CONNACK")
            sp = buf[pos]
            if sp > 1:
                raise _malformed("CONNACK acknowledge flags reserved bits set")
            props = {}
            if v5:
                props, p = _read_properties(buf, pos + 2, end, CONNACK)
            return Connack(bool(sp), buf[pos + 1], props)
        if ptype == SUBACK or ptype == UNSUBACK:
            if end - pos < 2:
                raise _malformed("truncated acknowledgement")
            pid = _unpack_h(buf, pos)[0]
            p = pos + 2
            props = {}
            if v5:
                props, p = _read_properties(buf, p, end, ptype)
            codes = list(buf[p:end])
            return Suback(pid, codes, props) if ptype == SUBACK else Unsuback(pid, codes, props)
        raise _malformed(f"unknown packet type {ptype}")  # pragma: no cover

    def _connect(self, buf: bytes, pos: int, end: int) -> Connect:
        name, p = _read_str(buf, pos, end, "protocol name")
        if p >= end:
            raise _malformed("truncated CONNECT")
        level = buf[p]
        p += 1
        if name == "MQTT" and level in (MQTT_311, MQTT_5):
            pass
        elif name == "MQIsdp" and level == MQTT_31:
            pass
        elif name in ("MQTT", "MQIsdp"):
            raise MQTTProtocolError(RC_UNSUPPORTED_PROTOCOL_VERSION, f"unsupported protocol level {level}",
                                    connack_v3=CONNACK_V3_UNACCEPTABLE_VERSION)
        else:
            raise MQTTProtocolError(RC_MALFORMED_PACKET if level != MQTT_5 else RC_UNSUPPORTED_PROTOCOL_VERSION,
                                    f"unknown protocol name {name!r}")
        self.version = level
        v5 = level == MQTT_5
        if p + 3 > end:
            raise _malformed("truncated CONNECT")
        cflags = buf[p]
        (keepalive,) = _unpack_h(buf, p + 1)
        p += 3
        if cflags & 1:
            raise _malformed("reserved CONNECT flag is set")
        clean = bool(cflags & 2)
        will_flag = bool(cflags & 4)
        will_qos = (cflags >> 3) & 3
        will_retain = bool(cflags & 0x20)
        pw_flag = bool(cflags & 0x40)
        user_flag = bool(cflags & 0x80)
        if will_qos == 3:
            raise _malformed("will QoS 3")
        if not will_flag and (will_qos or will_retain):
            raise _malformed("will QoS/retain set without a will")
        if pw_flag and not user_flag and not v5:
            raise _malformed("password without user name")
        props: dict[str, Any] = {}
        if v5:
            props, p = _read_properties(buf, p, end, CONNECT)
        client_id, p = _read_str(buf, p, end, "client identifier")
        will = None
        if will_flag:
            wprops: dict[str, Any] = {}
            if v5:
                wprops, p = _read_properties(buf, p, end, _W)
            wtopic, p = _read_str(buf, p, end, "will topic")
            if not wtopic:
                raise MQTTProtocolError(RC_TOPIC_NAME_INVALID if v5 else RC_MALFORMED_PACKET, "empty will topic")
            _check_topic_name(wtopic)
            wpayload, p = _read_bin(buf, p, end, "will payload")
            will = Will(wtopic, wpayload, will_qos, will_retain, wprops)
        username = password = None
        if user_flag:
            username, p = _read_str(buf, p, end, "user name")
        if pw_flag:
            password, p = _read_bin(buf, p, end, "password")
        if p != end:
            raise _malformed("trailing bytes after CONNECT payload")
        return Connect(client_id, protocol_level=level, clean_start=clean, keepalive=keepalive, will=will,
                       username=username, password=password, properties=props, protocol_name=name)

    def _subscribe(self, buf: bytes, pos: int, end: int, v5: bool) -> Subscribe:
        if end - pos < 2:
            raise _malformed("truncated SUBSCRIBE")
        pid = _unpack_h(buf, pos)[0]
        if not pid:
            raise _malformed("packet identifier 0")
        p = pos + 2
        props: dict[str, Any] = {}
        if v5:
            props, p = _read_properties(buf, p, end, SUBSCRIBE)
            if len(props.get("subscription_identifier", ())) > 1:
                raise _proto("more than one subscription identifier")
        subs: list[tuple[str, SubOptions]] = []
        while p < end:
            f, p = _read_str(buf, p, end, "topic filter")
            if p >= end:
                raise _malformed("missing subscription options")
            o = buf[p]
            p += 1
            if v5:
                if o & 0xC0:
                    raise _malformed("reserved bits of subscription options are set")
                rh = (o >> 4) & 3
                if rh == 3:
                    raise _proto("retain handling 3")
            elif o & 0xFC:
                raise _malformed("reserved bits of the requested QoS are set")
            qos = o & 3
            if qos == 3:
                raise _malformed("requested QoS 3")
            if v5:
                subs.append((f, SubOptions(qos, bool(o & 4), bool(o & 8), (o >> 4) & 3)))
            else:
                subs.append((f, SubOptions(qos)))
        if not subs:
            raise _proto("SUBSCRIBE without topic filters")
        return Subscribe(pid, subs, props)


# ------------------------------------------------------------------ encoder


def _frame(b0: int, body: bytes) -> bytes:
    n = len(body)
    if n < 128:
        return bytes((b0, n)) + body
    return bytes((b0,)) + _varint(n) + body


def encode_publish(topic: bytes, payload: bytes, qos: int = 0, retain: bool = False, dup: bool = False,
                   packet_id: int = 0, props: bytes | None = None) -> bytes:
    """Fast PUBLISH encoder for the delivery path: ``topic`` pre-encoded UTF-8, ``props``
    pre-encoded v5 properties (``b"\\x00"`` for none) or None for 3.1.1."""
    b0 = 0x30 | (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
    parts = [_pack_h(len(topic)), topic]
    if qos:
        parts.append(_pack_h(packet_id))
    if props is not None:
        parts.append(props)
    parts.append(payload)
    body = b"".join(parts)
    n = len(body)
    if n < 128:
        return bytes((b0, n)) + body
    return bytes((b0,)) + _varint(n) + body


def encode(pkt: Packet, version: int = MQTT_311) -> bytes:
    """Encode one packet for protocol ``version`` (v5 fields are dropped for 3.1/3.1.1)."""
    v5 = version == MQTT_5
    t = pkt.type
    if t == PUBLISH:
        assert isinstance(pkt, Publish)
        return encode_publish(pkt.topic.encode(), bytes(pkt.payload), pkt.qos, pkt.retain, pkt.dup, pkt.packet_id,
                              encode_properties(pkt.properties) if v5 else None)
    if t in _ACKS:
        assert isinstance(pkt, _Ack)
        b0 = (t << 4) | (2 if t == PUBREL else 0)
        if v5 and (pkt.reason_code or pkt.properties):
            body = _pack_h(pkt.packet_id) + bytes((pkt.reason_code,))
            if pkt.properties:
                body += encode_properties(pkt.properties)
            return _frame(b0, body)
        return bytes((b0, 2)) + _pack_h(pkt.packet_id)
    if t == CONNACK:
        assert isinstance(pkt, Connack)
        body = bytes((1 if pkt.session_present else 0, pkt.reason_code))
        if v5:
            body += encode_properties(pkt.properties)
        return _frame(0x20, body)
    if t == PINGREQ:
        return b"\xc0\x00"
    if t == PINGRESP:
        return b"\xd0\x00"
    if t == SUBACK or t == UNSUBACK:
        assert isinstance(pkt, (Suback, Unsuback))
        body = _pack_h(pkt.packet_id)
        if v5:
            body += encode_properties(pkt.properties)
        if t == SUBACK or v5:
            body += bytes(pkt.reason_codes)
        return _frame(t << 4, body)
    if t == DISCONNECT or t == AUTH:
        assert isinstance(pkt, (Disconnect, Auth))
        if not v5:
            return bytes((t << 4, 0))
        if not pkt.reason_code and not pkt.properties:
            return bytes((t << 4, 0))
        body = bytes((pkt.reason_code,))
        if pkt.properties:
            body += encode_properties(pkt.properties)
        return _frame(t << 4, body)
    if t == SUBSCRIBE:
        assert isinstance(pkt, Subscribe)
        body = bytearray(_pack_h(pkt.packet_id))
        if v5:
            body += encode_properties(pkt.properties)
        for f, o in pkt.subscriptions:
            body += _str(f)
            body.append(o.to_byte() if v5 else o.qos)
        return _frame(0x82, bytes(body))
    if t == UNSUBSCRIBE:
        assert isinstance(pkt, Unsubscribe)
        body = bytearray(_pack_h(pkt.packet_id))
        if v5:
            body += encode_properties(pkt.properties)
        for f in pkt.filters:
            body += _str(f)
        return _frame(0xA2, bytes(body))
    if t == CONNECT:
        assert isinstance(pkt, Connect)
        level = pkt.protocol_level
        v5 = level == MQTT_5
        flags = 0
        if pkt.clean_start:
            flags |= 2
        w = pkt.will
        if w is not None:
            flags |= 4 | (w.qos << 3) | (0x20 if w.retain else 0)
        if pkt.password is not None:
            flags |= 0x40
        if pkt.username is not None:
            flags |= 0x80
        body = bytearray(_str(pkt.protocol_name) + bytes((level, flags)) + _pack_h(pkt.keepalive))
        if v5:
            body += encode_properties(pkt.properties)
        body += _str(pkt.client_id)
        if w is not None:
            if v5:
                body += encode_properties(w.properties)
            body += _str(w.topic) + _bin(w.payload)
        if pkt.username is not None:
            body += _str(pkt.username)
        if pkt.password is not None:
            body += _bin(pkt.password)
        return _frame(0x10, bytes(body))
    raise ValueError(f"cannot encode {pkt!r}")


def encode_many(pkts: Iterable[Packet], version: int) -> bytes:
    return b"".join(encode(p, version) for p in pkts)
