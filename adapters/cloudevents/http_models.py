"""The HTTP door's documented shapes: pydantic models of bodies and answers, and OpenAPI extras.

Why a module of their own: they are what ``/openapi.json`` (and so ``/docs``
and schemathesis) says about every route. Admin, ack and subscription routes
validate their bodies with these models; the hot routes take the raw
``Request`` (see ``http_ingest.py``) and describe their bodies here with
``openapi_extra`` instead, so the document stays complete.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .http_responses import JSON
from .mapping import CE_BATCH_CONTENT_TYPE, CE_JSON_CONTENT_TYPE

class TopicCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=255, description="topic name")
    queues: int = Field(8, ge=1, le=1024, description="number of message queues")
    type: Literal["NORMAL", "FIFO", "DELAY", "TRANSACTION", "COMPACTED",
                  "normal", "fifo", "delay", "transaction", "compacted"] = "NORMAL"
    attributes: dict[str, str] = Field(
        default_factory=dict,
        description="topic attributes, kept with a new topic: `tier_retention_hours` (hours in the tier, 0 for ever); "
                    "a COMPACTED topic's `min_cleanable_dirty_ratio` and `delete_retention_ms`; `static` "
                    "(`true`: the queues are logic queues, fixed for good; see `/v1/topics/{topic}/remap`); "
                    "message traces' `trace_enabled` (true/false) and `trace_sample_rate` (0-1)",
    )


class TopicUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    attributes: dict[str, str | None] = Field(
        description="attributes merged into the topic's, checked as at creation; a null value removes one",
    )


class QueueOut(BaseModel):
    queue_id: int
    min_offset: int
    max_offset: int


class TopicOut(BaseModel):
    name: str
    type: str
    queues: list[QueueOut]
    attributes: dict[str, str] | None = Field(None, description="the topic's attributes, when it has any")
    mapping: dict | None = Field(
        None, description="a static topic's logic queues: `epoch` and per logic queue its chain of items "
                          "`[broker, logic_start, phys_start, phys_end]` (phys_end -1: written now)")


class QueueMove(BaseModel):
    model_config = ConfigDict(extra="forbid")
    queue: int = Field(ge=0, le=1023, description="the static topic's logic queue")
    broker: str = Field(min_length=1, max_length=255, description="remap: the broker to write it on; "
                                                                      "release: the broker whose old part goes")


class MappingOut(BaseModel):
    name: str
    mapping: dict


class SendOut(BaseModel):
    message_id: str
    topic: str
    queue_id: int
    queue_offset: int


class MessageOut(BaseModel):
    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    tag: str | None
    keys: list[str]
    message_group: str | None
    properties: dict[str, str]
    protocol: str
    born_timestamp: int
    store_timestamp: int
    delivery_attempt: int | None
    receipt_handle: str | None = Field(None, description="pop only")
    body_base64: str


class PullOut(BaseModel):
    messages: list[MessageOut]
    next_offset: int
    min_offset: int
    max_offset: int


class PopOut(BaseModel):
    messages: list[MessageOut]


class AckIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    receipt_handles: list[str] = Field(min_length=1, max_length=1024)


class AckOut(BaseModel):
    acked: int


class InvisibleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    receipt_handle: str = Field(min_length=1)
    invisible_s: float = Field(ge=0, le=43_200)


class InvisibleOut(BaseModel):
    receipt_handle: str


class SubscriptionIn(BaseModel):
    """A push subscription (CloudEvents Subscriptions API style)."""

    model_config = ConfigDict(extra="forbid")
    topic: str = Field(min_length=1, max_length=255)
    sink: str = Field(min_length=1, description="webhook URL (http or https)")
    group: str | None = Field(None, description="consumer group (default: push-<id>); its DLQ is %DLQ%<group>")
    filters: list[dict[str, Any]] = Field(default_factory=list,
                                          description="exact / prefix / suffix / all / any / not filter expressions")
    mode: Literal["binary", "structured"] = "binary"
    protocol: Literal["HTTP"] = "HTTP"
    start: Literal["latest", "earliest"] = "latest"
    max_attempts: int = Field(5, ge=1, le=100)
    initial_backoff_ms: int = Field(500, ge=1, le=3_600_000)
    max_backoff_ms: int = Field(60_000, ge=1, le=86_400_000)
    timeout_s: float = Field(10.0, ge=0.1, le=300)
    max_inflight: int = Field(16, ge=1, le=256)


class ErrorOut(BaseModel):
    error: str
    message: str


ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "bad request"},
    404: {"model": ErrorOut, "description": "not found"},
}


def messages_responses(model: type[BaseModel], description: str, *more_types: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI answers of a route returning messages: JSON (``model``) or, when the request
    accepts it, a CloudEvents batch (or one of ``more_types``); besides the error answers."""
    content: dict[str, Any] = {CE_BATCH_CONTENT_TYPE: {}, **{t: {} for t in more_types}}
    return {**ERRORS, 200: {"content": content, "model": model, "description": description}}

_CE_EVENT_SCHEMA = {
    "type": "object",
    "required": ["specversion", "id", "source", "type"],
    "properties": {
        "specversion": {"type": "string", "enum": ["1.0"]},
        "id": {"type": "string", "minLength": 1},
        "source": {"type": "string", "minLength": 1},
        "type": {"type": "string", "minLength": 1},
        "subject": {"type": "string"},
        "time": {"type": "string", "format": "date-time"},
        "datacontenttype": {"type": "string"},
        "dataschema": {"type": "string"},
        "data": {},
        "data_base64": {"type": "string", "format": "byte"},
    },
    "additionalProperties": True,
}
EVENTS_OPENAPI = {
    "requestBody": {
        "required": True,
        "description": (
            "A CloudEvent in structured mode (`application/cloudevents+json`), a batch "
            "(`application/cloudevents-batch+json`), or, in binary mode, the event's data as the body with "
            "the attributes in `ce-id`, `ce-source`, `ce-type`, `ce-specversion` (and optional `ce-subject`, "
            "`ce-time`, extensions) headers and `Content-Type` as `datacontenttype`."
        ),
        "content": {
            CE_JSON_CONTENT_TYPE: {"schema": _CE_EVENT_SCHEMA},
            CE_BATCH_CONTENT_TYPE: {"schema": {"type": "array", "items": _CE_EVENT_SCHEMA}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    },
    "parameters": [
        {"name": "ce-id", "in": "header", "required": False, "schema": {"type": "string"}},
        {"name": "ce-source", "in": "header", "required": False, "schema": {"type": "string"}},
        {"name": "ce-type", "in": "header", "required": False, "schema": {"type": "string"}},
        {"name": "ce-specversion", "in": "header", "required": False, "schema": {"type": "string"}},
    ],
    "responses": {
        "200": {
            "description": "stored: one send result, or a list of them for a batch",
            "content": {JSON: {"schema": {"oneOf": [
                {"$ref": "#/components/schemas/SendOut"},
                {"type": "array", "items": {"$ref": "#/components/schemas/SendOut"}},
            ]}}},
        },
        "413": {"description": "body over the size limit", "content": {JSON: {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}},
        "415": {"description": "unsupported content type", "content": {JSON: {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}},
    },
}
MESSAGES_OPENAPI = {
    "requestBody": {
        "required": False,
        "description": "the message body, stored as sent",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                    "text/plain": {"schema": {"type": "string"}}},
    },
    "parameters": [
        {"name": "unimq-tag", "in": "header", "required": False, "schema": {"type": "string"}},
        {"name": "unimq-keys", "in": "header", "required": False, "schema": {"type": "string"},
         "description": "comma-separated message keys"},
        {"name": "unimq-message-group", "in": "header", "required": False, "schema": {"type": "string"}},
        {"name": "unimq-delivery-time-ms", "in": "header", "required": False, "schema": {"type": "integer"}},
    ],
}
