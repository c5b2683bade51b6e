"""CommitLog record codec (sans-io): message <-> bytes, checksummed.

Layout, little-endian, every record self-describing so recovery can walk the
log and stop at the first torn or corrupt record::

    total_size u32 | magic u32 | crc32c u32      <- crc covers everything after it
    flags u32 | queue_id i32 | queue_offset i64 | phys_offset i64
    born_ts i64 | store_ts i64 | delivery_ts i64 | origin_offset i64 | origin_size i32
    reconsume_times i32
    len(topic) u16 | len(born_host) u16 | len(message_id) u16 | len(tag) u16
    len(message_group) u16 | len(protocol) u16
    len(keys) u32 | len(properties) u32 | len(dispatch) u32 | len(body) u32
    topic | born_host | message_id | tag | message_group | protocol
    keys ('\\0'-joined) | properties | dispatch | body

``properties`` is a sequence of (u16 klen, u32 vlen, key, value) so any value
survives, unlike RocketMQ's separator-joined string. ``dispatch`` lists the
extra (topic, queue id, queue offset) a record was multi-dispatched into, so
consume queues can be rebuilt from the log alone. A *link* record
(``origin_offset >= 0``) carries no body: it dispatches an earlier record
into a queue later (delay fire, transaction commit) so a body is stored once.
A BLANK record fills the unusable tail of a segment.
"""

from __future__ import annotations

import struct
from typing import Callable, Iterable

from crc32c import crc32c

from .errors import CorruptRecordError
from .model import DispatchTarget, Message, StoredMessage

MAGIC_MESSAGE = 0xDAA320A7
MAGIC_BLANK = 0xCBD43194

PREFIX = struct.Struct("<III")
FIXED = struct.Struct("<IiqqqqqqiiHHHHHHIIII")
HEADER_SIZE = PREFIX.size + FIXED.size
_PROP = struct.Struct("<HI")
_PROP_PACK = _PROP.pack
_DISPATCH = struct.Struct("<Hiq")
_DISPATCH_PACK = _DISPATCH.pack
DISPATCH_ENTRY_SIZE = _DISPATCH.size  # one extra queue in a dispatch block, before its topic's bytes
_PACK_FIXED = FIXED.pack
_PACK_PREFIX = PREFIX.pack
_UNPACK_FIXED = FIXED.unpack_from
_UNPACK_PREFIX = PREFIX.unpack_from

FLAG_LINK = 0x1  # record dispatches origin_offset's message, carries no body of its own
# A batch record: its body is a producer's batch (gateway/batch_codec.py), opaque to the store,
# holding P_BATCH_COUNT messages. Its own queue (a batch queue) indexes it once for all of them;
# P_BATCH_DISPATCH names, per extra dispatch target, the message of the batch that target gets
# (comma-separated indexes): a classic queue entry of one message of a batch carries that index
# in its tag-hash field. A link to one message of a batch carries P_BATCH_INDEX.
FLAG_BATCH = 0x2
P_BATCH_COUNT = "__batch_n"
P_BATCH_DISPATCH = "__batch_x"
P_BATCH_INDEX = "__batch_i"
# The client-chosen ids of a batch's messages, "\0"-joined in message order (empty for one
# without): the store indexes each (``#id#<id>`` -> the record) so a query by id finds any
# message of a batch without the store opening the batch's body. Present only when some message
# of the batch has a client id.
P_BATCH_IDS = "__batch_ids"


# Encoded properties: a door stamps the same names on every message (mqtt_*, ce_*,
# amqp_*), most with few distinct values (ce_specversion "1.0", mqtt_qos "1", a
# ce_type or ce_source per producer). Each (name, value) entry is encoded once and
# reused; a name that shows more than _VALUES_PER_KEY distinct values (ce_id,
# ce_time) stops caching new ones. Bounded both ways: names and values are the
# client's. Under cachegrind a cached entry costs about a third of encoding it.
_PROP_CACHE: dict[str, dict] = {}
_KEYS_MAX = 1024
_VALUES_PER_KEY = 64


def _prop_entry(k: str, v, kc: dict | None) -> bytes:
    kb = k.encode()
    vb = v.encode() if isinstance(v, str) else bytes(v)
    e = _PROP_PACK(len(kb), len(vb)) + kb + vb
    if v.__class__ is str:
        if kc is None:
            if len(_PROP_CACHE) < _KEYS_MAX:
                _PROP_CACHE[k] = {v: e}
        elif len(kc) < _VALUES_PER_KEY:
            kc[v] = e
    return e


def encode_properties(props: dict[str, str]) -> bytes:
    """(u16 klen, u32 vlen, key, value) per property, joined once; see _PROP_CACHE."""
    if not props:
        return b""
    parts: list[bytes] = []
    add = parts.append
    cache = _PROP_CACHE
    for k, v in props.items():
        kc = cache.get(k)
        if kc is not None:
            try:
                e = kc.get(v)
            except TypeError:  # an unhashable value (bytearray): encoded below, never cached
                e = None
            if e is not None:
                add(e)
                continue
        add(_prop_entry(k, v, kc))
    return b"".join(parts)


# Decoded property blocks, by their bytes: the same doors stamp the same few blocks on
# most messages (an MQTT topic and QoS, a CloudEvents type and source), and decoding a
# block entry by entry costs more than the rest of a record's decode. Callers get a
# copy (they may change it); blocks with a unique value (ce_id) just miss, and the
# table starts over when full, so its size stays bounded whatever clients send.
_BLOCKS: dict[bytes, dict[str, str]] = {}
_BLOCKS_MAX = 4096
_BLOCK_MAX_LEN = 512


def decode_properties(buf: bytes) -> dict[str, str]:
    if len(buf) <= _BLOCK_MAX_LEN:
        if buf.__class__ is not bytes:
            buf = bytes(buf)
        d = _BLOCKS.get(buf)
        if d is None:
            d = _decode_properties(buf)
            if len(_BLOCKS) >= _BLOCKS_MAX:
                _BLOCKS.clear()
            _BLOCKS[buf] = d
        return d.copy()
    return _decode_properties(buf)


def _decode_properties(buf: bytes) -> dict[str, str]:
    props: dict[str, str] = {}
    pos, end = 0, len(buf)
    while pos < end:
        kl, vl = _PROP.unpack_from(buf, pos)
        pos += 6
        k = buf[pos : pos + kl].decode()
        pos += kl
        props[k] = buf[pos : pos + vl].decode(errors="surrogateescape")
        pos += vl
    return props


def encode_dispatch(targets: Iterable[DispatchTarget], offsets: Iterable[int]) -> bytes:
    parts: list[bytes] = []
    pack = _DISPATCH_PACK
    for (topic, qid), qo in zip(targets, offsets):
        tb = topic.encode()
        parts += (pack(len(tb), qid, qo), tb)
    return b"".join(parts)


# Decoded dispatch targets of one-target records (a door's LMQ or queue), by the
# target's bytes without the per-record queue offset; DispatchTargets are immutable,
# so every record naming the same queue shares one. Bounded as _BLOCKS is.
_TARGETS: dict[bytes, tuple[DispatchTarget, ...]] = {}
_tuple_new = tuple.__new__


def decode_targets(buf: bytes) -> tuple[DispatchTarget, ...]:
    """The (topic, queue) targets of a dispatch block, without their queue offsets."""
    if len(buf) == _DISPATCH.size + (buf[0] | buf[1] << 8):  # one target: the common case
        key = bytes(buf[2:6]) + buf[_DISPATCH.size :]
        t = _TARGETS.get(key)
        if t is None:
            t = tuple(_tuple_new(DispatchTarget, (n, q)) for n, q, _ in decode_dispatch(buf))
            if len(_TARGETS) >= _BLOCKS_MAX:
                _TARGETS.clear()
            _TARGETS[key] = t
        return t
    return tuple(_tuple_new(DispatchTarget, (n, q)) for n, q, _ in decode_dispatch(buf))


def decode_dispatch(buf: bytes) -> list[tuple[str, int, int]]:
    out = []
    pos, end = 0, len(buf)
    while pos < end:
        tl, qid, qo = _DISPATCH.unpack_from(buf, pos)
        pos += _DISPATCH.size
        out.append((buf[pos : pos + tl].decode(), qid, qo))
        pos += tl
    return out


_BARE_HEADS: dict[int, Callable[..., bytes]] = {}  # by len(topic + protocol): few distinct values


def bare_head_packer(n: int) -> Callable[..., bytes]:
    """The packer of a bare message's header (no tag, keys, properties, ids, extra queues or
    link) whose topic and protocol take ``n`` bytes together: one ``struct`` call, the zero
    length fields as pad bytes and topic + protocol as one field. Arguments: flags, queue id,
    queue offset, phys offset, born, store and delivery times, origin offset (-1), reconsume
    times, topic length, protocol length, body length, topic + protocol bytes. The result is
    the record without its prefix (size, magic, CRC) and body: the CRC covers it and the body.
    """
    pack = _BARE_HEADS.get(n)
    if pack is None:
        st = struct.Struct(f"<Iiqqqqqq4xiH8xH12xI{n}s")
        assert st.size == HEADER_SIZE - PREFIX.size + n
        pack = _BARE_HEADS[n] = st.pack
    return pack


_DOOR_HEADS: dict[tuple[int, int], Callable[..., bytes]] = {}  # by the strings' lengths: few distinct values
_DOOR_LENS = struct.Struct("<HHHHHHIII")


def door_head(topic: bytes, host: bytes, proto: bytes, props: bytes,
              target: bytes | None = None) -> tuple[Callable[..., bytes], bytes, bytes]:
    """The packer of a door message's header: properties, a born host and at most one extra
    queue (``target``: its topic, encoded), but no tag, keys, ids, message group or link (what a
    door's plain publish stores), and its two constant arguments: the length fields before the
    body's and the strings after it.

    ``pack(flags, queue id, queue offset, phys offset, born, store and delivery times, origin
    offset (-1), origin size (0), reconsume times, lengths, body length, strings)``, followed
    with a target by ``(len(target), its queue id, its queue offset, target)``, gives the bytes
    of :func:`encode_head` without its prefix (size, magic, CRC), in one ``struct`` call: a run
    of messages of one topic, publisher and property block encodes its strings once.
    """
    strings = topic + host + proto + props
    m = -1 if target is None else len(target)
    lens = _DOOR_LENS.pack(len(topic), len(host), 0, 0, 0, len(proto), 0, len(props),
                           0 if target is None else _DISPATCH.size + m)
    n = len(strings)
    pack = _DOOR_HEADS.get((n, m))
    if pack is None:
        st = struct.Struct(f"<Iiqqqqqqii{_DOOR_LENS.size}sI{n}s" + ("" if target is None else f"Hiq{m}s"))
        assert st.size == HEADER_SIZE - PREFIX.size + n + (0 if target is None else _DISPATCH.size + m)
        if len(_DOOR_HEADS) >= 4096:
            _DOOR_HEADS.clear()
        pack = _DOOR_HEADS[(n, m)] = st.pack
    return pack, lens, strings


def encode(
    msg: Message,
    queue_offset: int,
    phys_offset: int,
    store_ts: int,
    dispatch: bytes = b"",
    origin_offset: int = -1,
    origin_size: int = 0,
) -> bytes:
    """Encode one record. ``msg.message_id`` is stored only when a client chose it."""
    topic = msg.topic.encode()
    body = msg.body
    if origin_offset < 0 and not (
        msg.tag or msg.message_group or msg.properties or msg.keys or msg.born_host or msg.message_id or dispatch
    ):
        # The common bare message: the same packer as core_broker.appender's loops.
        proto = msg.protocol.encode()
        tail = bare_head_packer(len(topic) + len(proto))(
            msg.flags & ~FLAG_LINK, msg.queue_id, queue_offset, phys_offset, msg.born_timestamp_ms or store_ts,
            store_ts, msg.delivery_time_ms, -1, msg.reconsume_times, len(topic), len(proto), len(body), topic + proto,
        ) + body
        return _PACK_PREFIX(len(tail) + 12, MAGIC_MESSAGE, crc32c(tail)) + tail
    return encode_head(msg, queue_offset, phys_offset, store_ts, dispatch, origin_offset, origin_size) + body


def encode_head(
    msg: Message,
    queue_offset: int,
    phys_offset: int,
    store_ts: int,
    dispatch: bytes = b"",
    origin_offset: int = -1,
    origin_size: int = 0,
) -> bytes:
    """The record of :func:`encode` without its body: ``encode(...) == encode_head(...) + msg.body``.

    The CRC is chained over the body, which is never copied here: the put paths
    write head and body as two pieces (pwritev, or two slice stores into the map).
    Every field may be present (properties, keys, ids, extra dispatch).
    """
    body = msg.body
    topic = msg.topic.encode()
    host = msg.born_host.encode() if msg.born_host else b""
    mid = msg.message_id.encode() if msg.message_id else b""
    tag = msg.tag.encode() if msg.tag else b""
    group = msg.message_group.encode() if msg.message_group else b""
    proto = msg.protocol.encode()
    keys = "\0".join(msg.keys).encode() if msg.keys else b""
    props = encode_properties(msg.properties) if msg.properties else b""
    # FLAG_LINK is the store's own bit: a message read through a link carries it, and
    # re-putting that message (a retry) must store a real record, not a broken link.
    flags = (msg.flags & ~FLAG_LINK) | (FLAG_LINK if origin_offset >= 0 else 0)
    head = b"".join((
        _PACK_FIXED(
            flags, msg.queue_id, queue_offset, phys_offset, msg.born_timestamp_ms or store_ts, store_ts,
            msg.delivery_time_ms, origin_offset, origin_size, msg.reconsume_times, len(topic), len(host),
            len(mid), len(tag), len(group), len(proto), len(keys), len(props), len(dispatch), len(body),
        ),
        topic, host, mid, tag, group, proto, keys, props, dispatch,
    ))
    return _PACK_PREFIX(len(head) + len(body) + 12, MAGIC_MESSAGE, crc32c(body, crc32c(head))) + head


def encoded_size(msg: Message) -> int:
    """Upper bound used for the size check before encoding (cheap)."""
    return HEADER_SIZE + len(msg.topic) * 4 + len(msg.body) + 1024


def blank(size: int) -> bytes:
    """Filler for the end of a segment too small for the next record."""
    return _PACK_PREFIX(size, MAGIC_BLANK, 0)


class RecordHeader:
    """Parsed fixed part of a record, enough to dispatch it without decoding the body."""

    __slots__ = (
        "size",
        "flags",
        "queue_id",
        "queue_offset",
        "phys_offset",
        "store_ts",
        "delivery_ts",
        "origin_offset",
        "origin_size",
        "topic",
        "tag",
        "keys",
        "message_id",
        "dispatch",
        "batch_count",
        "batch_dispatch",
        "batch_ids",
    )


_MAGIC_BYTES = struct.pack("<I", MAGIC_MESSAGE)
_PHYS = struct.Struct("<q")
_PHYS_AT = PREFIX.size + 16  # phys_offset i64, after flags u32, queue_id i32, queue_offset i64


def record_start_before(buf, rel: int, lo: int, base: int) -> int | None:
    """The position in ``buf`` (whose byte 0 is commitlog offset ``base``) of the nearest record
    starting at or before position ``rel``, looking back no further than ``lo``; None when there
    is none in that range.

    Why: a message inside a batch record has an id naming a position inside the record
    (``gateway/batch_send.py``), and records are length-prefixed only at their start. Looking
    back for the record magic (``rfind``: C), a candidate counts only when its header names its
    own offset (``phys_offset``): a magic found inside a body does not. The caller decodes the
    record found and checks that it holds ``rel`` (a batch's index below its count)."""
    end = rel + 8  # a magic at rel + 4 at most: a record starting at rel itself
    n = len(buf)
    while True:
        i = buf.rfind(_MAGIC_BYTES, lo, end)
        if i < 4:
            return None
        pos = i - 4
        if pos + _PHYS_AT + 8 <= n and _PHYS.unpack_from(buf, pos + _PHYS_AT)[0] == base + pos:
            return pos
        end = i + 3  # the next candidate starts before this one


def batch_ids(props: dict[str, str]) -> tuple[str, ...]:
    """The client ids a batch record's messages are indexed by (``P_BATCH_IDS``), each once."""
    ids = props.get(P_BATCH_IDS)
    return tuple(dict.fromkeys(i for i in ids.split("\0") if i)) if ids else ()


def check(buf, pos: int, limit: int) -> tuple[int, int]:
    """Validate the record at ``pos``: return (kind, size); kind 0=end/invalid, 1=message, 2=blank.

    Used by recovery to find the last valid record: a zero size, an unknown magic,
    a size running past ``limit`` or a CRC mismatch all mean the log ends here.
    """
    if pos + 12 > limit:
        return 0, 0
    size, magic, crc = _UNPACK_PREFIX(buf, pos)
    if magic == MAGIC_BLANK:
        return (2, size) if 12 <= size <= limit - pos else (0, 0)
    if magic != MAGIC_MESSAGE or size < HEADER_SIZE or pos + size > limit:
        return 0, 0
    with memoryview(buf) as mv:
        ok = crc32c(mv[pos + 12 : pos + size]) == crc
    return (1, size) if ok else (0, 0)


def parse_header(buf, pos: int) -> RecordHeader:
    """Parse a record already validated by :func:`check` (for dispatch and indexing)."""
    size = _UNPACK_PREFIX(buf, pos)[0]
    f = _UNPACK_FIXED(buf, pos + 12)
    h = RecordHeader()
    h.size = size
    h.flags, h.queue_id, h.queue_offset, h.phys_offset = f[0], f[1], f[2], f[3]
    h.store_ts, h.delivery_ts, h.origin_offset, h.origin_size = f[5], f[6], f[7], f[8]
    p = pos + HEADER_SIZE
    tl, hl, ml, gl_tag, gl, pl, kl, prl, dl = f[10], f[11], f[12], f[13], f[14], f[15], f[16], f[17], f[18]
    h.topic = bytes(buf[p : p + tl]).decode()
    p += tl + hl
    h.message_id = bytes(buf[p : p + ml]).decode()
    p += ml
    h.tag = bytes(buf[p : p + gl_tag]).decode() if gl_tag else None
    p += gl_tag + gl + pl
    h.keys = bytes(buf[p : p + kl]).decode().split("\0") if kl else []
    p += kl
    h.batch_count, h.batch_dispatch, h.batch_ids = 0, (), ()
    if h.flags & FLAG_BATCH and not h.flags & FLAG_LINK:
        props = decode_properties(bytes(buf[p : p + prl])) if prl else {}
        h.batch_count = int(props.get(P_BATCH_COUNT, "1"))
        x = props.get(P_BATCH_DISPATCH)
        h.batch_dispatch = tuple(int(i) for i in x.split(",")) if x else ()
        h.batch_ids = batch_ids(props)
    p += prl
    h.dispatch = decode_dispatch(bytes(buf[p : p + dl])) if dl else []
    return h


def decode(buf, pos: int, verify: bool = True) -> StoredMessage:
    """Decode the full message at ``pos``; the body is copied exactly once."""
    if pos < 0 or pos + 12 > len(buf):  # e.g. a forged id naming a segment's last bytes
        raise CorruptRecordError(f"no record at offset {pos}")
    size, magic, crc = _UNPACK_PREFIX(buf, pos)
    if magic != MAGIC_MESSAGE or size < HEADER_SIZE or pos + size > len(buf):
        raise CorruptRecordError(f"no record at offset {pos}")
    if verify:
        with memoryview(buf) as mv:
            if crc32c(mv[pos + 12 : pos + size]) != crc:
                raise CorruptRecordError(f"checksum mismatch at offset {pos}")
    f = _UNPACK_FIXED(buf, pos + 12)
    m = StoredMessage.__new__(StoredMessage)
    m.flags, m.queue_id, m.queue_offset, m.commitlog_offset = f[0], f[1], f[2], f[3]
    m.born_timestamp_ms, m.store_timestamp_ms, m.delivery_time_ms = f[4], f[5], f[6]
    m.reconsume_times = f[9]
    m.store_size = size
    p = pos + HEADER_SIZE
    e = p + f[10]
    m.topic = buf[p:e].decode()
    p, e = e, e + f[11]
    m.born_host = buf[p:e].decode()
    p, e = e, e + f[12]
    m.message_id = buf[p:e].decode()
    p, e = e, e + f[13]
    m.tag = buf[p:e].decode() if f[13] else None
    p, e = e, e + f[14]
    m.message_group = buf[p:e].decode() if f[14] else None
    p, e = e, e + f[15]
    m.protocol = buf[p:e].decode()
    p, e = e, e + f[16]
    m.keys = tuple(buf[p:e].decode().split("\0")) if f[16] else ()
    p, e = e, e + f[17]
    m.properties = decode_properties(buf[p:e]) if f[17] else {}
    p, e = e, e + f[18]
    m.extra_dispatch = decode_targets(buf[p:e]) if f[18] else ()
    p, e = e, e + f[19]
    m.body = buf[p:e]
    return m


def link_origin(buf, pos: int) -> tuple[int, int]:
    """(origin_offset, origin_size) of a record; origin_offset is -1 for a plain message."""
    f = _UNPACK_FIXED(buf, pos + 12)
    return f[7], f[8]


#: The prefix of one property in a properties block: key length u16, value length u32 (then the
#: key and the value). Named for readers that decode many records at once (record_layout.py).
PROPERTY_ENTRY = _PROP
