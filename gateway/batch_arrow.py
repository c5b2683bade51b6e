"""A batch record as rows of the gateway's Arrow pages, column by column (what Spark reads).

Why: the Spark source reads Arrow pages (``gateway/arrow_pages.py``); a batch topic's
page is built here from each batch record as a whole, without a Python step per
message: the batch body's columns are Arrow binary buffers already
(``gateway/batch_codec.py``), so bodies, client ids and keys are wrapped without a
copy and sliced to the offsets asked for, timestamps are a numpy view, and server
ids are hex-formatted with numpy. Only a batch whose messages carry properties has
them decoded per message (a map column has no cheaper source). A page of plain records
(no keys, properties or client ids: a batch topic's usual page) is built column by
column for the whole page rather than record by record.
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

__all__ = ["page_rows", "record_rows"]

#: A page ends after the record that would take it past this many bytes of batch bodies (as
#: the store's raw reads stop at 32 MiB of commitlog): pages of up to 65,536 rows of large
#: messages would otherwise be hundreds of megabytes in memory at once.
MAX_PAGE_BYTES = 32 << 20

#: Each byte value's two upper-case hex digits, as the uint16 whose memory holds them in order.
_HEX_PAIRS = np.frombuffer(b"".join(b"%02X" % i for i in range(256)), dtype=np.uint16)


def _column(u: Unpacked, col: int, typ: pa.DataType) -> pa.Array:
    offs, data, _ = u.columns[col]
    return pa.Array.from_buffers(typ, u.count, [None, pa.py_buffer(offs), pa.py_buffer(data)])


def _server_ids(prefix: str, first_phys: int, a: int, b: int) -> pa.Array:
    """The store's ids of messages a..b of a batch (see :func:`_hex_ids`)."""
    return _hex_ids(prefix, np.arange(first_phys + a, first_phys + b, dtype=np.int64))


def _hex_ids(prefix: str, phys: np.ndarray) -> pa.Array:
    """Server ids: ``prefix`` + the 16 hex digits of each message's position (its record's
    commitlog offset + its index), one table lookup per byte, no per-digit shifts."""
    n = len(phys)
    be = phys.astype(">u8").view(np.uint8).reshape(n, 8)
    digits = _HEX_PAIRS[be].view(np.uint8)  # n x 16 ASCII digits, most significant first
    pre = np.frombuffer(prefix.encode(), dtype=np.uint8)
    w = len(pre) + 16
    chars = np.empty((n, w), dtype=np.uint8)
    chars[:, :len(pre)] = pre
    chars[:, len(pre):] = digits.reshape(n, 16)
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


def record_rows(topic: str, queue_id: int, first: int, rec: StoredMessage, u: Unpacked, a: int, b: int
                ) -> pa.RecordBatch:
    """Rows a..b of the batch record ``rec`` (unpacked as ``u``) whose first offset is ``first``."""
    lo, hi, n = first + a, first + b, b - a
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


def _plain(rec: StoredMessage, u: Unpacked, a: int, b: int) -> bool:
    """Rows a..b of the record have no keys, properties or ids of their own, and the record no
    public properties: their columns are the body, the born time and generated ids only."""
    return (offs_of(u, 1, a) == offs_of(u, 1, b) and offs_of(u, 2, a) == offs_of(u, 2, b)
            and offs_of(u, 3, a) == offs_of(u, 3, b)
            and not public_properties({k: v for k, v in rec.properties.items() if not k.startswith("__batch_")}))


def _plain_page(topic: str, queue_id: int, offset: int, spans: Sequence[tuple[StoredMessage, Unpacked, int, int]]
                ) -> pa.RecordBatch:
    """One batch for plain rows (:func:`_plain`) of several records of one tag, protocol and id
    prefix, each column built once for the page: the bodies' offsets and bytes joined with one
    numpy concatenation and one ``bytes.join``, server ids and store times from per-record
    arrays expanded by numpy. A per-record batch then a concatenation cost ~20 Arrow calls per
    record plus a copy of the page (half the page's CPU: bench/RESULTS.md, issue 18, spark2)."""
    counts = np.fromiter((b - a for _, _, a, b in spans), dtype=np.int64, count=len(spans))
    n = int(counts.sum())
    starts = np.zeros(len(spans), dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    first = spans[0][0]
    body_offs, chunks, born = [], [], []
    base = 0
    for _rec, u, a, b in spans:
        offs, data, _ = u.columns[0]
        o = np.frombuffer(offs, dtype=np.int32)[a:b + 1]
        lo = int(o[0])
        body_offs.append(o[:-1] - (lo - base))
        base += int(o[-1]) - lo
        chunks.append(data[lo:int(o[-1])])
        born.append(np.frombuffer(u.born, dtype=np.int64)[a:b])
    body_offs.append(np.array([base], dtype=np.int32))
    body = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(np.concatenate(body_offs)),
                                                  pa.py_buffer(b"".join(chunks))])
    phys = np.fromiter((rec.commitlog_offset + a for rec, _, a, _ in spans), dtype=np.int64, count=len(spans))
    phys = np.repeat(phys - starts, counts) + np.arange(n, dtype=np.int64)
    store = np.repeat(np.fromiter((rec.store_timestamp_ms for rec, _, _, _ in spans), dtype=np.int64,
                                  count=len(spans)), counts)
    nulls = _same(None, n)
    arrays = [
        _same(topic, n),
        _constant("int32", queue_id, n, lambda: pa.array(np.full(n, queue_id, dtype=np.int32))),
        pa.array(np.arange(offset, offset + n, dtype=np.int64)),
        _hex_ids(first.message_id[:18], phys),
        _empty_lists(n),
        _same(first.tag, n),
        nulls,
        body,
        _empty_maps(n),
        _same(first.protocol, n),
        timestamps(np.concatenate(born)),
        timestamps(store),
        *[nulls] * (1 + len(CE_COLUMNS)),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def page_rows(topic: str, queue_id: int, offset: int, max_count: int,
              records: Sequence[tuple[int, int, StoredMessage]], max_bytes: int = MAX_PAGE_BYTES
              ) -> tuple[list[pa.RecordBatch], int]:
    """A page of up to ``max_count`` rows from ``offset`` as one batch, and the offset after it.

    ``records``: (first offset, message count, record) of the batch records covering the page.
    One batch, because every batch costs each later stage a fixed price: Spark's Python worker
    writes it buffer by buffer to the JVM and the JVM loads and iterates it as a batch of its
    own. Pages of sixteen 1,000-message batches instead of one 16,384-row batch measured 0.7 s
    more JVM CPU and 0.2 s more worker CPU per 1,000,000 rows (bench/RESULTS.md, issue 18,
    branch sparkbatch). Records of plain rows sharing tag, protocol and id prefix (a batch
    topic's usual page) are built column by column for the whole page (:func:`_plain_page`);
    any other page record by record, then concatenated (a copy of the page in C). The page
    stops early after ``max_bytes`` of records (the reader asks again from ``end``)."""
    end, spans, size = offset, [], 0
    for first, n, rec in records:
        if spans and size + len(rec.body) > max_bytes:
            break
        size += len(rec.body)
        hi = min(first + n, offset + max_count)
        spans.append((first, rec, Unpacked(rec.body), max(first, end) - first, hi - first))
        end = hi
    head = spans[0][1]
    if all(rec.tag == head.tag and rec.protocol == head.protocol and rec.message_id[:18] == head.message_id[:18]
           and _plain(rec, u, a, b) for _, rec, u, a, b in spans):
        return [_plain_page(topic, queue_id, offset, [span[1:] for span in spans])], end
    rows = [record_rows(topic, queue_id, *span) for span in spans]
    return ([pa.concat_batches(rows)] if len(rows) > 1 else rows), end
