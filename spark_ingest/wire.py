"""The Arrow page format shared by the HTTP door (writer) and the Spark reader.

Why Arrow pages: Spark's Python data source passes ``pyarrow.RecordBatch``es
through untouched, so a page that already *is* a record batch in the table's
exact Arrow schema costs the executor nothing but an IPC read. The JSON page
(base64 bodies, a dict per message, then a Python loop per row on both ends)
measured 6-8k messages/s on the loaded 2-core CI machine; building the batch
on the server is what lets the source keep up with ``spark.read.json``.

Why a columnar *record* decoder here: even building the batch from decoded
``StoredMessage`` objects leaves the store's per-message Python decode as the
bottleneck (about 30 us a message on that machine). :func:`raw_to_batch`
decodes a whole page of raw commitlog records (``MessageStore.get_raw``) with
numpy and Arrow ``take`` over the record layout ``core_broker.record`` defines (its
struct formats are read from that module, and a unit test compares every
column with ``record.decode``). Anything unusual -- a link record, a CRC
mismatch when asked to verify, invalid UTF-8 -- makes it return None and the
door falls back to the ordinary decode (see :data:`VERIFY_CRC`).

This module needs pyarrow and numpy, not pyspark: the server imports it
lazily for ``?format=arrow`` and answers 406 when pyarrow is missing.
The schema here is pinned against ``to_arrow_schema`` of the Spark schema by
``tests/test_spark_reader.py``.
"""

from __future__ import annotations

import base64
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa

from gateway.naming import P_MQTT_TOPIC

MEDIA_TYPE = "application/vnd.apache.arrow.stream"
#: Whether Arrow pages check each record's CRC. Off: a Python-level call per record was 40% of
#: the page's cost (profiled), and RocketMQ's read path does not check CRCs either (only
#: recovery does). Each record's structure is still checked (magic, size equal to the
#: consume-queue entry's, field lengths adding up to it exactly, properties ending where they
#: should, valid UTF-8), and anything wrong sends the page down the decoding path, which checks
#: CRCs and leaves a corrupt record out (the reader then reports the gap).
VERIFY_CRC = False
RESERVED_PREFIX = "__"  # core_broker.system_topics.RESERVED_PREFIX: never shown to readers
MQTT_TOPIC_KEY = P_MQTT_TOPIC  # the promoted column has the property's name
CE_COLUMNS = ("ce_type", "ce_source", "ce_subject")

_TS = pa.timestamp("us", tz="UTC")
_STR_LIST = pa.list_(pa.field("element", pa.string()))
_STR_MAP = pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string()))

#: The table's Arrow schema, exactly what Spark's ``to_arrow_schema(schema, "UTC")`` gives for
#: ``spark_ingest.schema.SCHEMA_DDL`` (Spark rejects any difference at run time).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("queue_id", pa.int32()),
        pa.field("queue_offset", pa.int64()),
        pa.field("message_id", pa.string()),
        pa.field("keys", _STR_LIST),
        pa.field("tag", pa.string()),
        pa.field("message_group", pa.string()),
        pa.field("body", pa.binary()),
        pa.field("properties", _STR_MAP),
        pa.field("protocol", pa.string()),
        pa.field("born_timestamp", _TS),
        pa.field("store_timestamp", _TS),
        pa.field("mqtt_topic", pa.string()),
        pa.field("ce_type", pa.string()),
        pa.field("ce_source", pa.string()),
        pa.field("ce_subject", pa.string()),
    ]
)


def _ts(ms: Sequence[int] | np.ndarray) -> pa.Array:
    return pa.array(np.asarray(ms, dtype=np.int64) * 1000, type=pa.int64()).view(_TS)


def _map(props: Sequence[dict[str, str]]) -> pa.Array:
    lens = np.fromiter((len(p) for p in props), dtype=np.int32, count=len(props))
    offsets = np.zeros(len(props) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    keys = pa.array([k for p in props for k in p], type=pa.string())
    values = pa.array([v for p in props for v in p.values()], type=pa.string())
    return pa.MapArray.from_arrays(pa.array(offsets), keys, values, type=_STR_MAP)


def _sanitize(s: str | None) -> str | None:
    """Values decoded with surrogateescape (invalid UTF-8) cannot go into Arrow strings."""
    if s is None:
        return None
    try:
        s.encode()
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def columns_to_batch(
    topic: Sequence[str],
    queue_id: Sequence[int],
    queue_offset: Sequence[int],
    message_id: Sequence[str],
    keys: Sequence[Sequence[str]],
    tag: Sequence[str | None],
    group: Sequence[str | None],
    body: Sequence[bytes],
    props: Sequence[dict[str, str]],
    protocol: Sequence[str],
    born_ms: Sequence[int],
    store_ms: Sequence[int],
) -> pa.RecordBatch:
    """One record batch of the table schema from per-message Python values."""
    try:
        p = _map(props)
    except (UnicodeEncodeError, pa.ArrowInvalid):
        props = [{_sanitize(k): _sanitize(v) for k, v in d.items()} for d in props]  # type: ignore[misc]
        p = _map(props)
    arrays = [
        pa.array(topic, type=pa.string()),
        pa.array(queue_id, type=pa.int32()),
        pa.array(queue_offset, type=pa.int64()),
        pa.array(message_id, type=pa.string()),
        pa.array([list(k) for k in keys], type=_STR_LIST),
        pa.array(tag, type=pa.string()),
        pa.array(group, type=pa.string()),
        pa.array(body, type=pa.binary()),
        p,
        pa.array(protocol, type=pa.string()),
        _ts(born_ms),
        _ts(store_ms),
        pa.array([d.get(MQTT_TOPIC_KEY) for d in props], type=pa.string()),
        *(pa.array([d.get(c) for d in props], type=pa.string()) for c in CE_COLUMNS),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def messages_to_batch(msgs: Sequence[Any]) -> pa.RecordBatch:
    """Decoded store messages (``StoredMessage``, as the processor's pull answers) -> a batch."""
    props = [
        m.properties if not any(k.startswith(RESERVED_PREFIX) for k in m.properties)
        else {k: v for k, v in m.properties.items() if not k.startswith(RESERVED_PREFIX)}
        for m in msgs
    ]
    return columns_to_batch(
        [m.topic for m in msgs],
        [m.queue_id for m in msgs],
        [m.queue_offset for m in msgs],
        [m.message_id for m in msgs],
        [m.keys for m in msgs],
        [m.tag for m in msgs],
        [m.message_group for m in msgs],
        [bytes(m.body) for m in msgs],
        props,
        [m.protocol for m in msgs],
        [m.born_timestamp_ms for m in msgs],
        [m.store_timestamp_ms for m in msgs],
    )


def json_to_batch(msgs: Sequence[dict]) -> pa.RecordBatch:
    """The HTTP door's JSON page (``message_json`` dicts) -> a batch (the fallback format)."""
    b64 = base64.b64decode
    return columns_to_batch(
        [m["topic"] for m in msgs],
        [m["queue_id"] for m in msgs],
        [m["queue_offset"] for m in msgs],
        [m["message_id"] for m in msgs],
        [m.get("keys") or () for m in msgs],
        [m.get("tag") for m in msgs],
        [m.get("message_group") for m in msgs],
        [b64(m.get("body_base64") or "") for m in msgs],
        [m.get("properties") or {} for m in msgs],
        [m.get("protocol") for m in msgs],
        [m.get("born_timestamp") or 0 for m in msgs],
        [m.get("store_timestamp") or 0 for m in msgs],
    )


# ------------------------------------------------------------------------------ columnar record decode


def _layout() -> tuple[np.dtype, np.dtype, int, int, int]:
    """numpy dtypes of a record header and a consume-queue entry, from core_broker's struct formats."""
    from core_broker import consume_queue, record

    codes = {"I": "<u4", "i": "<i4", "q": "<i8", "H": "<u2"}
    for f in (record.PREFIX.format, record.FIXED.format, consume_queue.ENTRY.format):
        assert f.startswith("<") and set(f[1:]) <= set(codes), f
    hdt = np.dtype([(f"f{i}", codes[c]) for i, c in enumerate(record.PREFIX.format[1:] + record.FIXED.format[1:])])
    edt = np.dtype([(f"e{i}", codes[c]) for i, c in enumerate(consume_queue.ENTRY.format[1:])])
    assert hdt.itemsize == record.HEADER_SIZE and edt.itemsize == consume_queue.ENTRY.size
    return hdt, edt, record.MAGIC_MESSAGE, record.FLAG_LINK, record.HEADER_SIZE


_LAYOUT: tuple[np.dtype, np.dtype, int, int, int] | None = None
# Field indexes in the header dtype: prefix (size, magic, crc), then FIXED's 20 fields.
_SIZE, _MAGIC, _CRC, _FLAGS = 0, 1, 2, 3
_BORN, _STORE = 7, 8
_LEN0 = 13  # len(topic), born_host, message_id, tag, group, protocol, keys, props, dispatch, body
_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)


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


def raw_to_batch(topic: str, queue_id: int, first_offset: int, entries: bytes, span: bytes | memoryview, span_base: int,
                 id_prefix: str, verify: bool = True) -> pa.RecordBatch | None:
    """Decode a page of ``MessageStore.get_raw`` into a batch, all messages at once; None: slow path.

    Same result as ``record.decode`` + the processor's pull (topic and queue set to the queue
    read, reserved properties removed, a missing message id derived from the commitlog
    offset). None for anything unusual: a link record (its body lives elsewhere), a bad magic,
    size or CRC, a record outside the span, invalid UTF-8.
    """
    global _LAYOUT
    if _LAYOUT is None:
        _LAYOUT = _layout()
    hdt, edt, magic, flag_link, hsize = _LAYOUT
    ent = np.frombuffer(entries, dtype=edt)
    n = len(ent)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    buf = np.frombuffer(span, dtype=np.uint8)
    sb = pa.py_buffer(span)
    phys = ent["e0"]
    rst = phys - span_base
    rlen = ent["e1"].astype(np.int64)
    if (rst < 0).any() or (rst + rlen > len(buf)).any() or (rlen < hsize).any():
        return None
    heads = _ranges(sb, rst, np.full(n, hsize, dtype=np.int64))
    if heads is None:
        return None
    hdr = np.frombuffer(heads.buffers()[2], dtype=hdt, count=n)
    if (hdr[f"f{_MAGIC}"] != magic).any() or (hdr[f"f{_SIZE}"] != rlen).any() or (hdr[f"f{_FLAGS}"] & flag_link).any():
        return None
    if verify:
        from crc32c import crc32c

        mv = memoryview(span)
        crcs = np.fromiter((crc32c(mv[s + 12 : s + ln]) for s, ln in zip(rst.tolist(), rlen.tolist())),
                           dtype=np.uint32, count=n)
        if (crcs != hdr[f"f{_CRC}"]).any():
            return None
    lens = np.stack([hdr[f"f{_LEN0 + j}"].astype(np.int64) for j in range(10)], axis=1)  # n x 10
    starts = np.empty_like(lens)
    starts[:, 0] = rst + hsize
    np.cumsum(lens[:, :-1], axis=1, out=starts[:, 1:])
    starts[:, 1:] += starts[:, :1]
    if (starts[:, 9] + lens[:, 9] != rst + rlen).any():
        return None
    MID, TAG, GROUP, PROTO, KEYS, PROPS, BODY = 2, 3, 4, 5, 6, 7, 9

    # message id: the stored one, or the store's prefix + the commitlog offset in hex
    mids = _ranges(sb, starts[:, MID], lens[:, MID], pa.string())
    if mids is None:
        return None
    if not lens[:, MID].all():
        ph = phys.astype(np.uint64)
        digits = _HEX[((ph[:, None] >> np.arange(60, -4, -4, dtype=np.uint64)) & np.uint64(15)).astype(np.intp)]
        pre = np.frombuffer(id_prefix.encode(), dtype=np.uint8)
        gen = np.concatenate([np.broadcast_to(pre, (n, len(pre))), digits], axis=1).reshape(-1)
        w = len(pre) + 16
        gen_arr = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * w),
                                                         pa.py_buffer(np.ascontiguousarray(gen))])
        import pyarrow.compute as pc

        mids = pc.if_else(pa.array(lens[:, MID] > 0), mids, gen_arr)

    # keys: '\0'-joined; [] when empty
    if lens[:, KEYS].any():
        ks = _ranges(sb, starts[:, KEYS], lens[:, KEYS], pa.string())
        if ks is None:
            return None
        ks = ks.to_pylist()
        keys = pa.array([k.split("\0") if k else [] for k in ks], type=_STR_LIST)
    else:
        keys = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string()),
                                        type=_STR_LIST)

    # properties: (u16 klen, u32 vlen, key, value)*, decoded for every message at once, one
    # property per message per round (rounds = the most properties on one message)
    cur = starts[:, PROPS].copy()
    end = cur + lens[:, PROPS]
    owners, kst, kln, vst, vln = [], [], [], [], []
    active = np.flatnonzero(cur < end)
    six = np.arange(6, dtype=np.int64)
    while len(active):
        c = cur[active]
        b6 = buf[c[:, None] + six].astype(np.int64)
        kl = b6[:, 0] | (b6[:, 1] << 8)
        vl = b6[:, 2] | (b6[:, 3] << 8) | (b6[:, 4] << 16) | (b6[:, 5] << 24)
        owners.append(active)
        kst.append(c + 6)
        kln.append(kl)
        vst.append(c + 6 + kl)
        vln.append(vl)
        nxt = c + 6 + kl + vl
        if (nxt > end[active]).any():
            return None
        cur[active] = nxt
        active = active[nxt < end[active]]
    if owners:
        owner = np.concatenate(owners)
        order = np.argsort(owner, kind="stable")
        owner = owner[order]
        ks_, kl_, vs_, vl_ = (np.concatenate(a)[order] for a in (kst, kln, vst, vln))
        two = np.flatnonzero(kl_ >= 2)  # drop reserved keys ("__...")
        if len(two):
            res = two[(buf[ks_[two]] == 95) & (buf[ks_[two] + 1] == 95)]
            if len(res):
                keep = np.ones(len(owner), dtype=bool)
                keep[res] = False
                owner, ks_, kl_, vs_, vl_ = owner[keep], ks_[keep], kl_[keep], vs_[keep], vl_[keep]
    else:
        owner = ks_ = kl_ = vs_ = vl_ = np.zeros(0, dtype=np.int64)
    moff = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(owner, minlength=n), out=moff[1:])
    pkeys = _ranges(sb, ks_, kl_, pa.string())
    pvals = _ranges(sb, vs_, vl_, pa.string())
    tag = _ranges(sb, starts[:, TAG], lens[:, TAG], pa.string(), present=lens[:, TAG] > 0)
    group = _ranges(sb, starts[:, GROUP], lens[:, GROUP], pa.string(), present=lens[:, GROUP] > 0)
    proto = _ranges(sb, starts[:, PROTO], lens[:, PROTO], pa.string())
    body = _ranges(sb, starts[:, BODY], lens[:, BODY])
    if pkeys is None or pvals is None or tag is None or group is None or proto is None or body is None:
        return None
    props = pa.MapArray.from_arrays(pa.array(moff), pkeys, pvals, type=_STR_MAP)
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
        props,
        proto,
        _ts(hdr[f"f{_BORN}"]),
        _ts(hdr[f"f{_STORE}"]),
        *promoted,
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


# ------------------------------------------------------------------------------ IPC


def to_ipc(batches: Iterable[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, ARROW_SCHEMA) as w:
        for b in batches:
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> list[pa.RecordBatch]:
    return list(pa.ipc.open_stream(pa.py_buffer(data)))


async def pull_page(processor: Any, ctx: Any, topic: str, queue_id: int, offset: int, max_count: int,
                    filter_expression: Any = None, wait_ms: int = 0) -> tuple[bytes, int, int, int]:
    """The HTTP door's ``?format=arrow`` pull: (Arrow IPC stream, next_offset, min_offset, max_offset).

    Unfiltered reads of an in-process broker decode raw records in bulk; anything else (filters,
    a remote broker, link records, long polls at the end of the queue) goes through
    ``processor.pull`` and builds the batch from decoded messages.
    """
    if filter_expression is None and hasattr(processor, "pull_raw"):
        raw = await processor.pull_raw(ctx, topic, queue_id, offset, max_count)
        if raw is not None:
            entries, span, base, prefix, lo, hi = raw
            batch = raw_to_batch(topic, queue_id, offset, entries, span, base, prefix, verify=VERIFY_CRC)
            if batch is not None:
                return to_ipc([batch]), offset + batch.num_rows, lo, hi
    r = await processor.pull(ctx, topic, queue_id, offset, max_count, filter_expression, wait_ms)
    return to_ipc([messages_to_batch(r.messages)]), r.next_offset, r.min_offset, r.max_offset

