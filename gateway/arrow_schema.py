"""The Arrow schema of the gateway's Arrow pages, and the one way to build a batch of it.

Why here, on its own: the schema is part of the gateway's network API (the
HTTP door serves pages in it, ``gateway/arrow_pages.py`` builds them) and the
Spark source (``spark_ingest``) reads them and declares the same table to
Spark. Defining it once, in the layer that serves it, keeps writer and reader
from drifting apart; ``tests/test_spark_reader.py`` pins it equal to
``to_arrow_schema`` of ``spark_ingest.schema.spark_schema()`` (Spark rejects a
batch whose Arrow schema differs in any detail). It is the only gateway module
besides ``gateway.naming`` that ``spark_ingest`` may import, so it stays a
leaf: pyarrow, numpy and the naming rules, nothing of the store or the
processor (a Spark executor imports it).

:func:`columns_to_batch` builds a batch from per-message Python values; both
the gateway's decoded-message pages and the reader's JSON fallback pages use
it, so the promoted columns (``mqtt_topic``, ``ce_*``) are filled one way.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from .naming import P_MQTT_TOPIC

__all__ = ["ARROW_SCHEMA", "CE_COLUMNS", "MEDIA_TYPE", "MQTT_TOPIC_KEY", "STR_LIST", "STR_MAP", "columns_to_batch",
           "timestamps"]

MEDIA_TYPE = "application/vnd.apache.arrow.stream"
MQTT_TOPIC_KEY = P_MQTT_TOPIC  # the promoted column has the property's name
CE_COLUMNS = ("ce_type", "ce_source", "ce_subject")

TIMESTAMP = pa.timestamp("us", tz="UTC")
STR_LIST = pa.list_(pa.field("element", pa.string()))
STR_MAP = pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string()))

#: The table's Arrow schema, exactly what Spark's ``to_arrow_schema(schema, "UTC")`` gives for
#: ``spark_ingest.schema.SCHEMA_DDL`` (Spark rejects any difference at run time).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("queue_id", pa.int32()),
        pa.field("queue_offset", pa.int64()),
        pa.field("message_id", pa.string()),
        pa.field("keys", STR_LIST),
        pa.field("tag", pa.string()),
        pa.field("message_group", pa.string()),
        pa.field("body", pa.binary()),
        pa.field("properties", STR_MAP),
        pa.field("protocol", pa.string()),
        pa.field("born_timestamp", TIMESTAMP),
        pa.field("store_timestamp", TIMESTAMP),
        pa.field("mqtt_topic", pa.string()),
        pa.field("ce_type", pa.string()),
        pa.field("ce_source", pa.string()),
        pa.field("ce_subject", pa.string()),
    ]
)


def timestamps(ms: Sequence[int] | np.ndarray) -> pa.Array:
    """Epoch milliseconds as the schema's timestamp column (microseconds, UTC)."""
    return pa.array(np.asarray(ms, dtype=np.int64) * 1000, type=pa.int64()).view(TIMESTAMP)


def _map(props: Sequence[dict[str, str]]) -> pa.Array:
    lens = np.fromiter((len(p) for p in props), dtype=np.int32, count=len(props))
    offsets = np.zeros(len(props) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    keys = pa.array([k for p in props for k in p], type=pa.string())
    values = pa.array([v for p in props for v in p.values()], type=pa.string())
    return pa.MapArray.from_arrays(pa.array(offsets), keys, values, type=STR_MAP)


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
        pa.array([list(k) for k in keys], type=STR_LIST),
        pa.array(tag, type=pa.string()),
        pa.array(group, type=pa.string()),
        pa.array(body, type=pa.binary()),
        p,
        pa.array(protocol, type=pa.string()),
        timestamps(born_ms),
        timestamps(store_ms),
        pa.array([d.get(MQTT_TOPIC_KEY) for d in props], type=pa.string()),
        *(pa.array([d.get(c) for d in props], type=pa.string()) for c in CE_COLUMNS),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
