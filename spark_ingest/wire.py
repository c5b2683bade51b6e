"""The reading side of the gateway's Arrow pages: IPC decode, and the JSON fallback page as a batch.

Why so little: the pages are built by the gateway (``gateway/arrow_pages.py``)
in the table's Arrow schema, which is defined once, in the layer that serves
it (``gateway/arrow_schema.py``, the one gateway module besides the naming
rules that this client may import). A page is a stream of record batches that
Spark takes as they are; the reader only opens the stream
(:func:`from_ipc`). A server without pyarrow answers JSON pages, which
:func:`json_to_batch` turns into the same batches.

This module needs pyarrow and numpy, not pyspark. ``tests/test_spark_reader.py``
pins :data:`ARROW_SCHEMA` against ``to_arrow_schema`` of the Spark schema.
"""

from __future__ import annotations

import base64
from typing import Sequence

import pyarrow as pa

from gateway.arrow_schema import ARROW_SCHEMA, MEDIA_TYPE, columns_to_batch

__all__ = ["ARROW_SCHEMA", "MEDIA_TYPE", "from_ipc", "json_to_batch"]


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


def from_ipc(data: bytes) -> list[pa.RecordBatch]:
    """The batches of one Arrow page (an IPC stream)."""
    return list(pa.ipc.open_stream(pa.py_buffer(data)))
