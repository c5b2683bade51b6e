"""Sans-io AMQP 0-9-1 frame codec: bytes in, events out; methods in, bytes out.

Why this shape: the server, the benchmark's load generator and the fuzz
tests all need the same frame handling, and none of them should care about
sockets. :class:`FrameDecoder` takes whatever bytes arrived and returns
events (protocol header, method, assembled content, heartbeat, or one fatal
:class:`FrameError` carrying the AMQP reply code the connection must be
closed with); the ``encode_*`` functions return bytes. Nothing here touches
the event loop.

Why pamqp, and why a few hand-written paths: pamqp is RabbitMQ's own dialect
of the 0-9-1 spec (the field-table types, the ``message_type`` property name,
the RabbitMQ extensions such as Confirm and Basic.Nack), so every method is
decoded and encoded with it. Its generic, attribute-by-attribute marshalling
costs 20-50 µs per frame, though, and a message crosses five frames on its
way through a broker (publish, header, body, deliver, ack). Those five are
therefore also parsed/built here with ``struct`` directly — exactly the
layouts pamqp produces, which ``tests/test_amqp_codec.py`` checks against
pamqp for arbitrary values with hypothesis. Everything else goes through
pamqp unchanged. On top of that, a publisher repeats the same publish
arguments and property block message after message (and a consumer receives
the same consumer tag, route and properties), so the decoded publish method
and properties are cached by their bytes and a delivery is assembled from
parts prebuilt per (consumer, route, properties): per message only the
delivery tag and the sizes are packed. The caches are bounded in entries and
key size.

Server-sent methods that carry exchange or queue names are marshalled
without pamqp's ``validate()``: it applies a name regex that RabbitMQ itself
does not (RabbitMQ accepts any UTF-8 name up to 255 bytes), and a name a
client was allowed to declare must be sendable back to it.
"""

from __future__ import annotations

import datetime
import struct
from dataclasses import dataclass, field
from typing import Any, Union

from pamqp import commands
from pamqp import decode as pdecode
from pamqp import encode as pencode

__all__ = [
    "ContentReceived",
    "FrameDecoder",
    "FrameError",
    "HeartbeatReceived",
    "MethodReceived",
    "ProtocolHeaderReceived",
    "PROTOCOL_HEADER",
    "decode_properties",
    "encode_content",
    "encode_deliver",
    "encode_get_ok",
    "encode_heartbeat",
    "encode_method",
    "encode_properties",
    "method",
]

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
FRAME_MIN_SIZE = 4096

# AMQP reply codes (spec constants, RabbitMQ's use).
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_TEXT = {
    311: "CONTENT_TOO_LARGE", 312: "NO_ROUTE", 313: "NO_CONSUMERS", 320: "CONNECTION_FORCED",
    402: "INVALID_PATH", 403: "ACCESS_REFUSED", 404: "NOT_FOUND", 405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED", 501: "FRAME_ERROR", 502: "SYNTAX_ERROR", 503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR", 505: "UNEXPECTED_FRAME", 506: "RESOURCE_ERROR", 530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED", 541: "INTERNAL_ERROR",
}

_FRAME_HDR = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_CONTENT_HDR = struct.Struct(">HHQH")  # class id, weight, body size, first flag word
_CLASS_SIZE = struct.Struct(">HHQ")

_BASIC_PUBLISH = 0x003C0028
_BASIC_ACK = 0x003C0050
_BASIC_DELIVER = 0x003C003C
_BASIC_GET_OK = 0x003C0047


# ----------------------------------------------------------------------------- events


@dataclass(slots=True)
class ProtocolHeaderReceived:
    """The client's 8-byte ``AMQP\\x00\\x00\\x09\\x01`` greeting."""


@dataclass(slots=True)
class MethodReceived:
    channel: int
    method: Any  # a pamqp.commands method object


@dataclass(slots=True)
class ContentReceived:
    """A content-carrying method (Basic.Publish) with its header and whole body."""

    channel: int
    method: Any
    properties: dict[str, Any]
    body: bytes
    raw_headers: bytes | None = None  # the headers table exactly as sent (with its length prefix)
    raw_props: bytes | None = None  # property flags + fields exactly as sent (delivered verbatim)


@dataclass(slots=True)
class ContentRefused:
    """A Basic.Publish whose content header announced a body over the limit: the body frames that
    follow are skipped, never stored (the connection closes the channel: PRECONDITION_FAILED)."""

    channel: int
    method: Any
    size: int
    limit: int


@dataclass(slots=True)
class HeartbeatReceived:
    pass


@dataclass(slots=True)
class FrameError:
    """A fatal framing error: close the connection with ``code`` (no further events follow).

    ``bad_header`` is set when the first 8 bytes were not AMQP 0-9-1's protocol
    header; the spec then wants our header sent back and the socket closed.
    """

    code: int
    text: str
    class_id: int = 0
    method_id: int = 0
    bad_header: bool = False


Event = Union[ProtocolHeaderReceived, MethodReceived, ContentReceived, ContentRefused, HeartbeatReceived, FrameError]


# ----------------------------------------------------------------------------- properties

# (pamqp attribute name, flag bit, wire type) in the spec's order.
_PROPS: tuple[tuple[str, int, str], ...] = (
    ("content_type", 1 << 15, "s"),
    ("content_encoding", 1 << 14, "s"),
    ("headers", 1 << 13, "F"),
    ("delivery_mode", 1 << 12, "o"),
    ("priority", 1 << 11, "o"),
    ("correlation_id", 1 << 10, "s"),
    ("reply_to", 1 << 9, "s"),
    ("expiration", 1 << 8, "s"),
    ("message_id", 1 << 7, "s"),
    ("timestamp", 1 << 6, "T"),
    ("message_type", 1 << 5, "s"),
    ("user_id", 1 << 4, "s"),
    ("app_id", 1 << 3, "s"),
    ("cluster_id", 1 << 2, "s"),
)
PROPERTY_NAMES = tuple(p[0] for p in _PROPS)


def _shortstr(data: bytes, pos: int) -> tuple[str, int]:
    n = data[pos]
    end = pos + 1 + n
    if end > len(data):
        raise ValueError("short string runs past the end of the frame")
    return data[pos + 1 : end].decode("utf-8", "replace"), end


def decode_properties(payload: bytes) -> tuple[int, int, dict[str, Any], bytes | None]:
    """Decode a content header frame's payload.

    Returns (class id, body size, properties, raw headers table or None).
    Properties are keyed by pamqp's attribute names; ``timestamp`` is an int
    (seconds since the epoch), ``headers`` a dict decoded by pamqp.
    Raises ValueError on malformed input.
    """
    if len(payload) < 14:
        raise ValueError("content header too short")
    class_id, _weight, size, flags = _CONTENT_HDR.unpack_from(payload, 0)
    pos = 14
    if flags & 1:  # continuation flag words: no property defined there in 0-9-1
        while True:
            if pos + 2 > len(payload):
                raise ValueError("content header flags are truncated")
            more = _U16.unpack_from(payload, pos)[0]
            pos += 2
            if not more & 1:
                break
    props: dict[str, Any] = {}
    raw_headers: bytes | None = None
    if flags & 0xFFFC:
        for name, bit, kind in _PROPS:
            if not flags & bit:
                continue
            if kind == "s":
                props[name], pos = _shortstr(payload, pos)
            elif kind == "o":
                if pos >= len(payload):
                    raise ValueError("octet property runs past the end of the frame")
                props[name] = payload[pos]
                pos += 1
            elif kind == "T":
                if pos + 8 > len(payload):
                    raise ValueError("timestamp runs past the end of the frame")
                props[name] = _U64.unpack_from(payload, pos)[0]
                pos += 8
            else:  # field table
                if pos + 4 > len(payload):
                    raise ValueError("headers table runs past the end of the frame")
                n = _U32.unpack_from(payload, pos)[0]
                end = pos + 4 + n
                if end > len(payload):
                    raise ValueError("headers table runs past the end of the frame")
                raw_headers = bytes(payload[pos:end])
                _, props[name] = pdecode.field_table(raw_headers)
                pos = end
    return class_id, size, props, raw_headers


_HEADER_CACHE: dict[bytes, tuple[dict[str, Any], bytes | None]] = {}
_PUBLISH_CACHE: dict[bytes, Any] = {}
CACHE_KEY_MAX = 512  # longest property block / publish frame whose decoding is cached
_CACHE_ENTRIES = 4096


def decode_header(payload: bytes) -> tuple[int, int, dict[str, Any], bytes | None, bytes]:
    """:func:`decode_properties` plus the raw property block, with the decoding cached.

    Publishers repeat a few property sets over and over (a content type, a
    delivery mode), so the decoded form of a property block is kept by its
    bytes (up to ``CACHE_KEY_MAX`` of them). The cached dict is shared: the
    door only reads it.
    """
    if len(payload) < 14:
        raise ValueError("content header too short")
    pb = payload[12:]
    hit = _HEADER_CACHE.get(pb)
    class_id, _weight, size = _CLASS_SIZE.unpack_from(payload, 0)
    if hit is None:
        _, _, props, raw = decode_properties(payload)
        hit = (props, raw)
        if len(pb) <= CACHE_KEY_MAX:
            if len(_HEADER_CACHE) >= _CACHE_ENTRIES:
                _HEADER_CACHE.clear()
            _HEADER_CACHE[pb] = hit
    return class_id, size, hit[0], hit[1], pb


def _decode_publish(payload: bytes) -> Any:
    """Basic.Publish arguments (ticket, exchange, routing key, bits), cached by their bytes."""
    m = _PUBLISH_CACHE.get(payload)
    if m is None:
        exchange, p = _shortstr(payload, 6)
        rk, p = _shortstr(payload, p)
        if p >= len(payload):
            raise ValueError("publish frame truncated")
        m = _new_publish(exchange, rk, payload[p])
        if len(payload) <= CACHE_KEY_MAX:
            if len(_PUBLISH_CACHE) >= _CACHE_ENTRIES:
                _PUBLISH_CACHE.clear()
            _PUBLISH_CACHE[payload] = m
    return m


def encode_properties(props: dict[str, Any], raw_headers: bytes | None = None) -> bytes:
    """Encode content properties (pamqp attribute names) as a content header's flags + fields.

    ``raw_headers``, when given, is written verbatim as the headers table (so a
    table is passed on byte for byte, exactly as its publisher encoded it).
    """
    flags = 0
    parts: list[bytes] = []
    for name, bit, kind in _PROPS:
        if kind == "F":
            if raw_headers is not None:
                flags |= bit
                parts.append(raw_headers)
                continue
            v = props.get(name)
            if v:
                flags |= bit
                parts.append(pencode.field_table(v))
            continue
        v = props.get(name)
        if v is None:
            continue
        flags |= bit
        if kind == "s":
            b = v.encode("utf-8") if isinstance(v, str) else bytes(v)
            if len(b) > 255:
                b = b[:255]
            parts.append(bytes((len(b),)) + b)
        elif kind == "o":
            parts.append(bytes((int(v) & 0xFF,)))
        else:
            if isinstance(v, datetime.datetime):
                v = int(v.timestamp())
            parts.append(_U64.pack(int(v) & 0xFFFFFFFFFFFFFFFF))
    return _U16.pack(flags) + b"".join(parts)


# ----------------------------------------------------------------------------- decoder


_LARGE_BODY = 1 << 20  # bodies above this are assembled in place


class _Partial:
    __slots__ = ("method", "size", "props", "raw_headers", "raw_props", "parts", "got", "has_header", "refused", "buf")

    def __init__(self, method: Any) -> None:
        self.method = method
        self.size = 0
        self.props: dict[str, Any] = {}
        self.raw_headers: bytes | None = None
        self.raw_props: bytes | None = None
        self.parts: list[bytes] = []
        self.got = 0
        self.has_header = False
        self.refused = False  # over the limit: body frames are counted and dropped
        self.buf: bytearray | None = None  # a large body, assembled in place (one copy)


def _new_publish(exchange: str, routing_key: str, bits: int) -> commands.Basic.Publish:
    m = object.__new__(commands.Basic.Publish)
    m.ticket = 0
    m.exchange = exchange
    m.routing_key = routing_key
    m.mandatory = bool(bits & 1)
    m.immediate = bool(bits & 2)
    return m


def _new_ack(tag: int, multiple: bool) -> commands.Basic.Ack:
    m = object.__new__(commands.Basic.Ack)
    m.delivery_tag = tag
    m.multiple = multiple
    return m


class FrameDecoder:
    """Incremental AMQP 0-9-1 frame decoder (server side).

    Feed it bytes as they arrive; it returns the complete events found.
    Content frames are assembled per channel, so a Basic.Publish surfaces as
    one :class:`ContentReceived` once its header and every body frame are in.
    After a :class:`FrameError` it returns nothing more.
    """

    def __init__(self, frame_max: int = 131072, expect_protocol_header: bool = True,
                 max_body: int = 1 << 62) -> None:
        self.frame_max = frame_max
        # Announced body sizes are the client's word: above this one nothing is allocated or kept.
        self.max_body = max_body
        self._buf = b""
        self._need_header = expect_protocol_header
        self._content: dict[int, _Partial] = {}
        self.failed: FrameError | None = None

    def _fail(self, out: list[Event], code: int, text: str, class_id: int = 0, method_id: int = 0,
              bad_header: bool = False) -> list[Event]:
        self.failed = FrameError(code, text, class_id, method_id, bad_header)
        out.append(self.failed)
        self._buf = b""
        return out

    def feed(self, data: bytes) -> list[Event]:
        if self.failed is not None:
            return []
        buf = self._buf + data if self._buf else bytes(data)
        out: list[Event] = []
        pos = 0
        if self._need_header:
            if len(buf) < 8:
                if buf[:4] != PROTOCOL_HEADER[: min(4, len(buf))]:
                    return self._fail(out, FRAME_ERROR, "bad protocol header", bad_header=True)
                self._buf = buf
                return out
            if buf[:8] != PROTOCOL_HEADER:
                return self._fail(out, FRAME_ERROR, f"bad protocol header {buf[:8]!r}", bad_header=True)
            self._need_header = False
            out.append(ProtocolHeaderReceived())
            pos = 8
        n = len(buf)
        frame_max = self.frame_max
        content = self._content
        unpack_hdr = _FRAME_HDR.unpack_from
        while n - pos >= 7:
            ftype, ch, size = unpack_hdr(buf, pos)
            if size + 8 > frame_max:
                return self._fail(out, FRAME_ERROR, f"frame of {size + 8} bytes exceeds frame_max {frame_max}")
            end = pos + 7 + size
            if end >= n:
                break
            if buf[end] != FRAME_END:
                return self._fail(out, FRAME_ERROR, f"frame end byte 0x{buf[end]:02x}, expected 0xce")
            payload = buf[pos + 7 : end]
            pos = end + 1
            if ftype == FRAME_METHOD:
                if ch in content:
                    return self._fail(out, UNEXPECTED_FRAME, f"method frame on channel {ch} while receiving content")
                if size < 4:
                    return self._fail(out, FRAME_ERROR, "method frame too short")
                index = _U32.unpack_from(payload, 0)[0]
                try:
                    if index == _BASIC_PUBLISH:
                        # ticket(2) exchange(shortstr) routing_key(shortstr) bits(1)
                        m = _decode_publish(payload)
                    elif index == _BASIC_ACK:
                        if len(payload) < 13:
                            raise ValueError("ack frame truncated")
                        m = _new_ack(_U64.unpack_from(payload, 4)[0], bool(payload[12] & 1))
                    else:
                        cls = commands.INDEX_MAPPING.get(index)
                        if cls is None:
                            return self._fail(
                                out, NOT_IMPLEMENTED, f"unknown method class {index >> 16} method {index & 0xFFFF}",
                                index >> 16, index & 0xFFFF,
                            )
                        m = cls()
                        m.unmarshal(payload[4:])
                except (ValueError, struct.error, IndexError, TypeError, KeyError, OverflowError) as e:
                    return self._fail(out, SYNTAX_ERROR, f"cannot decode method {index >> 16}.{index & 0xFFFF}: {e}",
                                      index >> 16, index & 0xFFFF)
                if index == _BASIC_PUBLISH:
                    if ch == 0:
                        return self._fail(out, COMMAND_INVALID, "basic.publish on channel 0", 60, 40)
                    part = _Partial(m)
                    # Fast path: the header and the single body frame are usually in this buffer already.
                    if n - pos >= 7:
                        ftype, ch2, size = unpack_hdr(buf, pos)
                        end = pos + 7 + size
                        if ftype == FRAME_HEADER and ch2 == ch and end < n and size + 8 <= frame_max:
                            if buf[end] != FRAME_END:
                                return self._fail(out, FRAME_ERROR, f"frame end byte 0x{buf[end]:02x}, expected 0xce")
                            try:
                                class_id, body_size, props, raw, pb = decode_header(buf[pos + 7 : end])
                            except (ValueError, struct.error, IndexError, TypeError, KeyError, OverflowError) as e:
                                return self._fail(out, SYNTAX_ERROR, f"cannot decode content header: {e}")
                            if class_id != 60:
                                return self._fail(out, UNEXPECTED_FRAME,
                                                  f"content header for class {class_id}, expected 60")
                            pos = end + 1
                            if body_size == 0:
                                out.append(ContentReceived(ch, m, props, b"", raw, pb))
                                continue
                            if body_size > self.max_body:
                                part.has_header = part.refused = True
                                part.size = body_size
                                content[ch] = part
                                out.append(ContentRefused(ch, m, body_size, self.max_body))
                                continue
                            part.has_header = True
                            part.size = body_size
                            part.props = props
                            part.raw_headers = raw
                            part.raw_props = pb
                            if n - pos >= 7:
                                ftype, ch2, size = unpack_hdr(buf, pos)
                                end = pos + 7 + size
                                if (ftype == FRAME_BODY and ch2 == ch and size == body_size and end < n
                                        and size + 8 <= frame_max and buf[end] == FRAME_END):
                                    out.append(ContentReceived(ch, m, props, buf[pos + 7 : end], raw, pb))
                                    pos = end + 1
                                    continue
                    content[ch] = part
                else:
                    out.append(MethodReceived(ch, m))
            elif ftype == FRAME_HEADER:
                part = content.get(ch)
                if part is None or part.has_header:
                    return self._fail(out, UNEXPECTED_FRAME, f"unexpected content header frame on channel {ch}")
                try:
                    class_id, body_size, props, raw, pb = decode_header(payload)
                except (ValueError, struct.error, IndexError, TypeError, KeyError, OverflowError) as e:
                    return self._fail(out, SYNTAX_ERROR, f"cannot decode content header: {e}")
                if class_id != 60:
                    return self._fail(out, UNEXPECTED_FRAME, f"content header for class {class_id}, expected 60")
                part.has_header = True
                part.size = body_size
                if body_size > self.max_body:
                    part.refused = True
                    out.append(ContentRefused(ch, part.method, body_size, self.max_body))
                    continue
                part.props = props
                part.raw_headers = raw
                part.raw_props = pb
                if body_size == 0:
                    del content[ch]
                    out.append(ContentReceived(ch, part.method, props, b"", raw, pb))
            elif ftype == FRAME_BODY:
                part = content.get(ch)
                if part is None or not part.has_header:
                    return self._fail(out, UNEXPECTED_FRAME, f"unexpected content body frame on channel {ch}")
                got = part.got
                part.got = got + size
                if part.got > part.size:
                    return self._fail(out, FRAME_ERROR, f"content body longer than the {part.size} bytes announced")
                if part.refused:
                    if part.got == part.size:
                        del content[ch]
                    continue
                if part.got == part.size:
                    del content[ch]
                    if part.buf is not None:
                        part.buf[got:] = payload
                        body = part.buf  # type: ignore[assignment]  # bytes-like: stored and delivered as is
                    elif part.parts:
                        part.parts.append(payload)
                        body = b"".join(part.parts)
                    else:
                        body = payload
                    out.append(ContentReceived(ch, part.method, part.props, body, part.raw_headers, part.raw_props))
                elif part.buf is not None or part.size > _LARGE_BODY:
                    # A large body is copied once into a buffer of the announced size (checked
                    # against max_body above), not kept as frames and joined at the end.
                    if part.buf is None:
                        part.buf = bytearray(part.size)
                    part.buf[got : part.got] = payload
                else:
                    part.parts.append(payload)
            elif ftype == FRAME_HEARTBEAT:
                if ch != 0:
                    return self._fail(out, FRAME_ERROR, f"heartbeat frame on channel {ch}")
                out.append(HeartbeatReceived())
            else:
                return self._fail(out, FRAME_ERROR, f"unknown frame type {ftype}")
        self._buf = buf[pos:] if pos < n else b""
        return out

    def discard_channel(self, channel: int) -> None:
        """Forget a half-received content on ``channel`` (the channel was closed); a refused one
        stays until its last body frame, which the client sends before it sees the close."""
        part = self._content.get(channel)
        if part is not None and not part.refused:
            del self._content[channel]


# ----------------------------------------------------------------------------- encoders


def _frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HDR.pack(ftype, channel, len(payload)) + payload + b"\xce"


_NOVALIDATE: dict[type, type] = {}


def method(cls: type, **kwargs: Any) -> Any:
    """Build a pamqp method object for sending, without pamqp's name-regex validation."""
    sub = _NOVALIDATE.get(cls)
    if sub is None:
        sub = _NOVALIDATE[cls] = type(cls.__name__, (cls,), {"validate": lambda self: None})
    return sub(**kwargs)


def encode_method(channel: int, m: Any) -> bytes:
    """One method frame (pamqp marshalling)."""
    return _frame(FRAME_METHOD, channel, _U32.pack(m.index) + m.marshal())


def _sstr(s: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > 255:
        b = b[:255]
    return bytes((len(b),)) + b


_DELIVER_HEAD: dict[str, bytes] = {}
_DELIVER_TAIL: dict[tuple[str, str], bytes] = {}


def encode_deliver(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool, exchange: str,
                   routing_key: str) -> bytes:
    """Basic.Deliver method frame (the layout pamqp produces).

    The consumer-tag and exchange/routing-key parts are cached: a consumer
    receives the same ones over and over.
    """
    head = _DELIVER_HEAD.get(consumer_tag)
    if head is None:
        if len(_DELIVER_HEAD) > 4096:
            _DELIVER_HEAD.clear()
        head = _DELIVER_HEAD[consumer_tag] = _U32.pack(_BASIC_DELIVER) + _sstr(consumer_tag)
    tail = _DELIVER_TAIL.get((exchange, routing_key))
    if tail is None:
        if len(_DELIVER_TAIL) > 4096:
            _DELIVER_TAIL.clear()
        tail = _DELIVER_TAIL[(exchange, routing_key)] = _sstr(exchange) + _sstr(routing_key) + b"\xce"
    return b"".join((_FRAME_HDR.pack(FRAME_METHOD, channel, len(head) + len(tail) + 8), head,
                     _U64.pack(delivery_tag), b"\x01" if redelivered else b"\x00", tail))


_DELIVERY_PARTS: dict[tuple[int, str, str, str, bytes], tuple[bytes, bytes, bytes]] = {}
_TAG_REDELIVERED = struct.Struct(">QB")


def encode_delivery(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool, exchange: str,
                    routing_key: str, properties: bytes, body: bytes, frame_max: int) -> bytes:
    """Basic.Deliver + content header + body frames, from parts prebuilt per (consumer, route, properties).

    Equal to ``encode_deliver(...) + encode_content(...)``; a consumer receives
    the same consumer tag, route and properties over and over, so only the
    delivery tag, the redelivered bit and the body sizes are packed per message.
    """
    key = (channel, consumer_tag, exchange, routing_key, properties)
    parts = _DELIVERY_PARTS.get(key)
    if parts is None:
        ctag = _sstr(consumer_tag)
        tail = _sstr(exchange) + _sstr(routing_key)
        head = _FRAME_HDR.pack(FRAME_METHOD, channel, 4 + len(ctag) + 9 + len(tail)) + _U32.pack(_BASIC_DELIVER) + ctag
        mid = tail + b"\xce" + _FRAME_HDR.pack(FRAME_HEADER, channel, 12 + len(properties)) + b"\x00\x3c\x00\x00"
        parts = (head, mid, properties + b"\xce")
        if len(properties) <= CACHE_KEY_MAX:
            if len(_DELIVERY_PARTS) >= _CACHE_ENTRIES:
                _DELIVERY_PARTS.clear()
            _DELIVERY_PARTS[key] = parts
    n = len(body)
    limit = frame_max - 8 if frame_max else n
    if n == 0:
        return b"".join((parts[0], _TAG_REDELIVERED.pack(delivery_tag, redelivered), parts[1], _U64.pack(0), parts[2]))
    if n <= limit:
        return b"".join((parts[0], _TAG_REDELIVERED.pack(delivery_tag, redelivered), parts[1], _U64.pack(n), parts[2],
                         _FRAME_HDR.pack(FRAME_BODY, channel, n), body, b"\xce"))
    out = [parts[0], _TAG_REDELIVERED.pack(delivery_tag, redelivered), parts[1], _U64.pack(n), parts[2]]
    for i in range(0, n, limit):
        chunk = body[i : i + limit]
        out.append(_FRAME_HDR.pack(FRAME_BODY, channel, len(chunk)) + chunk + b"\xce")
    return b"".join(out)


def encode_get_ok(channel: int, delivery_tag: int, redelivered: bool, exchange: str, routing_key: str,
                  message_count: int) -> bytes:
    """Basic.GetOk method frame."""
    payload = b"".join((
        _U32.pack(_BASIC_GET_OK), _U64.pack(delivery_tag), b"\x01" if redelivered else b"\x00",
        _sstr(exchange), _sstr(routing_key), _U32.pack(message_count & 0xFFFFFFFF),
    ))
    return _frame(FRAME_METHOD, channel, payload)


def encode_basic_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """Basic.Ack method frame (publisher confirms)."""
    return _frame(FRAME_METHOD, channel, _U32.pack(_BASIC_ACK) + _U64.pack(delivery_tag) + (b"\x01" if multiple else b"\x00"))


def encode_content(channel: int, properties: bytes, body: bytes, frame_max: int) -> bytes:
    """A content header frame plus as many body frames as ``frame_max`` requires.

    ``properties`` is the output of :func:`encode_properties`.
    """
    header = _frame(FRAME_HEADER, channel, _CONTENT_HDR.pack(60, 0, len(body), 0)[:12] + properties)
    if not body:
        return header
    limit = frame_max - 8 if frame_max else len(body)
    if len(body) <= limit:
        return header + _FRAME_HDR.pack(FRAME_BODY, channel, len(body)) + body + b"\xce"
    parts = [header]
    for i in range(0, len(body), limit):
        chunk = body[i : i + limit]
        parts.append(_FRAME_HDR.pack(FRAME_BODY, channel, len(chunk)) + chunk + b"\xce")
    return b"".join(parts)


HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def encode_heartbeat() -> bytes:
    return HEARTBEAT_FRAME
