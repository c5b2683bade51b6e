"""The HTTP door's ingest routes: CloudEvents (binary, structured, batch) and plain messages in.

Why the routes take the raw ``Request`` instead of pydantic bodies: the
bodies are CloudEvents in three content modes (or a plain message body),
parsed by the ``cloudevents`` SDK in ``mapping.py``; routing them through
FastAPI's JSON-body validation would parse everything twice. They answer
pre-encoded JSON for the same reason. The bodies are still described in the
OpenAPI document (``openapi_extra`` in ``http_models.py``), so ``/docs`` and
schemathesis know them.
"""

from __future__ import annotations

import base64
import time

import orjson

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from starlette.routing import Route

from core_broker.model import Message
from gateway.batch_codec import unpack

from .batch import messages_from_batch
from .http_errors import ApiError
from .http_models import ERRORS, EVENTS_OPENAPI, MESSAGES_OPENAPI, SendOut
from .http_request import Deps, decode_header, read_body, request_context
from .http_responses import JSON, dumps, json_response, send_json, send_list_json
from .mapping import (
    CE_BATCH_CONTENT_TYPE,
    CE_JSON_CONTENT_TYPE,
    key_by_event_id,
    message_from_binary,
    message_from_structured,
)

__all__ = ["routes", "BATCH_JSON", "BATCH_PACKED"]

#: ``POST /v1/topics/{t}/messages`` with this Content-Type: a JSON array of messages (a batch).
BATCH_JSON = "application/vnd.unimq.batch+json"
#: ... with this one: a batch body as ``gateway/batch_codec.py`` packs it (the Spark sink's, a bench's).
BATCH_PACKED = "application/vnd.unimq.batch"


def routes(deps: Deps) -> tuple[APIRouter, Route]:
    """The ingest routes, and the events route's fast twin, which ``create_app`` places first."""
    processor, max_body, index_ids = deps.processor, deps.max_body, deps.index_ids
    router = APIRouter()

    @router.post("/v1/topics/{topic:path}/events", tags=["ingest"], openapi_extra=EVENTS_OPENAPI,
                 response_class=Response)
    async def post_events(request: Request, topic: str = Path(description="topic name")) -> Response:
        """Store CloudEvents (binary, structured or batch mode); answers the stored message ids."""
        return await ingest_events(request, topic)

    async def events_fast_path(request: Request) -> Response:
        return await ingest_events(request, request.path_params["topic"])

    # the same handler without FastAPI's per-request dependency solving (see create_app)
    fast = Route("/v1/topics/{topic:path}/events", events_fast_path, methods=["POST"])

    async def ingest_events(request: Request, topic: str) -> Response:
        p = processor()
        headers = request.headers
        ct = headers.get("content-type", "")
        base = ct.partition(";")[0].strip().lower()
        body = await read_body(request, max_body)
        ctx = request_context(request, "cloudevents")
        if base == CE_BATCH_CONTENT_TYPE:
            msgs = messages_from_batch(topic, body, p.config.max_batch, index_ids)
            if not msgs:
                return json_response([])
            await deps.admit(ctx, msgs)
            return json_response(send_list_json(await p.send(ctx, msgs)))
        if base == CE_JSON_CONTENT_TYPE:
            msg = message_from_structured(topic, body)
        elif base.startswith("application/cloudevents") and "ce-specversion" not in headers:
            raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE",
                           f"event format {base!r} is not supported; use {CE_JSON_CONTENT_TYPE} or binary mode")
        else:
            ce_headers = {}
            for k, v in request.scope["headers"]:
                if k[:3] == b"ce-" or k == b"content-type":
                    ce_headers[k.decode("latin-1")] = decode_header(v)
            if not any(k.startswith("ce-") for k in ce_headers):
                raise ApiError(400, "INVALID_CLOUDEVENT",
                               "not a CloudEvent: send ce-* headers (binary mode) or Content-Type "
                               f"{CE_JSON_CONTENT_TYPE} / {CE_BATCH_CONTENT_TYPE}")
            msg = message_from_binary(topic, ce_headers, body)
        if index_ids:
            key_by_event_id(msg)
        await deps.admit(ctx, (msg,))
        r = (await p.send(ctx, (msg,)))[0]
        return Response(dumps(send_json(r)), media_type=JSON)


    @router.post("/v1/topics/{topic:path}/messages", tags=["ingest"], openapi_extra=MESSAGES_OPENAPI,
                 response_model=SendOut, responses=ERRORS)
    async def post_message(
        request: Request,
        topic: str = Path(description="topic name"),
        tag: str | None = Query(None, description="message tag (or header unimq-tag)"),
        keys: list[str] | None = Query(None, description="message keys, repeatable or comma-separated (or header unimq-keys)"),
        message_group: str | None = Query(None, description="FIFO message group (or header unimq-message-group)"),
        delivery_time_ms: int | None = Query(None, ge=0, description="deliver at this epoch time in ms (delay message)"),
        delay_ms: int | None = Query(None, ge=0, le=10 * 365 * 86_400_000, description="deliver after this many ms"),
    ) -> Response:
        """Store a plain message: the body as sent; properties as `unimq-prop-NAME` headers or `prop.NAME` query
        parameters; the Content-Type is kept as the `content_type` property."""
        p = processor()
        body = await read_body(request, max_body)
        h = request.headers
        ct = h.get("content-type", "").partition(";")[0].strip().lower()
        if ct == BATCH_JSON:  # several messages in one call: one record on a batch topic
            msgs = messages_from_json_batch(topic, body, p.config.max_batch)
            return json_response(send_list_json(await p.send(request_context(request, "http"), msgs)))
        if ct == BATCH_PACKED:  # packed (and maybe compressed) by the producer: stored as it came
            ctx = request_context(request, "http")
            if hasattr(p, "send_packed"):
                r, n = await p.send_packed(ctx, topic, body)
            else:  # a processor over RPC: the messages cross one by one
                msgs = unpack(body).messages(topic, "http")
                r, n = (await p.send(ctx, msgs))[0], len(msgs)
            return json_response({**send_json(r), "count": n})
        props: dict[str, str] = {}
        for k, v in request.scope["headers"]:
            if k.startswith(b"unimq-prop-") and len(k) > 11:
                props[k[11:].decode("latin-1")] = decode_header(v)
        for k, v in request.query_params.multi_items():
            if k.startswith("prop.") and len(k) > 5:
                props[k[5:]] = v
        ct = h.get("content-type")
        if ct and "content_type" not in props:
            props["content_type"] = ct
        tag = tag if tag is not None else h.get("unimq-tag")
        key_list: list[str] = []
        for chunk in (keys or []) + ([h["unimq-keys"]] if "unimq-keys" in h else []):
            key_list.extend(k.strip() for k in chunk.split(",") if k.strip())
        if any("\0" in k for k in key_list):
            raise ApiError(400, "BAD_REQUEST", "message keys must not contain NUL characters")
        group = message_group if message_group is not None else h.get("unimq-message-group")
        when = delivery_time_ms
        if when is None and "unimq-delivery-time-ms" in h:
            try:
                when = int(h["unimq-delivery-time-ms"])
            except ValueError:
                raise ApiError(400, "BAD_REQUEST", "unimq-delivery-time-ms must be an integer (epoch ms)") from None
        if delay_ms is not None:
            if when is not None:
                raise ApiError(400, "BAD_REQUEST", "give delivery_time_ms or delay_ms, not both")
            when = int(time.time() * 1000) + delay_ms
        if when is not None and not 0 <= when < 2**62:
            raise ApiError(400, "BAD_REQUEST", "delivery time out of range")
        msg = Message(topic, body, tag=tag or None, keys=key_list, properties=props, message_group=group or None,
                      delivery_time_ms=when or 0, protocol="http")
        ctx = request_context(request, "http")
        await deps.admit(ctx, (msg,))
        r = (await p.send(ctx, (msg,)))[0]
        return json_response(send_json(r))


    return router, fast


def messages_from_json_batch(topic: str, body: bytes, max_batch: int) -> list[Message]:
    """The messages of a JSON batch (``BATCH_JSON``): an array of ``{"body" | "body_base64", "tag",
    "keys", "properties"}``, each checked; 400 when malformed."""
    try:
        items = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ApiError(400, "BAD_REQUEST", "a batch is a JSON array of messages") from None
    if not isinstance(items, list) or not items or len(items) > max_batch:
        raise ApiError(400, "BAD_REQUEST", f"a batch is a JSON array of 1 to {max_batch} messages")
    out = []
    for d in items:
        if not isinstance(d, dict):
            raise ApiError(400, "BAD_REQUEST", "each message of a batch is a JSON object")
        b, b64, tag, keys, props = d.get("body"), d.get("body_base64"), d.get("tag"), d.get("keys") or [], d.get("properties") or {}
        try:
            data = b.encode() if isinstance(b, str) else base64.b64decode(b64, validate=True) if isinstance(b64, str) else None
        except ValueError:
            data = None
        if data is None or (tag is not None and not isinstance(tag, str)) or not isinstance(keys, list) or not all(
                isinstance(k, str) and "\0" not in k for k in keys) or not isinstance(props, dict) or not all(
                isinstance(v, str) for v in props.values()):
            raise ApiError(400, "BAD_REQUEST", "a batch message has body (text) or body_base64, and optionally "
                           "tag (text), keys (texts without NUL) and properties (text values)")
        out.append(Message(topic, data, tag=tag or None, keys=keys, properties=props, protocol="http"))
    return out
