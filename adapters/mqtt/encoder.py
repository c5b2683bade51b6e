"""The MQTT encoder, sans-io: packets in, bytes out; ``encode_publish`` is the delivery path's fast one."""

from __future__ import annotations

from typing import Iterable

from .packets import (
    AUTH,
    Auth,
    CONNACK,
    CONNECT,
    Connack,
    Connect,
    DISCONNECT,
    Disconnect,
    MQTT_311,
    MQTT_5,
    PINGREQ,
    PINGRESP,
    PUBLISH,
    PUBREL,
    Packet,
    Publish,
    SUBACK,
    SUBSCRIBE,
    Suback,
    Subscribe,
    UNSUBACK,
    UNSUBSCRIBE,
    Unsuback,
    Unsubscribe,
    _ACKS,
    _Ack,
)
from .properties import (
    _bin,
    _pack_h,
    _str,
    _varint,
    encode_properties,
)

# ------------------------------------------------------------------ encoder

# A successful 3.1/3.1.1 CONNACK, indexed by session present: built once, not per CONNECT.
CONNACK_V3_OK = (b"\x20\x02\x00\x00", b"\x20\x02\x01\x00")


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


def encode_publish0(topic: bytes, payload: bytes) -> bytes:
    """A 3.1.1 QoS 0 PUBLISH (no retain, no DUP, no properties): what most deliveries are, built
    in one concatenation (the QoS 0 fan-in and fan-out hot path); the same bytes as
    ``encode_publish(topic, payload)``."""
    tl = len(topic)
    n = tl + 2 + len(payload)
    if n < 128:
        return bytes((0x30, n, tl >> 8, tl & 0xFF)) + topic + payload
    return b"\x30" + _varint(n) + bytes((tl >> 8, tl & 0xFF)) + topic + payload


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

