"""The Arrow page format shared by the HTTP door (writer) and the Spark reader.

Why Arrow pages: Spark's Python data source passes ``pyarrow.RecordBatch``es
through untouched, so a page that already *is* a record batch in the table's
exact Arrow schema costs the executor nothing but an IPC read. The JSON page
(base64 bodies, a dict per message, then a Python loop per row on both ends)
measured 6-8k messages/s on the loaded 2-core CI machine; building the batch
on the server is what lets the source keep up with ``spark.read.json``.

Why a columnar *record* decoder here: even building the batch from decoded
``StoredMessage`` objects leaves the store's per-message Python decode as the
bottleneck (about 30 us a message on that machine). :func:`records_to_batch`
decodes a whole page of raw commitlog records (``MessageStore.get_raw``) with
numpy gathers over the record layout that ``core_broker.record`` defines (its
struct formats are read from that module, and a unit test compares every
column with ``record.decode``). Anything unusual -- a link record, a CRC
mismatch, invalid UTF-8 -- makes it return None and the door falls back to
the ordinary decode, so the fast path never changes what a reader sees.

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

MEDIA_TYPE = "application/vnd.apache.arrow.stream"
RESERVED_PREFIX = "__"  # core_broker.system_topics.RESERVED_PREFIX: never shown to readers
MQTT_TOPIC_KEY = "mqtt_topic"
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


def _record_layout() -> tuple[np.dtype, int, int, int]:
    """numpy dtype of a record header, read from core_broker.record's struct formats."""
    from core_broker import record

    assert record.PREFIX.format.startswith("<") and record.FIXED.format.startswith("<")
    codes = {"I": "<u4", "i": "<i4", "q": "<i8", "H": "<u2"}
    fmt = record.PREFIX.format[1:] + record.FIXED.format[1:]
    dt = np.dtype([(f"f{i}", codes[c]) for i, c in enumerate(fmt)])
    assert dt.itemsize == record.HEADER_SIZE
    return dt, record.MAGIC_MESSAGE, record.FLAG_LINK, record.HEADER_SIZE


_LAYOUT: tuple[np.dtype, int, int, int] | None = None
# Field indexes in the header dtype: prefix (size, magic, crc), then FIXED's 20 fields.
_SIZE, _MAGIC, _CRC, _FLAGS = 0, 1, 2, 3
_BORN, _STORE = 7, 8
_LEN0 = 13  # len(topic), born_host, message_id, tag, group, protocol, keys, props, dispatch, body
_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)


def _gather(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``buf[s:s+l]`` for every (s, l): (data, int32 offsets) of an Arrow binary column."""
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return np.zeros(0, dtype=np.uint8), offsets.astype(np.int32)
    idx = np.arange(total, dtype=np.int64) + np.repeat(starts - offsets[:-1], lens)
    return buf[idx], offsets.astype(np.int32)


def _strings(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray, typ: pa.DataType = pa.string(),
             null_if_empty: bool = False) -> pa.Array:
    data, offsets = _gather(buf, starts, lens)
    validity = None
    nulls = 0
    if null_if_empty:
        present = lens > 0
        nulls = int(len(lens) - present.sum())
        if nulls:
            validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(typ, len(lens), [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)


def _promoted(buf: np.ndarray, n: int, owner: np.ndarray, kst: np.ndarray, kln: np.ndarray, vst: np.ndarray,
              vln: np.ndarray, name: str) -> pa.Array:
    """The value of property ``name`` per message (null where absent), from the flat entries."""
    key = np.frombuffer(name.encode(), dtype=np.uint8)
    cand = np.flatnonzero(kln == len(key))
    if len(cand):
        eq = (buf[kst[cand][:, None] + np.arange(len(key))] == key).all(axis=1)
        cand = cand[eq]
    starts = np.zeros(n, dtype=np.int64)
    lens = np.zeros(n, dtype=np.int64)
    present = np.zeros(n, dtype=bool)
    starts[owner[cand]] = vst[cand]
    lens[owner[cand]] = vln[cand]
    present[owner[cand]] = True
    data, offsets = _gather(buf, starts, lens)
    nulls = int(n - present.sum())
    validity = pa.py_buffer(np.packbits(present, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(pa.string(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)


def records_to_batch(topic: str, queue_id: int, first_offset: int, records: Sequence[bytes],
                     phys: Sequence[int], id_prefix: str, verify: bool = True) -> pa.RecordBatch | None:
    """Decode consecutive raw commitlog records of one queue into a batch; None: use the slow path.

    Same result as ``record.decode`` + the processor's pull (topic and queue set to the queue
    read, reserved properties removed, a missing message id derived from the commitlog offset).
    """
    global _LAYOUT
    if _LAYOUT is None:
        _LAYOUT = _record_layout()
    hdt, magic, flag_link, hsize = _LAYOUT
    n = len(records)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    raw = b"".join(records)
    buf = np.frombuffer(raw, dtype=np.uint8)
    rlen = np.array(list(map(len, records)), dtype=np.int64)
    rst = np.zeros(n, dtype=np.int64)
    np.cumsum(rlen[:-1], out=rst[1:])
    if (rlen < hsize).any():
        return None
    hdr = np.frombuffer(b"".join([r[:hsize] for r in records]), dtype=hdt)
    if (hdr[f"f{_MAGIC}"] != magic).any() or (hdr[f"f{_SIZE}"] != rlen).any() or (hdr[f"f{_FLAGS}"] & flag_link).any():
        return None
    if verify:
        from crc32c import crc32c

        crcs = np.array([crc32c(memoryview(r)[12:]) for r in records], dtype=np.uint32)
        if (crcs != hdr[f"f{_CRC}"]).any():
            return None
    lens = np.stack([hdr[f"f{_LEN0 + j}"].astype(np.int64) for j in range(10)], axis=1)  # n x 10
    starts = np.empty_like(lens)
    starts[:, 0] = rst + hsize
    np.cumsum(lens[:, :-1], axis=1, out=starts[:, 1:])
    starts[:, 1:] += starts[:, :1]
    if (starts[:, 9] + lens[:, 9] != rst + rlen).any():
        return None
    TOPIC, HOST, MID, TAG, GROUP, PROTO, KEYS, PROPS, DISP, BODY = range(10)  # noqa: F841

    # message id: the stored one, or the store's prefix + the commitlog offset in hex
    mids = _strings(buf, starts[:, MID], lens[:, MID])
    if (lens[:, MID] == 0).any():
        ph = np.asarray(phys, dtype=np.uint64)
        shifts = np.arange(60, -4, -4, dtype=np.uint64)
        digits = _HEX[((ph[:, None] >> shifts) & np.uint64(15)).astype(np.intp)]
        pre = np.frombuffer(id_prefix.encode(), dtype=np.uint8)
        gen = np.concatenate([np.broadcast_to(pre, (n, len(pre))), digits], axis=1).reshape(-1)
        w = len(pre) + 16
        gen_arr = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * w),
                                                         pa.py_buffer(np.ascontiguousarray(gen))])
        import pyarrow.compute as pc

        mids = pc.if_else(pa.array(lens[:, MID] > 0), mids, gen_arr)

    # keys: '\0'-joined; [] when empty
    if lens[:, KEYS].any():
        ks = _strings(buf, starts[:, KEYS], lens[:, KEYS]).to_pylist()
        keys = pa.array([k.split("\0") if k else [] for k in ks], type=_STR_LIST)
    else:
        keys = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string()),
                                        type=_STR_LIST)

    # properties: (u16 klen, u32 vlen, key, value)*, decoded for all messages at once, one
    # entry per message per round (rounds = most properties on one message)
    cur = starts[:, PROPS].copy()
    end = cur + lens[:, PROPS]
    owners, kst, kln, vst, vln = [], [], [], [], []
    active = np.flatnonzero(cur < end)
    while len(active):
        c = cur[active]
        b6 = buf[c[:, None] + np.arange(6)].astype(np.int64)
        kl = b6[:, 0] | (b6[:, 1] << 8)
        vl = b6[:, 2] | (b6[:, 3] << 8) | (b6[:, 4] << 16) | (b6[:, 5] << 24)
        owners.append(active)
        kst.append(c + 6)
        kln.append(kl)
        vst.append(c + 6 + kl)
        vln.append(vl)
        cur[active] = c + 6 + kl + vl
        if (cur[active] > end[active]).any():
            return None
        active = active[cur[active] < end[active]]
    if owners:
        owner = np.concatenate(owners)
        order = np.argsort(owner, kind="stable")
        owner = owner[order]
        ks_, kl_, vs_, vl_ = (np.concatenate(a)[order] for a in (kst, kln, vst, vln))
        # drop reserved keys ("__...")
        res = np.zeros(len(owner), dtype=bool)
        two = kl_ >= 2
        if two.any():
            idx = np.flatnonzero(two)
            res[idx] = (buf[ks_[idx]] == 95) & (buf[ks_[idx] + 1] == 95)
        if res.any():
            keep = ~res
            owner, ks_, kl_, vs_, vl_ = owner[keep], ks_[keep], kl_[keep], vs_[keep], vl_[keep]
    else:
        owner = ks_ = kl_ = vs_ = vl_ = np.zeros(0, dtype=np.int64)
    moff = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(owner, minlength=n), out=moff[1:])
    pkeys = _strings(buf, ks_, kl_)
    pvals = _strings(buf, vs_, vl_)
    props = pa.MapArray.from_arrays(pa.array(moff), pkeys, pvals, type=_STR_MAP)

    strings = [mids, _strings(buf, starts[:, TAG], lens[:, TAG], null_if_empty=True),
               _strings(buf, starts[:, GROUP], lens[:, GROUP], null_if_empty=True),
               _strings(buf, starts[:, PROTO], lens[:, PROTO]), pkeys, pvals]
    try:
        for a in strings:
            a.validate(full=True)  # invalid UTF-8 (a surrogateescape'd value): the slow path replaces it
    except pa.ArrowInvalid:
        return None
    arrays = [
        pa.array([topic] * n, type=pa.string()),
        pa.array(np.full(n, queue_id, dtype=np.int32)),
        pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)),
        mids,
        keys,
        strings[1],
        strings[2],
        _strings(buf, starts[:, BODY], lens[:, BODY], pa.binary()),
        props,
        strings[3],
        _ts(hdr[f"f{_BORN}"]),
        _ts(hdr[f"f{_STORE}"]),
        _promoted(buf, n, owner, ks_, kl_, vs_, vl_, MQTT_TOPIC_KEY),
        *(_promoted(buf, n, owner, ks_, kl_, vs_, vl_, c) for c in CE_COLUMNS),
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
        if raw is not None and raw[0]:
            records, phys, prefix, lo, hi = raw
            batch = records_to_batch(topic, queue_id, offset, records, phys, prefix)
            if batch is not None:
                return to_ipc([batch]), offset + len(records), lo, hi
    r = await processor.pull(ctx, topic, queue_id, offset, max_count, filter_expression, wait_ms)
    return to_ipc([messages_to_batch(r.messages)]), r.next_offset, r.min_offset, r.max_offset

