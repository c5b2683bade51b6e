"""The body of a batch record: many messages as columns, optionally compressed.

Why columns, and why hand-written: a batch is packed once (by the gateway, or by a
producer such as the Spark sink) and stored as it came; the store never looks
inside (``record.FLAG_BATCH``). Readers unpack it at the gateway, one message at
a time for the doors, or whole for Arrow: each variable column is laid out as an
Arrow binary array's buffers (int32 offsets, then the bytes), so pyarrow wraps a
batch's bodies without a copy and without a Python step per message
(``gateway/arrow_pages.py``). No library packs exactly this (Arrow IPC would
need pyarrow on every door's hot path, and carries a schema per batch); the
struct packing here is a few dozen lines. Compression (zstd through
``zstandard``, lz4 frames through ``lz4``, both optional imports) covers the
whole column block, so the stored record is the compressed one.

Layout, little-endian::

    magic b"UMB1" | codec u8 (0 none, 1 zstd, 2 lz4) | 3 reserved bytes | count u32 | raw length u32
    then the column block (compressed as a whole when codec != 0), raw length bytes:
        born timestamps  i64 x count
        for each column of COLUMNS: offsets i32 x (count + 1) from 0, then the bytes,
        padded with zeros to a multiple of 8

Columns: ``body``; ``keys`` ("\\0"-joined); ``properties`` (the store's property
encoding, ``record.encode_properties``); ``message_id`` (a client-chosen id, or empty).
Tag, protocol and topic are the batch's (one record), so a batch holds messages
that share them.
"""

from __future__ import annotations

import struct
import sys
from typing import Sequence

from core_broker.errors import BadRequestError
from core_broker.model import Message, StoredMessage
from core_broker.record import (
    FLAG_BATCH, P_BATCH_COUNT, P_BATCH_DISPATCH, P_BATCH_IDS, P_BATCH_INDEX, decode_properties, encode_properties,
)

__all__ = ["P_BATCH_COUNT", "MAGIC", "CODECS", "COLUMNS", "BatchError", "pack", "Unpacked", "unpack", "batch_record",
           "expand", "expand_all", "expand_popped", "compressed_block"]

MAGIC = b"UMB1"
HEAD = struct.Struct("<4sB3xII")
CODECS = {"none": 0, "zstd": 1, "lz4": 2}
COLUMNS = ("body", "keys", "properties", "message_id")
if sys.byteorder != "little":  # offsets are read through native memoryview casts
    raise ImportError("the batch codec reads little-endian columns natively")


class BatchError(BadRequestError):
    """A batch body that is not one (bad magic, lengths, codec); the protocol's 400."""

    code = "ILLEGAL_BATCH"


def _compress(codec: int, raw: bytes) -> bytes:
    if codec == 1:
        import zstandard

        return zstandard.ZstdCompressor(level=1).compress(raw)
    if codec == 2:
        import lz4.frame

        return lz4.frame.compress(raw)
    return raw


def _decompress(codec: int, data, raw_len: int) -> bytes:
    try:
        if codec == 1:
            import zstandard

            return zstandard.ZstdDecompressor().decompress(bytes(data), max_output_size=raw_len)
        if codec == 2:
            import lz4.frame

            return lz4.frame.decompress(bytes(data))
    except ImportError as e:
        raise BatchError(f"this gateway cannot decompress the batch: {e} (install unimq[batch])") from None
    except Exception as e:  # a corrupt frame: the library's own error types differ
        raise BatchError(f"batch does not decompress: {e}") from None
    raise BatchError(f"unknown batch codec {codec}")


def _column(parts: list[bytes]) -> bytes:
    offs = [0]
    n = 0
    for p in parts:
        n += len(p)
        offs.append(n)
    data = b"".join(parts)
    pad = -(4 * len(offs) + len(data)) % 8
    return struct.pack(f"<{len(offs)}i", *offs) + data + b"\0" * pad


def pack(messages: Sequence[Message], compression: str = "none") -> bytes:
    """The batch body of ``messages`` (their bodies, keys, properties, client ids, born times)."""
    codec = CODECS.get(compression)
    if codec is None:
        raise BatchError(f"batch compression is one of {sorted(CODECS)}, not {compression!r}")
    n = len(messages)
    block = b"".join((
        struct.pack(f"<{n}q", *(m.born_timestamp_ms for m in messages)),
        _column([bytes(m.body) for m in messages]),
        _column(["\0".join(m.keys).encode() if m.keys else b"" for m in messages]),
        _column([encode_properties(m.properties) if m.properties else b"" for m in messages]),
        _column([m.message_id.encode() if m.message_id else b"" for m in messages]),
    ))
    data = _compress(codec, block)
    return HEAD.pack(MAGIC, codec, n, len(block)) + data


def compressed_block(body) -> tuple[int, int, int]:
    """(codec, count, raw length) of a batch body, checked; what a door needs to store one."""
    if len(body) < HEAD.size:
        raise BatchError("a batch body starts with a 16-byte header")
    magic, codec, count, raw_len = HEAD.unpack_from(body, 0)
    if magic != MAGIC or codec not in (0, 1, 2) or count < 1:
        raise BatchError("not a unimq batch (magic UMB1, codec 0-2, at least one message)")
    if codec == 0 and raw_len != len(body) - HEAD.size:
        raise BatchError("batch length does not match its header")
    return codec, count, raw_len


class Unpacked:
    """A batch's columns: ``born`` timestamps and per column (offsets, bytes) views."""

    __slots__ = ("count", "block", "born", "columns")

    def __init__(self, body) -> None:
        codec, count, raw_len = compressed_block(body)
        block = memoryview(body)[HEAD.size:] if codec == 0 else memoryview(_decompress(codec, memoryview(body)[HEAD.size:], raw_len))
        if len(block) != raw_len:
            raise BatchError("batch length does not match its header")
        self.count, self.block = count, block
        pos = 8 * count
        if pos > raw_len:
            raise BatchError("batch shorter than its timestamps")
        self.born = block[:pos].cast("q")
        cols = []
        for _ in COLUMNS:
            end = pos + 4 * (count + 1)
            if end > raw_len:
                raise BatchError("batch shorter than its columns")
            offs = block[pos:end].cast("i")
            size = offs[count]
            if offs[0] != 0 or size < 0 or end + size > raw_len:
                raise BatchError("batch column out of bounds")
            cols.append((offs, block[end:end + size], end))
            pos = end + size
            pos += -pos % 8
        self.columns = cols

    def field(self, col: int, i: int) -> bytes:
        offs, data, _ = self.columns[col]
        a, b = offs[i], offs[i + 1]
        if not 0 <= a <= b <= len(data):
            raise BatchError("batch column offsets out of order")
        return bytes(data[a:b])


    def has_properties(self) -> bool:
        return self.columns[2][0][self.count] > 0

    def client_ids(self) -> list[str] | None:
        """The messages' client-chosen ids (empty for one without), None when none has one."""
        if not self.columns[3][0][self.count]:
            return None
        return [self.field(3, i).decode() for i in range(self.count)]

    def messages(self, topic: str, protocol: str) -> list[Message]:
        """Every message of the batch as a Message to send (a door routes them one by one)."""
        out = []
        for i in range(self.count):
            k, p, mid = self.field(1, i), self.field(2, i), self.field(3, i)
            out.append(Message(topic, self.field(0, i), keys=tuple(k.decode().split("\0")) if k else (),
                               properties=decode_properties(p) if p else {}, message_id=mid.decode() or None,
                               born_timestamp_ms=self.born[i], protocol=protocol))
        return out


def unpack(body) -> Unpacked:
    return Unpacked(body)


def batch_record(topic: str, messages: Sequence[Message], compression: str = "none",
                 body: bytes | None = None, count: int = 0) -> Message:
    """The one message the store keeps for ``messages`` (or for an already packed ``body`` of
    ``count`` messages): flagged ``FLAG_BATCH``, its count and its messages' extra dispatch
    (LMQs of MQTT subscriptions and AMQP queues, each with the index of its message)."""
    first = messages[0] if messages else None
    targets, index = [], []
    for i, m in enumerate(messages):
        for t in m.extra_dispatch:
            targets.append(t)
            index.append(str(i))
    props = {P_BATCH_COUNT: str(count or len(messages))}
    if index:
        props[P_BATCH_DISPATCH] = ",".join(index)
    if any(m.message_id for m in messages):  # indexed by the store (record.P_BATCH_IDS)
        props[P_BATCH_IDS] = "\0".join(m.message_id or "" for m in messages)
    return Message(
        topic, body if body is not None else pack(messages, compression), tag=first.tag if first else None,
        properties=props, protocol=first.protocol if first else "http", flags=FLAG_BATCH,
        born_timestamp_ms=first.born_timestamp_ms if first else 0, born_host=first.born_host if first else "",
        extra_dispatch=tuple(targets), queue_id=first.queue_id if first else 0,
    )


_OWN = (P_BATCH_COUNT, P_BATCH_DISPATCH, P_BATCH_INDEX, P_BATCH_IDS)


def expand(m: StoredMessage, cache: dict | None = None) -> StoredMessage:
    """The one message of a batch record ``m`` names (``P_BATCH_INDEX``), as a message of its own:
    its body, keys, properties (over the record's), id, born time; queue offset as ``m``'s. A
    message not read from a batch is returned as it is. ``cache`` keeps unpacked batches across
    the messages of one read (they share a record)."""
    if not m.flags & FLAG_BATCH:
        return m
    props = m.properties
    i = int(props.get(P_BATCH_INDEX, "0"))
    key = (m.commitlog_offset, id(m.body))
    u = cache.get(key) if cache is not None else None
    if u is None:
        u = Unpacked(m.body)
        if cache is not None:
            cache[key] = u
    if not 0 <= i < u.count:
        raise BatchError(f"message {i} of a batch of {u.count}")
    out = StoredMessage.__new__(StoredMessage)
    for s in Message.__slots__ + StoredMessage.__slots__:
        setattr(out, s, getattr(m, s))
    out.flags = m.flags & ~FLAG_BATCH
    out.body = u.field(0, i)
    k = u.field(1, i)
    out.keys = tuple(k.decode().split("\0")) if k else ()
    p = u.field(2, i)
    own = {k2: v for k2, v in props.items() if k2 not in _OWN}
    if p:
        own.update(decode_properties(p))
    out.properties = own
    mid = u.field(3, i)
    out.message_id = mid.decode() if mid else m.message_id[:18] + "%016X" % (m.commitlog_offset + i)
    out.born_timestamp_ms = u.born[i]
    return out


def expand_all(messages: list) -> list:
    """:func:`expand` over a read's messages, each batch unpacked once."""
    if not any(m.flags & FLAG_BATCH for m in messages):
        return messages
    cache: dict = {}
    return [expand(m, cache) if m.flags & FLAG_BATCH else m for m in messages]


def expand_popped(popped: list) -> list:
    """:func:`expand` over popped messages (``PoppedMessage``: the message is its first field)."""
    if not any(pm[0].flags & FLAG_BATCH for pm in popped):
        return popped
    cache: dict = {}
    return [pm._replace(message=expand(pm[0], cache)) if pm[0].flags & FLAG_BATCH else pm for pm in popped]
