"""Arrow pages: a pull answered as one Arrow IPC stream in the Spark table's schema.

Why Arrow pages: Spark's Python data source passes ``pyarrow.RecordBatch``es
through untouched, so a page that already *is* a record batch in the table's
exact Arrow schema (:data:`gateway.arrow_schema.ARROW_SCHEMA`) costs the
executor nothing but an IPC read. The JSON page (base64 bodies, a dict per
message, then a Python loop per row on both ends) measured 6-8k messages/s on
the loaded 2-core CI machine; building the batch in the gateway is what lets
the Spark source keep up with ``spark.read.json``.

Why a columnar *record* decoder here: even building the batch from decoded
``StoredMessage`` objects leaves the store's per-message Python decode as the
bottleneck (about 30 us a message on that machine). :func:`raw_to_batch`
decodes a whole page of raw commitlog records (the processor's ``pull_raw``,
the store's ``get_raw``) with numpy and Arrow ``take``, placing each field by
the record layout the store publishes (``core_broker/record_layout.py``); a
unit test compares every column with ``record.decode``. Anything unusual -- a
link record, a CRC mismatch when asked to verify, invalid UTF-8 -- makes it
return None and :func:`pull_page` falls back to the processor's ordinary pull
(see :data:`VERIFY_CRC`).

This module needs pyarrow and numpy (the ``spark`` extra): the processor
imports it lazily for ``MessagingAPI.pull_arrow``, so doors and the processor
run without them and only Arrow pages are refused.
"""

from __future__ import annotations

import struct
from typing import Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core_broker.model import FilterExpression, GetResult, StoredMessage
from core_broker.record_layout import ENTRY, HEADER, LAYOUT, VARIABLE
from core_broker.system_topics import RESERVED_PREFIX, public_properties

from .api import ArrowPage
from .arrow_schema import (
    ARROW_SCHEMA,
    CE_COLUMNS,
    MEDIA_TYPE,
    MQTT_TOPIC_KEY,
    STR_LIST,
    STR_MAP,
    columns_to_batch,
    timestamps,
)
from .broker_client import RawPage
from .context import RequestContext

__all__ = ["VERIFY_CRC", "messages_to_batch", "pull_page", "raw_to_batch", "to_ipc"]

#: Whether Arrow pages check each record's CRC. Off: a Python-level call per record was 40% of
#: the page's cost (profiled), and RocketMQ's read path does not check CRCs either (only
#: recovery does). Each record's structure is still checked (magic, size equal to the
#: consume-queue entry's, field lengths adding up to it exactly, properties ending where they
#: should, valid UTF-8), and anything wrong sends the page down the decoding path, which checks
#: CRCs and leaves a corrupt record out (the reader then reports the gap).
VERIFY_CRC = False


def messages_to_batch(msgs: Sequence[StoredMessage]) -> pa.RecordBatch:
    """Decoded store messages (as the processor's pull answers them) -> a batch, reserved properties left out."""
    return columns_to_batch(
        [m.topic for m in msgs],
        [m.queue_id for m in msgs],
        [m.queue_offset for m in msgs],
        [m.message_id for m in msgs],
        [m.keys for m in msgs],
        [m.tag for m in msgs],
        [m.message_group for m in msgs],
        [bytes(m.body) for m in msgs],
        [public_properties(m.properties) for m in msgs],
        [m.protocol for m in msgs],
        [m.born_timestamp_ms for m in msgs],
        [m.store_timestamp_ms for m in msgs],
    )


# ------------------------------------------------------------------------------ columnar record decode

_NUMPY_OF_CODE = {"I": "<u4", "i": "<i4", "q": "<i8", "H": "<u2"}
#: numpy views of a record header and a consume-queue entry, fields named as the store names them.
_HEADER_DTYPE = np.dtype([(f.name, _NUMPY_OF_CODE[f.code]) for f in HEADER])
_ENTRY_DTYPE = np.dtype([(f.name, _NUMPY_OF_CODE[f.code]) for f in ENTRY])
_LENGTHS = [f"len_{name}" for name in VARIABLE]
_MID, _TAG, _GROUP, _PROTO, _KEYS, _PROPS, _BODY = (
    VARIABLE.index(name) for name in ("message_id", "tag", "message_group", "protocol", "keys", "properties", "body")
)
#: A property's (key length, value length) prefix: the byte widths of the two little-endian integers.
_KLEN, _VLEN = (struct.calcsize("<" + c) for c in LAYOUT.property_entry.lstrip("<"))
_PROP_HEAD = _KLEN + _VLEN
_RESERVED = np.frombuffer(RESERVED_PREFIX.encode(), dtype=np.uint8)
_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_HEX_SHIFTS = np.arange(4 * (LAYOUT.message_id_hex_digits - 1), -4, -4, dtype=np.uint64)
_EMPTY = pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)


def _ranges(span: pa.Buffer, starts: np.ndarray, lens: np.ndarray, typ: pa.DataType = pa.binary(),
            present: np.ndarray | None = None) -> pa.Array | None:
    """``span[s:s+l]`` for each (s, l) as an Arrow array (null where ``present`` is False).

    The ranges must be in increasing, non-overlapping order (one field of consecutive records
    of a queue, or their properties in order). They become every other element of a zero-copy
    binary array over the span ([gap, field, gap, field, ...]) and one ``take`` copies them out
    in C++: three times faster than a numpy gather with a per-byte index. None if out of order.
    """
    n = len(starts)
    off = np.empty(2 * n + 2, dtype=np.int64)
    off[0] = 0
    off[1:-1:2] = starts
    off[2:-1:2] = starts + lens
    off[-1] = span.size
    if n and ((off[1:] < off[:-1]).any() or off[-1] >= 2**31):
        return None
    whole = pa.Array.from_buffers(pa.binary(), 2 * n + 1, [None, pa.py_buffer(off.astype(np.int32)), span])
    idx = np.arange(1, 2 * n, 2, dtype=np.int32)
    out = whole.take(pa.array(idx, mask=None if present is None else ~present))
    return out if typ == pa.binary() else out.view(typ)


def _little_endian(b: np.ndarray, first: int, width: int) -> np.ndarray:
    """The unsigned little-endian integers of ``width`` bytes at column ``first`` of byte rows ``b``."""
    v = b[:, first]
    for j in range(1, width):
        v = v | (b[:, first + j] << (8 * j))
    return v


def _promoted(buf: np.ndarray, n: int, owner: np.ndarray, kst: np.ndarray, kln: np.ndarray, pvals: pa.Array,
              name: str) -> pa.Array:
    """The value of property ``name`` per message (null where absent), taken from the flat values."""
    key = np.frombuffer(name.encode(), dtype=np.uint8)
    cand = np.flatnonzero(kln == len(key))
    if len(cand):
        cand = cand[(buf[kst[cand][:, None] + np.arange(len(key))] == key).all(axis=1)]
    idx = np.zeros(n, dtype=np.int64)
    present = np.zeros(n, dtype=bool)
    idx[owner[cand]] = cand
    present[owner[cand]] = True
    if not present.any():
        return pa.nulls(n, pa.string())
    return pvals.take(pa.array(idx, mask=~present))


def _message_ids(sb: pa.Buffer, starts: np.ndarray, lens: np.ndarray, phys: np.ndarray,
                 id_prefix: str) -> pa.Array | None:
    """The stored message id, or the store's: its prefix + the record's commitlog offset in hex."""
    n = len(phys)
    mids = _ranges(sb, starts[:, _MID], lens[:, _MID], pa.string())
    if mids is None or lens[:, _MID].all():
        return mids
    ph = phys.astype(np.uint64)
    digits = _HEX[((ph[:, None] >> _HEX_SHIFTS) & np.uint64(15)).astype(np.intp)]
    pre = np.frombuffer(id_prefix.encode(), dtype=np.uint8)
    gen = np.concatenate([np.broadcast_to(pre, (n, len(pre))), digits], axis=1).reshape(-1)
    w = len(pre) + LAYOUT.message_id_hex_digits
    gen_arr = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * w),
                                                     pa.py_buffer(np.ascontiguousarray(gen))])
    return pc.if_else(pa.array(lens[:, _MID] > 0), mids, gen_arr)


def _keys(sb: pa.Buffer, starts: np.ndarray, lens: np.ndarray) -> pa.Array | None:
    """Each message's keys (separator-joined in the record) as a list; [] when it has none."""
    n = len(starts)
    if not lens[:, _KEYS].any():
        return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string()),
                                        type=STR_LIST)
    ks = _ranges(sb, starts[:, _KEYS], lens[:, _KEYS], pa.string())
    if ks is None:
        return None
    sep = LAYOUT.keys_separator
    return pa.array([k.split(sep) if k else [] for k in ks.to_pylist()], type=STR_LIST)


def _properties(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """Every property of every message, reserved ones left out, as flat arrays sorted by message:
    (owner message, key start, key length, value start, value length); None if a block is malformed.

    A block is (klen, vlen, key, value)*; it is decoded for every message at once, one property
    per message per round (rounds = the most properties on one message).
    """
    cur = starts[:, _PROPS].copy()
    end = cur + lens[:, _PROPS]
    owners, kst, kln, vst, vln = [], [], [], [], []
    active = np.flatnonzero(cur < end)
    head = np.arange(_PROP_HEAD, dtype=np.int64)
    while len(active):
        c = cur[active]
        b = buf[c[:, None] + head].astype(np.int64)
        kl = _little_endian(b, 0, _KLEN)
        vl = _little_endian(b, _KLEN, _VLEN)
        owners.append(active)
        kst.append(c + _PROP_HEAD)
        kln.append(kl)
        vst.append(c + _PROP_HEAD + kl)
        vln.append(vl)
        nxt = c + _PROP_HEAD + kl + vl
        if (nxt > end[active]).any():
            return None
        cur[active] = nxt
        active = active[nxt < end[active]]
    if not owners:
        return tuple(np.zeros(0, dtype=np.int64) for _ in range(5))
    owner = np.concatenate(owners)
    order = np.argsort(owner, kind="stable")
    flat = [owner[order], *(np.concatenate(a)[order] for a in (kst, kln, vst, vln))]
    ks_, kl_ = flat[1], flat[2]
    cand = np.flatnonzero(kl_ >= len(_RESERVED))  # drop reserved keys (RESERVED_PREFIX)
    if len(cand):
        at = ks_[cand]
        hit = buf[at] == _RESERVED[0]
        for j in range(1, len(_RESERVED)):  # byte by byte: faster than a 2-D gather and .all(axis=1)
            hit &= buf[at + j] == _RESERVED[j]
        res = cand[hit]
        if len(res):
            keep = np.ones(len(flat[0]), dtype=bool)
            keep[res] = False
            flat = [a[keep] for a in flat]
    return tuple(flat)


def raw_to_batch(topic: str, queue_id: int, first_offset: int, entries: bytes, span: bytes | memoryview,
                 span_base: int, id_prefix: str, verify: bool = True) -> pa.RecordBatch | None:
    """Decode a page of ``MessageStore.get_raw`` into a batch, all messages at once; None: slow path.

    Same result as ``record.decode`` + the processor's pull (topic and queue set to the queue
    read, reserved properties removed, a missing message id derived from the commitlog
    offset). None for anything unusual: a link record (its body lives elsewhere), a bad magic,
    size or CRC, a record outside the span, invalid UTF-8.
    """
    ent = np.frombuffer(entries, dtype=_ENTRY_DTYPE)
    n = len(ent)
    if n == 0:
        return _EMPTY
    hsize = LAYOUT.header_size
    buf = np.frombuffer(span, dtype=np.uint8)
    sb = pa.py_buffer(span)
    phys = ent["commitlog_offset"]
    rst = phys - span_base
    rlen = ent["size"].astype(np.int64)
    if (rst < 0).any() or (rst + rlen > len(buf)).any() or (rlen < hsize).any():
        return None
    heads = _ranges(sb, rst, np.full(n, hsize, dtype=np.int64))
    if heads is None:
        return None
    hdr = np.frombuffer(heads.buffers()[2], dtype=_HEADER_DTYPE, count=n)
    if (hdr["magic"] != LAYOUT.magic).any() or (hdr["size"] != rlen).any() or (hdr["flags"] & LAYOUT.flag_link).any():
        return None
    if verify:
        from crc32c import crc32c

        mv = memoryview(span)
        c0 = LAYOUT.crc_start
        crcs = np.fromiter((crc32c(mv[s + c0 : s + ln]) for s, ln in zip(rst.tolist(), rlen.tolist())),
                           dtype=np.uint32, count=n)
        if (crcs != hdr["crc"]).any():
            return None
    lens = np.stack([hdr[name].astype(np.int64) for name in _LENGTHS], axis=1)  # n x len(VARIABLE)
    starts = np.empty_like(lens)
    starts[:, 0] = rst + hsize
    np.cumsum(lens[:, :-1], axis=1, out=starts[:, 1:])
    starts[:, 1:] += starts[:, :1]
    if (starts[:, -1] + lens[:, -1] != rst + rlen).any():
        return None
    mids = _message_ids(sb, starts, lens, phys, id_prefix)
    keys = _keys(sb, starts, lens)
    props = _properties(buf, starts, lens)
    if mids is None or keys is None or props is None:
        return None
    owner, ks_, kl_, vs_, vl_ = props
    moff = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(owner, minlength=n), out=moff[1:])
    pkeys = _ranges(sb, ks_, kl_, pa.string())
    pvals = _ranges(sb, vs_, vl_, pa.string())
    tag = _ranges(sb, starts[:, _TAG], lens[:, _TAG], pa.string(), present=lens[:, _TAG] > 0)
    group = _ranges(sb, starts[:, _GROUP], lens[:, _GROUP], pa.string(), present=lens[:, _GROUP] > 0)
    proto = _ranges(sb, starts[:, _PROTO], lens[:, _PROTO], pa.string())
    body = _ranges(sb, starts[:, _BODY], lens[:, _BODY])
    if pkeys is None or pvals is None or tag is None or group is None or proto is None or body is None:
        return None
    pmap = pa.MapArray.from_arrays(pa.array(moff), pkeys, pvals, type=STR_MAP)
    promoted = [_promoted(buf, n, owner, ks_, kl_, pvals, k) for k in (MQTT_TOPIC_KEY, *CE_COLUMNS)]
    try:
        for a in (mids, tag, group, proto, pkeys, pvals):
            a.validate(full=True)  # invalid UTF-8 (a surrogateescape'd value): the slow path replaces it
    except pa.ArrowInvalid:
        return None
    arrays = [
        pa.array([topic] * n, type=pa.string()),
        pa.array(np.full(n, queue_id, dtype=np.int32)),
        pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)),
        mids,
        keys,
        tag,
        group,
        body,
        pmap,
        proto,
        timestamps(hdr["born_ts"]),
        timestamps(hdr["store_ts"]),
        *promoted,
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


# ------------------------------------------------------------------------------ pages


def to_ipc(batches: Sequence[pa.RecordBatch]) -> memoryview:
    """Batches of the table schema as one Arrow IPC stream (what ``spark_ingest.wire.from_ipc`` reads).

    Written twice: once to count its bytes, once into a buffer of exactly that size, which is
    served as it is. Half the CPU of a growing output stream plus a copy to ``bytes`` (a page is
    megabytes: the stream reallocates as it grows)."""
    mock = pa.MockOutputStream()
    with pa.ipc.new_stream(mock, ARROW_SCHEMA) as w:
        for b in batches:
            w.write_batch(b)
    buf = pa.allocate_buffer(mock.size())
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(buf), ARROW_SCHEMA) as w:
        for b in batches:
            w.write_batch(b)
    return memoryview(buf)


class Reads(Protocol):
    """What a page is read with: the processor's pull and its undecoded twin."""

    async def pull(
        self, ctx: RequestContext, topic: str, queue_id: int, offset: int, max_count: int = 32,
        filter_expression: FilterExpression | None = None, wait_ms: int = 0,
    ) -> GetResult: ...

    async def pull_raw(
        self, ctx: RequestContext, topic: str, queue_id: int, offset: int, max_count: int
    ) -> RawPage | None: ...


async def pull_page(reader: Reads, ctx: RequestContext, topic: str, queue_id: int, offset: int, max_count: int,
                    filter_expression: FilterExpression | None = None, wait_ms: int = 0) -> ArrowPage:
    """A pull as an Arrow page (``MessagingAPI.pull_arrow``).

    Unfiltered reads of an in-process broker decode raw records in bulk; anything else (filters,
    a remote broker, link records, long polls at the end of the queue) goes through
    ``reader.pull`` and builds the batch from decoded messages.
    """
    if filter_expression is None and hasattr(reader, "pull_batches"):  # a batch topic: whole records
        whole = await reader.pull_batches(ctx, topic, queue_id, offset, max_count)
        if whole is not None:
            from .batch_arrow import page_rows

            rows, end = page_rows(topic, queue_id, offset, max_count, whole[0])
            return ArrowPage(to_ipc(rows), MEDIA_TYPE, end, whole[1], whole[2])
    if filter_expression is None:
        raw = await reader.pull_raw(ctx, topic, queue_id, offset, max_count)
        if raw is not None:
            entries, span, base, prefix, lo, hi = raw
            batch = raw_to_batch(topic, queue_id, offset, entries, span, base, prefix, verify=VERIFY_CRC)
            if batch is not None:
                return ArrowPage(to_ipc([batch]), MEDIA_TYPE, offset + batch.num_rows, lo, hi)
    r = await reader.pull(ctx, topic, queue_id, offset, max_count, filter_expression, wait_ms)
    return ArrowPage(to_ipc([messages_to_batch(r.messages)]), MEDIA_TYPE, r.next_offset, r.min_offset, r.max_offset)
