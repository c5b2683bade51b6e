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

from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core_broker.model import StoredMessage
from core_broker.record import decode_properties
from core_broker.system_topics import public_properties

from .arrow_schema import ARROW_SCHEMA, CE_COLUMNS, MQTT_TOPIC_KEY, STR_LIST, STR_MAP, timestamps
from .batch_codec import Unpacked

__all__ = ["batch_rows", "page_rows"]

#: Each byte value's two upper-case hex digits, as the uint16 whose memory holds them in order.
_HEX_PAIRS = np.frombuffer(b"".join(b"%02X" % i for i in range(256)), dtype=np.uint16)


def _column(u: Unpacked, col: int, typ: pa.DataType) -> pa.Array:
    offs, data, _ = u.columns[col]
    return pa.Array.from_buffers(typ, u.count, [None, pa.py_buffer(offs), pa.py_buffer(data)])


def _server_ids(prefix: str, first_phys: int, a: int, b: int) -> pa.Array:
    """The store's ids of messages a..b of a batch: ``prefix`` + the 16 hex digits of the
    record's commitlog offset + the index (one table lookup per byte, no per-digit shifts)."""
    n = b - a
    be = np.arange(first_phys + a, first_phys + b, dtype=">u8").view(np.uint8).reshape(n, 8)
    digits = _HEX_PAIRS[be].view(np.uint8)  # n x 16 ASCII digits, most significant first
    pre = np.frombuffer(prefix.encode(), dtype=np.uint8)
    w = len(pre) + 16
    chars = np.empty((n, w), dtype=np.uint8)
    chars[:, :len(pre)] = pre
    chars[:, len(pre):] = digits
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(0, (n + 1) * w, w, dtype=np.int32)),
                                                  pa.py_buffer(chars)])


def offs_of(u: Unpacked, col: int, i: int) -> int:
    return u.columns[col][0][i]


_CONSTANTS: dict[tuple, pa.Array] = {}


def _constant(kind: str, value: object, n: int, make: Callable[[], pa.Array]) -> pa.Array:
    """An array whose every row is one value, made once per (kind, value, length) and shared
    (arrays are immutable): most records of a batch topic have the same length, topic, queue,
    tag and protocol, so a page's constant columns cost a dict lookup, not a C fill each."""
    key = (kind, value, n)
    arr = _CONSTANTS.get(key)
    if arr is None:
        if len(_CONSTANTS) >= 256:  # bounded: many queues or lengths only cost refills
            _CONSTANTS.clear()
        arr = _CONSTANTS[key] = make()
    return arr


def _same(value: str | None, n: int) -> pa.Array:
    """``n`` times one string (or null)."""
    def make() -> pa.Array:
        nulls = pa.nulls(n, pa.string())
        return nulls if value is None else nulls.fill_null(value)
    return _constant("str", value, n, make)


def _empty_lists(n: int) -> pa.Array:
    return _constant("list", None, n, lambda: pa.ListArray.from_arrays(
        pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string()), type=STR_LIST))


def _empty_maps(n: int) -> pa.Array:
    return _constant("map", None, n, lambda: pa.MapArray.from_arrays(
        pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string()), pa.array([], pa.string()),
        type=STR_MAP))


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
    empty_lists = _empty_lists(n)
    if offs_of(u, 1, a) == offs_of(u, 1, b):
        keys = empty_lists
    else:
        keys = pc.if_else(pc.equal(pc.binary_length(keys_raw), 0), empty_lists,
                          pc.split_pattern(keys_raw, "\0").cast(STR_LIST))
    base = public_properties({k: v for k, v in rec.properties.items() if not k.startswith("__batch_")})
    offs, data, _ = u.columns[2]
    if offs[b] - offs[a] == 0 and not base:
        props = _empty_maps(n)
        promoted = [_same(None, n)] * (1 + len(CE_COLUMNS))
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
        _constant("int32", queue_id, n, lambda: pa.array(np.full(n, queue_id, dtype=np.int32))),
        pa.array(np.arange(lo, hi, dtype=np.int64)),
        mids,
        keys,
        _same(rec.tag, n),
        _same(None, n),
        _column(u, 0, pa.binary()).slice(a, n),
        props,
        _same(rec.protocol, n),
        timestamps(np.frombuffer(u.born, dtype=np.int64)[a:b]),
        timestamps(np.full(n, rec.store_timestamp_ms, dtype=np.int64)),
        *promoted,
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def page_rows(topic: str, queue_id: int, offset: int, max_count: int,
              records: Sequence[tuple[int, int, StoredMessage]]) -> tuple[list[pa.RecordBatch], int]:
    """A page of up to ``max_count`` rows from ``offset`` as one batch, and the offset after it.

    ``records``: (first offset, message count, record) of the batch records covering the page.
    Their rows are concatenated into one batch (a copy of the page in C) because every batch
    costs each later stage a fixed price: Spark's Python worker writes it buffer by buffer to
    the JVM and the JVM loads and iterates it as a batch of its own. Pages of sixteen
    1,000-message batches instead of one 16,384-row batch measured 0.7 s more JVM CPU and 0.2 s
    more worker CPU per 1,000,000 rows (bench/RESULTS.md, issue 18, branch sparkbatch)."""
    end, rows = offset, []
    for first, n, rec in records:
        hi = min(first + n, offset + max_count)
        rows.append(batch_rows(topic, queue_id, first, rec, max(first, end), hi))
        end = hi
    return ([pa.concat_batches(rows)] if len(rows) > 1 else rows), end
