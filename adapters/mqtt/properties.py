"""MQTT 5 properties and the wire's primitive types (variable byte integers, strings, binary data).

Both codec halves use them: the decoder reads properties with their per-packet
allowed sets (MQTT 5.0 section 2.2.2.2), the encoder writes them.
"""

from __future__ import annotations

import struct
from typing import Any

from .packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    MQTTProtocolError,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    RC_TOPIC_ALIAS_INVALID,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    _malformed,
    _proto,
)

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


