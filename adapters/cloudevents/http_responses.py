"""What the HTTP door answers: compact JSON, the JSON shapes of results, CloudEvents batches.

Why pre-encoded ``Response`` objects rather than FastAPI's response models:
message pages are the hot path, and encoding them once with orjson is several
times faster than validating and serializing them through pydantic. The
shapes here are the contract every JSON consumer relies on (the Spark reader's
JSON fallback among them); ``http_models.py`` documents the same shapes for
the OpenAPI document.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Sequence

import orjson
from fastapi import Request
from fastapi.responses import Response

from gateway.api import TopicStats

from .mapping import CE_BATCH_CONTENT_TYPE, to_structured_json

__all__ = [
    "JSON", "cloudevents_batch", "dumps", "json_response", "message_json", "send_json", "send_list_json",
    "topic_json", "wants_cloudevents",
]

JSON = "application/json"
_json_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON: orjson (several times faster on message lists), the stdlib for what it refuses."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return _json_encode(obj).encode()


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(dumps(obj), status_code=status, media_type=JSON)


def send_json(r: Any) -> dict[str, Any]:
    return {"message_id": r.message_id, "topic": r.topic, "queue_id": r.queue_id, "queue_offset": r.queue_offset}


def send_list_json(results: Sequence[Any]) -> list[dict[str, Any]]:
    """``send_json`` of every result of a batch (unpacked by position: SendResult is a named tuple)."""
    return [{"message_id": mid, "topic": t, "queue_id": q, "queue_offset": o} for mid, t, _, q, o, *_ in results]


def message_json(m: Any, delivery_attempt: int | None = None, receipt_handle: str | None = None) -> dict[str, Any]:
    """One stored message in the shape every JSON consumer (the Spark reader among them) relies on."""
    d = {
        "message_id": m.message_id,
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": m.queue_offset,
        "tag": m.tag,
        "keys": list(m.keys),
        "message_group": m.message_group,
        "properties": m.properties,
        "protocol": m.protocol,
        "born_timestamp": m.born_timestamp_ms,
        "store_timestamp": m.store_timestamp_ms,
        "delivery_attempt": delivery_attempt if delivery_attempt is not None else m.reconsume_times + 1,
    }
    if receipt_handle is not None:
        d["receipt_handle"] = receipt_handle
    d["body_base64"] = base64.b64encode(m.body).decode("ascii")
    return d


def topic_json(stats: TopicStats) -> dict[str, Any]:
    out = {
        "name": stats.config.name,
        "type": stats.config.message_type.value,
        "queues": [{"queue_id": q.queue_id, "min_offset": q.min_offset, "max_offset": q.max_offset} for q in stats.queues],
    }
    attrs = stats.config.attributes
    if attrs:  # only when set: a plain topic's description stays as it was
        out["attributes"] = dict(attrs)
    mapping = stats.config.mapping
    if mapping is not None:  # a static topic: where each logic queue's offsets live
        out["mapping"] = mapping
    return out


def wants_cloudevents(request: Request) -> bool:
    return CE_BATCH_CONTENT_TYPE in request.headers.get("accept", "")


def cloudevents_batch(items: Sequence[tuple[Any, dict[str, Any] | None]]) -> Response:
    body = b"[" + b",".join(to_structured_json(m, ext) for m, ext in items) + b"]"
    return Response(body, media_type=CE_BATCH_CONTENT_TYPE)
