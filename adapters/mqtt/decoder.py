"""The MQTT decoder, sans-io: bytes in, packets out (see ``codec.py`` for why hand-written)."""

from __future__ import annotations

import struct
from typing import Any

from .packets import (
    AUTH,
    Auth,
    CONNACK,
    CONNACK_V3_UNACCEPTABLE_VERSION,
    CONNECT,
    Connack,
    Connect,
    DISCONNECT,
    Disconnect,
    MAX_REMAINING_LENGTH,
    MQTTProtocolError,
    MQTT_31,
    MQTT_311,
    MQTT_5,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    Packet,
    Publish,
    RC_MALFORMED_PACKET,
    RC_PACKET_TOO_LARGE,
    RC_PROTOCOL_ERROR,
    RC_TOPIC_NAME_INVALID,
    RC_UNSUPPORTED_PROTOCOL_VERSION,
    SUBACK,
    SUBSCRIBE,
    SubOptions,
    Suback,
    Subscribe,
    UNSUBACK,
    UNSUBSCRIBE,
    Unsuback,
    Unsubscribe,
    Will,
    _ACKS,
    _PINGREQ,
    _PINGRESP,
    _malformed,
    _proto,
)
from .properties import (
    _W,
    _read_bin,
    _read_properties,
    _read_str,
    _unpack_h,
)

# ------------------------------------------------------------------ decoder

_CLIENT_TO_SERVER = frozenset({CONNECT, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE,
                               PINGREQ, DISCONNECT, AUTH})
_SERVER_TO_CLIENT = frozenset({CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, PINGRESP,
                               DISCONNECT, AUTH})


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
        # read once per call, not per packet (a CONNECT decoded in this call leaves the
        # PUBLISHes after it to _packet: slower, the same packets)
        inline = self._connected and self.version != MQTT_5
        max_size = self.max_packet_size
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
                if end - pos > max_size:
                    raise MQTTProtocolError(RC_PACKET_TOO_LARGE, f"packet of {end - pos} bytes exceeds the maximum "
                                            f"packet size {self.max_packet_size}")
                if end > n:
                    break
                if (b0 == 0x30 or b0 == 0x32) and inline and end - i > 2:
                    # a 3.1.1 QoS 0/1 PUBLISH without flags (the publish hot path), read inline; anything
                    # unusual in it (bad topic, packet id 0, truncation) is left to _packet to refuse
                    p = i + 2 + ((buf[i] << 8) | buf[i + 1])
                    if b0 == 0x30:
                        q, pid = p, 0
                    else:
                        q = p + 2
                        pid = (buf[p] << 8) | buf[p + 1] if q <= end else 0
                    if pid or b0 == 0x30:
                        try:
                            topic = buf[i + 2 : p].decode("utf-8") if i + 2 < p <= end else ""
                        except UnicodeDecodeError:
                            topic = ""
                        if topic and "\x00" not in topic and "+" not in topic and "#" not in topic and q <= end:
                            out.append(Publish(topic, buf[q:end], (b0 >> 1) & 3, False, False, pid, None))
                            pos = end
                            continue
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


