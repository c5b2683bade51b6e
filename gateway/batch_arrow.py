"""A batch record as rows of the gateway's Arrow pages, column by column (what Spark reads).

Why: the Spark source reads Arrow pages (``gateway/arrow_pages.py``); a batch topic's
page is built here from each batch record as a whole, without a Python step per
message: the batch body's columns are Arrow binary buffers already
(``gateway/batch_codec.py``), so bodies, client ids and keys are wrapped without a
copy and sliced to the offsets asked for, timestamps are a numpy view, and server
ids are hex-formatted with numpy. Only a batch whose messages carry properties has
them decoded per message (a map column has no cheaper source).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core_broker.model import StoredMessage
from core_broker.record import decode_properties
from core_broker.system_topics import public_properties

from .arrow_schema import ARROW_SCHEMA, CE_COLUMNS, MQTT_TOPIC_KEY, STR_LIST, STR_MAP, timestamps
from .batch_codec import Unpacked

__all__ = ["batch_rows"]

_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_SHIFTS = np.arange(60, -4, -4, dtype=np.uint64)


def _column(u: Unpacked, col: int, typ: pa.DataType) -> pa.Array:
    offs, data, _ = u.columns[col]
    return pa.Array.from_buffers(typ, u.count, [None, pa.py_buffer(offs), pa.py_buffer(data)])


def _server_ids(prefix: str, first_phys: int, a: int, b: int) -> pa.Array:
    n = b - a
    ph = np.arange(first_phys + a, first_phys + b, dtype=np.uint64)
    digits = _HEX[((ph[:, None] >> _SHIFTS) & np.uint64(15)).astype(np.intp)]
    pre = np.frombuffer(prefix.encode(), dtype=np.uint8)
    chars = np.concatenate([np.broadcast_to(pre, (n, len(pre))), digits], axis=1).reshape(-1)
    w = len(pre) + 16
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(n + 1, dtype=np.int32) * w),
                                                  pa.py_buffer(np.ascontiguousarray(chars))])


def offs_of(u: Unpacked, col: int, i: int) -> int:
    return u.columns[col][0][i]


def _same(value: str | None, n: int) -> pa.Array:
    """``n`` times one string (or null), filled in C."""
    nulls = pa.nulls(n, pa.string())
    return nulls if value is None else nulls.fill_null(value)


def batch_rows(topic: str, queue_id: int, first: int, rec: StoredMessage, lo: int, hi: int) -> pa.RecordBatch:
    """Rows for queue offsets [lo, hi) of the batch record ``rec`` whose first offset is ``first``."""
    u = Unpacked(rec.body)
    a, b = lo - first, hi - first
    n = b - a
    mids = _column(u, 3, pa.string()).slice(a, n)
    if offs_of(u, 3, b) == offs_of(u, 3, a):  # no client ids: the store's, generated
        mids = _server_ids(rec.message_id[:18], rec.commitlog_offset, a, b)
    elif pc.min(pc.binary_length(mids)).as_py() == 0:  # some message has no id of its own
        gen = _server_ids(rec.message_id[:18], rec.commitlog_offset, a, b)
        mids = pc.if_else(pc.greater(pc.binary_length(mids), 0), mids, gen)
    keys_raw = _column(u, 1, pa.string()).slice(a, n)
    zeros = pa.array(np.zeros(n + 1, dtype=np.int32))
    empty_lists = pa.ListArray.from_arrays(zeros, pa.array([], pa.string()), type=STR_LIST)
    if offs_of(u, 1, a) == offs_of(u, 1, b):
        keys = empty_lists
    else:
        keys = pc.if_else(pc.equal(pc.binary_length(keys_raw), 0), empty_lists,
                          pc.split_pattern(keys_raw, "\0").cast(STR_LIST))
    base = public_properties({k: v for k, v in rec.properties.items() if not k.startswith("__batch_")})
    offs, data, _ = u.columns[2]
    if offs[b] - offs[a] == 0 and not base:
        props = pa.MapArray.from_arrays(zeros, pa.array([], pa.string()),
                                        pa.array([], pa.string()), type=STR_MAP)
        promoted = [pa.nulls(n, pa.string()) for _ in (MQTT_TOPIC_KEY, *CE_COLUMNS)]
    else:  # properties per message: decoded one by one (the map column has no cheaper source)
        dicts = [{**base, **decode_properties(bytes(data[offs[i]:offs[i + 1]]))} for i in range(a, b)]
        lens = np.fromiter((len(d) for d in dicts), dtype=np.int32, count=n)
        po = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lens, out=po[1:])
        props = pa.MapArray.from_arrays(pa.array(po), pa.array([k for d in dicts for k in d], pa.string()),
                                        pa.array([v for d in dicts for v in d.values()], pa.string()), type=STR_MAP)
        promoted = [pa.array([d.get(c) for d in dicts], pa.string()) for c in (MQTT_TOPIC_KEY, *CE_COLUMNS)]
    arrays = [
        _same(topic, n),
        pa.array(np.full(n, queue_id, dtype=np.int32)),
        pa.array(np.arange(lo, hi, dtype=np.int64)),
        mids,
        keys,
        _same(rec.tag, n),
        pa.nulls(n, pa.string()),
        _column(u, 0, pa.binary()).slice(a, n),
        props,
        _same(rec.protocol, n),
        timestamps(np.frombuffer(u.born, dtype=np.int64)[a:b]),
        timestamps(np.full(n, rec.store_timestamp_ms, dtype=np.int64)),
        *promoted,
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
