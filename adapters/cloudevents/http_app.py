"""The HTTP door: CloudEvents and plain messages in, messages out (pull, pop, push), admin, health, metrics.

Why a factory taking the server's state: the app must answer ``/healthz``
truthfully while the process is starting, serving and stopping, and its
routes need the MessagingProcessor; both live on the state object that
the process (``unimq``) owns, so the app keeps no globals and tests can build one
app per server.

Why the hot routes take the raw ``Request`` instead of pydantic bodies: the
ingest routes' bodies are CloudEvents in three content modes (or a plain
message body), parsed by the ``cloudevents`` SDK in ``mapping.py``; routing
them through FastAPI's JSON-body validation would parse everything twice. They
answer pre-encoded JSON ``Response`` objects for the same reason. The request
bodies are still described in the OpenAPI document (``openapi_extra``), so
``/docs`` and schemathesis know them. Admin, ack and subscription routes use
ordinary pydantic models.

Every error is ``{"error": CODE, "message": text}`` with a 4xx status for the
client's mistakes (bad JSON, a missing CloudEvents attribute, a wrong
specversion, a body over the limit, an unknown receipt handle, ...) and 5xx
only for the server's own trouble (store full, store stopping).
"""

from __future__ import annotations

import base64
import contextlib
import heapq
import json
import logging
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Literal, Sequence

import orjson
from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from core_broker.errors import UnimqError
from core_broker.model import FilterExpression, FilterType, Message, MessageType
from gateway.api import MessagingAPI
from gateway.context import RequestContext

from .mapping import (
    CE_BATCH_CONTENT_TYPE,
    CE_JSON_CONTENT_TYPE,
    key_by_event_id,
    message_from_binary,
    message_from_structured,
    to_structured_json,
)
from .batch import messages_from_batch
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import UnimqCollector
from .push import PushManager

if TYPE_CHECKING:  # imported for type hints only
    from gateway.door import ServerState

log = logging.getLogger("unimq.http")

__all__ = ["create_app", "STATUS_OF_CODE"]

JSON = "application/json"
_json_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON: orjson (several times faster on message lists), the stdlib for what it refuses."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return _json_encode(obj).encode()

# The processor's error codes -> HTTP status. Anything unlisted that is a UnimqError is a 400.
STATUS_OF_CODE = {
    "BAD_REQUEST": 400,
    "INVALID_CLOUDEVENT": 400,
    "ILLEGAL_FILTER_EXPRESSION": 400,
    "INVALID_RECEIPT_HANDLE": 400,
    "INVALID_SUBSCRIPTION": 400,
    "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE": 400,
    "UNAUTHORIZED": 401,
    "FORBIDDEN": 403,
    "TOPIC_NOT_FOUND": 404,
    "SUBSCRIPTION_NOT_FOUND": 404,
    "TOPIC_EXISTS": 409,
    "NOT_ACCEPTABLE": 406,  # format=arrow on a server without pyarrow
    "MESSAGE_BODY_TOO_LARGE": 413,
    "PAYLOAD_TOO_LARGE": 413,
    "UNSUPPORTED_MEDIA_TYPE": 415,
    "CORRUPT_RECORD": 500,
    "INTERNAL_ERROR": 500,
    "SERVICE_UNAVAILABLE": 503,
    "NOT_ENOUGH_REPLICAS": 503,  # retriable: the group's in-sync set is below min_insync_replicas
    "NOT_MASTER": 503,  # retriable: a failover is under way
    "MASTER_PERSISTENCE_TIMEOUT": 504,
    "STORE_FULL": 507,
}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": code, "message": message, **extra}, status_code=status)


def _json(obj: Any, status: int = 200) -> Response:
    return Response(_dumps(obj), status_code=status, media_type=JSON)


# ------------------------------------------------------------------------------ JSON shapes


def send_json(r: Any) -> dict[str, Any]:
    return {"message_id": r.message_id, "topic": r.topic, "queue_id": r.queue_id, "queue_offset": r.queue_offset}


def send_list_json(results: Sequence[Any]) -> list[dict[str, Any]]:
    """``send_json`` of every result of a batch (unpacked by position: SendResult is a named tuple)."""
    return [{"message_id": mid, "topic": t, "queue_id": q, "queue_offset": o} for mid, t, _, q, o, *_ in results]


DOCS_ASSETS = "/docs/assets"


def _serve_docs(app: FastAPI) -> None:
    """Swagger UI at /docs with its script and styles from the installed ``swagger-ui-bundle``
    package (FastAPI's default page loads them from a CDN and is blank without internet)."""
    import swagger_ui_bundle
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles

    app.mount(DOCS_ASSETS, StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title="unimq - API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
        )


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


def topic_json(stats: Any) -> dict[str, Any]:
    return {
        "name": stats.config.name,
        "type": stats.config.message_type.value,
        "queues": [{"queue_id": q.queue_id, "min_offset": q.min_offset, "max_offset": q.max_offset} for q in stats.queues],
    }


def _wants_cloudevents(request: Request) -> bool:
    return CE_BATCH_CONTENT_TYPE in request.headers.get("accept", "")


def _cloudevents_batch(items: Sequence[tuple[Any, dict[str, Any] | None]]) -> Response:
    body = b"[" + b",".join(to_structured_json(m, ext) for m, ext in items) + b"]"
    return Response(body, media_type=CE_BATCH_CONTENT_TYPE)


# ------------------------------------------------------------------------------ request models (docs + validation)


class TopicCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=255, description="topic name")
    queues: int = Field(8, ge=1, le=1024, description="number of message queues")
    type: Literal["NORMAL", "FIFO", "DELAY", "TRANSACTION", "normal", "fifo", "delay", "transaction"] = "NORMAL"


class QueueOut(BaseModel):
    queue_id: int
    min_offset: int
    max_offset: int


class TopicOut(BaseModel):
    name: str
    type: str
    queues: list[QueueOut]


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


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "bad request"},
    404: {"model": ErrorOut, "description": "not found"},
}


def _messages_responses(model: type[BaseModel], description: str, *more_types: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI answers of a route returning messages: JSON (``model``) or, when the request
    accepts it, a CloudEvents batch (or one of ``more_types``); besides the error answers."""
    content: dict[str, Any] = {CE_BATCH_CONTENT_TYPE: {}, **{t: {} for t in more_types}}
    return {**_ERRORS, 200: {"content": content, "model": model, "description": description}}

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
_EVENTS_OPENAPI = {
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
_MESSAGES_OPENAPI = {
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


# ------------------------------------------------------------------------------ helpers


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) anything over ``limit`` bytes without reading it all."""
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            n = int(cl)
        except ValueError:
            raise ApiError(400, "BAD_REQUEST", "invalid Content-Length") from None
        if n > limit:
            raise ApiError(413, "PAYLOAD_TOO_LARGE", f"request body of {n} bytes exceeds the limit of {limit} bytes")
        return await request.body()
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise ApiError(413, "PAYLOAD_TOO_LARGE", f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _decode_header(v: bytes) -> str:
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        return v.decode("latin-1")


def _ctx(request: Request, protocol: str) -> RequestContext:
    client = request.client
    return RequestContext(protocol=protocol, remote_address=f"{client.host}:{client.port}" if client else "")


def _filter(tag: str | None, sql: str | None) -> FilterExpression | None:
    if tag is not None and sql is not None:
        raise ApiError(400, "BAD_REQUEST", "give a 'tag' or an 'sql' filter, not both")
    if sql is not None:
        return FilterExpression(sql, FilterType.SQL92)
    if tag is not None:
        return FilterExpression(tag, FilterType.TAG)
    return None


def _check_group(group: str) -> None:
    """Group names become part of retry and dead-letter topic names: same rules as topics, no '%' lead."""
    if not group or len(group) > 200 or group.startswith("%") or any(ord(c) < 32 or ord(c) == 127 for c in group):
        raise ApiError(400, "BAD_REQUEST",
                       "a consumer group name is 1 to 200 characters, without control characters, not starting with '%'")


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


# ------------------------------------------------------------------------------ the app


def create_app(state: ServerState) -> FastAPI:
    """Build the FastAPI app for one server; ``state.phase`` drives ``/healthz``."""
    settings = state.settings
    max_body: int = getattr(settings, "http_max_body_bytes", 16 * 1024 * 1024)
    index_ids: bool = getattr(settings, "http_index_event_ids", False)
    push = PushManager(state.processor, getattr(settings, "http_push_allowed_hosts", []))
    collector = UnimqCollector(state.processor, push)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        processor = state.processor
        push.processor = processor
        collector.processor = processor
        if processor is not None:
            await push.start()
        try:
            yield
        finally:
            if push.started:
                await push.stop()

    app = FastAPI(
        title="unimq",
        version="1",
        description=(
            "The HTTP and CloudEvents door of unimq: post CloudEvents (binary, structured, batch) and plain "
            "messages; consume by pop (receipt handles, long polling) or by queue offset; push to webhooks. "
            "Errors are `{\"error\": CODE, \"message\": text}`."
        ),
        docs_url=None,  # served below from the installed swagger-ui-bundle: /docs works offline
        redoc_url=None,
        openapi_url="/openapi.json",
        lifespan=lifespan,
    )
    app.state.unimq = state
    app.state.push = push
    _serve_docs(app)

    # -- errors -----------------------------------------------------------------------

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.code, exc.message)

    @app.exception_handler(UnimqError)
    async def _unimq_error(request: Request, exc: UnimqError) -> JSONResponse:
        status = STATUS_OF_CODE.get(exc.code, 400)
        if status >= 500:
            log.warning("%s %s: %s: %s", request.method, request.url.path, exc.code, exc)
        return _error(status, exc.code, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors():
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "request"
            parts.append(f"{loc}: {e.get('msg', 'invalid')}")
        return _error(400, "BAD_REQUEST", "; ".join(parts) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(exc.status_code, "HTTP_ERROR")
        return _error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return _error(500, "INTERNAL_ERROR", f"internal error: {type(exc).__name__}")

    def processor() -> MessagingAPI:
        p = state.processor
        if p is None or not state.ready:
            raise ApiError(503, "SERVICE_UNAVAILABLE", f"unimq is {state.phase}")
        return p

    # -- health and metrics -----------------------------------------------------------

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> JSONResponse:
        """200 ``{"status": "ok"}`` once every door and the store are up; 503 otherwise.

        Load balancers and the tests poll this, so it must turn 503 again when
        shutdown begins, before the doors close.
        """
        if state.ready:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": state.phase}, status_code=503)

    @app.get("/metrics", tags=["ops"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
    async def metrics() -> Response:
        """Prometheus metrics: messages in/out per door and topic, consumer lag, store bytes, flush latency."""
        return Response(await collector.render(), media_type=METRICS_CONTENT_TYPE)

    # -- topics -------------------------------------------------------------------------

    @app.get("/v1/topics", tags=["topics"], response_model=list[TopicOut])
    async def list_topics(
        include_system: bool = Query(False, description="also list %DLQ%, %RETRY% and other system topics"),
    ) -> Response:
        """Every topic with its queues' min/max offsets."""
        p = processor()
        ctx = _ctx_admin
        out = []
        for tc in await p.list_topics(ctx, include_system):
            try:
                out.append(topic_json(await p.describe_topic(ctx, tc.name)))
            except UnimqError:  # deleted meanwhile
                continue
        return _json(out)

    @app.post("/v1/topics", tags=["topics"], status_code=201, response_model=TopicOut,
              responses={200: {"model": TopicOut, "description": "already exists with this type"},
                         409: {"model": ErrorOut, "description": "exists with another type"}, **_ERRORS})
    async def create_topic(body: TopicCreate) -> Response:
        """Create a topic (201); 200 if it exists with the same type, 409 if with another type."""
        p = processor()
        mtype = MessageType(body.type.upper())
        existed = True
        try:
            await p.describe_topic(_ctx_admin, body.name)
        except UnimqError:
            existed = False
        await p.create_topic(_ctx_admin, body.name, body.queues, mtype, exist_ok=True)
        return _json(topic_json(await p.describe_topic(_ctx_admin, body.name)), 200 if existed else 201)

    # -- ingest ----------------------------------------------------------------------------

    @app.post("/v1/topics/{topic:path}/events", tags=["ingest"], openapi_extra=_EVENTS_OPENAPI,
              response_class=Response)
    async def post_events(request: Request, topic: str = Path(description="topic name")) -> Response:
        """Store CloudEvents (binary, structured or batch mode); answers the stored message ids."""
        return await ingest_events(request, topic)

    async def events_fast_path(request: Request) -> Response:
        return await ingest_events(request, request.path_params["topic"])

    # The ingest hot path as a plain Starlette route placed before FastAPI's: same handler, same
    # exception handlers, minus FastAPI's per-request dependency solving (a path parameter and the
    # Request), which is a noticeable share of a one-event request. The APIRoute above stays for
    # the OpenAPI document and /docs.
    app.router.routes.insert(0, Route("/v1/topics/{topic:path}/events", events_fast_path, methods=["POST"]))

    async def ingest_events(request: Request, topic: str) -> Response:
        p = processor()
        headers = request.headers
        ct = headers.get("content-type", "")
        base = ct.partition(";")[0].strip().lower()
        body = await read_body(request, max_body)
        ctx = _ctx(request, "cloudevents")
        if base == CE_BATCH_CONTENT_TYPE:
            msgs = messages_from_batch(topic, body, p.config.max_batch, index_ids)
            if not msgs:
                return _json([])
            return _json(send_list_json(await p.send(ctx, msgs)))
        if base == CE_JSON_CONTENT_TYPE:
            msg = message_from_structured(topic, body)
        elif base.startswith("application/cloudevents") and "ce-specversion" not in headers:
            raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE",
                           f"event format {base!r} is not supported; use {CE_JSON_CONTENT_TYPE} or binary mode")
        else:
            ce_headers = {}
            for k, v in request.scope["headers"]:
                if k[:3] == b"ce-" or k == b"content-type":
                    ce_headers[k.decode("latin-1")] = _decode_header(v)
            if not any(k.startswith("ce-") for k in ce_headers):
                raise ApiError(400, "INVALID_CLOUDEVENT",
                               "not a CloudEvent: send ce-* headers (binary mode) or Content-Type "
                               f"{CE_JSON_CONTENT_TYPE} / {CE_BATCH_CONTENT_TYPE}")
            msg = message_from_binary(topic, ce_headers, body)
        if index_ids:
            key_by_event_id(msg)
        r = (await p.send(ctx, (msg,)))[0]
        return Response(_dumps(send_json(r)), media_type=JSON)

    @app.get("/v1/topics/{topic:path}/events", tags=["consume"], response_model=PopOut,
             responses=_messages_responses(PopOut, "the stored events with this id (JSON messages, or "
                                                   f"CloudEvents with Accept: {CE_BATCH_CONTENT_TYPE})"))
    async def find_events(
        request: Request,
        topic: str = Path(description="topic name"),
        id: str = Query(min_length=1, max_length=4096, description="the CloudEvents `id` attribute"),
        source: str | None = Query(None, description="only events with this `source` (id + source is unique)"),
        max: int = Query(32, ge=1, le=1024, description="most events to return"),
    ) -> Response:
        """Find stored CloudEvents by their `id` (and `source`), oldest first; `{"messages": []}` if none.

        Uses the message key index: events are found when they came in with
        `http_index_event_ids` on. With it off, an empty result is a 404
        `EVENT_IDS_NOT_INDEXED` saying so, rather than a misleading "no such event".
        """
        p = processor()
        ctx = _ctx(request, "http")
        await p.query_route(ctx, topic)  # 404 for an unknown topic, as pop and pull answer
        found = await p.query_messages_by_key(ctx, topic, id, max_count=max)
        found = [m for m in found
                 if m.properties.get("ce_id") == id and (source is None or m.properties.get("ce_source") == source)]
        found.sort(key=lambda m: (m.store_timestamp_ms, m.commitlog_offset))
        found = found[:max]
        if not found and not index_ids:
            raise ApiError(404, "EVENT_IDS_NOT_INDEXED",
                           "events are not indexed by id on this server: set http_index_event_ids = true "
                           "(events stored from then on are found)")
        if _wants_cloudevents(request):
            return _cloudevents_batch([(m, None) for m in found])
        return _json({"messages": [message_json(m) for m in found]})

    @app.post("/v1/topics/{topic:path}/messages", tags=["ingest"], openapi_extra=_MESSAGES_OPENAPI,
              response_model=SendOut, responses=_ERRORS)
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
        props: dict[str, str] = {}
        for k, v in request.scope["headers"]:
            if k.startswith(b"unimq-prop-") and len(k) > 11:
                props[k[11:].decode("latin-1")] = _decode_header(v)
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
        r = (await p.send(_ctx(request, "http"), (msg,)))[0]
        return _json(send_json(r))

    # -- pop consumption -------------------------------------------------------------------

    @app.post("/v1/topics/{topic:path}/groups/{group}/pop", tags=["consume"], response_model=PopOut,
              responses=_messages_responses(PopOut, "messages (JSON) or CloudEvents (with Accept: "
                                                    f"{CE_BATCH_CONTENT_TYPE})"))
    async def pop(
        request: Request,
        topic: str = Path(description="topic name"),
        group: str = Path(min_length=1, max_length=255, description="consumer group"),
        max: int = Query(32, ge=1, le=1024, description="most messages to return"),
        invisible_s: float = Query(30.0, ge=0, le=43_200, description="how long the messages stay hidden from the group"),
        wait_s: float = Query(0.0, ge=0, le=30, description="long-poll: wait up to this long for a first message"),
        tag: str | None = Query(None, description="tag filter expression (e.g. `A || B`)"),
        sql: str | None = Query(None, description="SQL92 filter over properties"),
    ) -> Response:
        """Receive messages for a consumer group; each is hidden for `invisible_s` until acked."""
        p = processor()
        _check_group(group)
        msgs = await p.pop(_ctx(request, "http"), group, topic, max, _ms(invisible_s), _filter(tag, sql), _ms(wait_s))
        if _wants_cloudevents(request):
            return _cloudevents_batch(
                [(pm.message, {"receipthandle": pm.receipt_handle, "deliveryattempt": str(pm.delivery_attempt)})
                 for pm in msgs]
            )
        return _json({"messages": [message_json(pm.message, pm.delivery_attempt, pm.receipt_handle) for pm in msgs]})

    @app.post("/v1/topics/{topic:path}/groups/{group}/ack", tags=["consume"], response_model=AckOut, responses=_ERRORS)
    async def ack(request: Request, body: AckIn, topic: str = Path(), group: str = Path(min_length=1)) -> Response:
        """Acknowledge popped messages by receipt handle; any unknown or expired handle makes it a 400."""
        p = processor()
        _check_group(group)
        ctx = _ctx(request, "http")
        acked = 0
        failed = []
        for h in body.receipt_handles:
            try:
                await p.ack(ctx, group, topic, h)
                acked += 1
            except UnimqError as e:
                failed.append({"receipt_handle": h, "error": e.code, "message": str(e)})
        if failed:
            first = failed[0]
            return _error(STATUS_OF_CODE.get(first["error"], 400), first["error"],
                          f"{len(failed)} of {len(body.receipt_handles)} receipt handles failed: {first['message']}",
                          acked=acked, failed=failed)
        return _json({"acked": acked})

    @app.post("/v1/topics/{topic:path}/groups/{group}/invisible", tags=["consume"], response_model=InvisibleOut,
              responses=_ERRORS)
    async def change_invisible(request: Request, body: InvisibleIn, topic: str = Path(),
                               group: str = Path(min_length=1)) -> Response:
        """Change a popped message's invisible time (0 releases it at once); answers the new receipt handle."""
        p = processor()
        _check_group(group)
        handle, _ = await p.change_invisible(_ctx(request, "http"), group, topic, body.receipt_handle,
                                             _ms(body.invisible_s))
        return _json({"receipt_handle": handle})

    # -- pull by offset ----------------------------------------------------------------------

    @app.get("/v1/topics/{topic:path}/queues/{queue}/messages", tags=["consume"], response_model=PullOut,
             responses=_messages_responses(PullOut, "messages from the offset", "application/vnd.apache.arrow.stream"))
    async def pull(
        request: Request,
        topic: str = Path(description="topic name"),
        queue: int = Path(ge=0, le=1023, description="queue id"),
        offset: int = Query(0, ge=0, le=2**62, description="first queue offset to read"),
        max: int = Query(32, ge=1, le=4096, description="most messages to return"),
        wait_s: float = Query(0.0, ge=0, le=30, description="long-poll when caught up"),
        tag: str | None = Query(None, description="tag filter expression"),
        sql: str | None = Query(None, description="SQL92 filter over properties"),
        format: Literal["json", "arrow"] = Query(
            "json", description="`arrow`: an Arrow IPC stream in the Spark source's table schema "
            "(gateway.arrow_schema; needs pyarrow), bounds in headers unimq-next-offset/-min-offset/-max-offset"),
    ) -> Response:
        """Read a queue by offset (what the Spark reader uses). `next_offset` is where to continue."""
        p = processor()
        if format == "arrow":  # the Spark source's fast page (gateway/arrow_pages.py builds it)
            page = await p.pull_arrow(_ctx(request, "http"), topic, queue, offset, max, _filter(tag, sql), _ms(wait_s))
            return Response(page.data, media_type=page.media_type, headers={
                "unimq-next-offset": str(page.next_offset), "unimq-min-offset": str(page.min_offset),
                "unimq-max-offset": str(page.max_offset)})
        r = await p.pull(_ctx(request, "http"), topic, queue, offset, max, _filter(tag, sql), _ms(wait_s))
        if _wants_cloudevents(request):
            return _cloudevents_batch([(m, None) for m in r.messages])
        return _json({
            "messages": [message_json(m) for m in r.messages],
            "next_offset": r.next_offset,
            "min_offset": r.min_offset,
            "max_offset": r.max_offset,
        })

    # -- a whole topic, every queue merged (registered after the queue route: its path is a suffix)

    @app.get("/v1/topics/{topic:path}/messages", tags=["consume"], responses=_ERRORS)
    async def read_topic(
        request: Request,
        topic: str = Path(description="topic name"),
        cursor: str | None = Query(None, description="where the previous page ended (its `cursor`); none: each queue's start"),
        max: int = Query(32, ge=1, le=4096, description="most messages to return"),
    ) -> Response:
        """Read a topic across all its queues, oldest stored first ("did my message arrive?").

        Answers `messages`, a `cursor` to pass back for the next page, and `remaining` (messages
        not read yet). Reading moves no consumer group: it is a look, like pull by offset."""
        p = processor()
        ctx = _ctx(request, "http")
        stats = await p.describe_topic(_ctx_admin, topic)
        offsets = {q.queue_id: q.min_offset for q in stats.queues}
        if cursor:
            try:
                given = json.loads(base64.urlsafe_b64decode(cursor.encode() + b"=" * (-len(cursor) % 4)))
                for k, v in given.items():  # never before a queue's start (retention moved it)
                    if int(k) in offsets and int(v) > offsets[int(k)]:
                        offsets[int(k)] = int(v)
            except (ValueError, TypeError, AttributeError):
                raise ApiError(400, "BAD_REQUEST", "cursor is not one this API gave") from None
        pages = []
        for q in stats.queues:
            if offsets[q.queue_id] < q.max_offset:
                r = await p.pull(ctx, topic, q.queue_id, offsets[q.queue_id], max)
                pages.append(r.messages)
        merged = list(heapq.merge(*pages, key=lambda m: (m.store_timestamp_ms, m.queue_id, m.queue_offset)))[:max]
        for m in merged:
            offsets[m.queue_id] = m.queue_offset + 1
        remaining = sum(q.max_offset - offsets[q.queue_id] for q in stats.queues if q.max_offset > offsets[q.queue_id])
        nxt = base64.urlsafe_b64encode(json.dumps(offsets, separators=(",", ":")).encode()).decode().rstrip("=")
        if _wants_cloudevents(request):
            return _cloudevents_batch([(m, None) for m in merged])
        return _json({"messages": [message_json(m) for m in merged], "cursor": nxt, "remaining": remaining})

    # -- describe / delete (registered last: their path matches any suffix) ---------------------

    @app.get("/v1/topics/{topic:path}", tags=["topics"], response_model=TopicOut, responses=_ERRORS)
    async def describe_topic(topic: str = Path(description="topic name")) -> Response:
        """A topic's type and its queues' min/max offsets."""
        p = processor()
        return _json(topic_json(await p.describe_topic(_ctx_admin, topic)))

    @app.delete("/v1/topics/{topic:path}", tags=["topics"], status_code=204, response_class=Response,
                responses=_ERRORS)
    async def delete_topic(topic: str = Path(description="topic name")) -> Response:
        """Delete a topic and its messages' queues."""
        p = processor()
        await p.describe_topic(_ctx_admin, topic)  # 404 for an unknown topic
        await p.delete_topic(_ctx_admin, topic)
        return Response(status_code=204)

    # -- push subscriptions -------------------------------------------------------------------

    @app.post("/v1/subscriptions", tags=["push"], status_code=201, responses=_ERRORS)
    async def create_subscription(body: SubscriptionIn) -> Response:
        """Push a topic's events to a webhook: at-least-once, retries with backoff, then the group's DLQ."""
        processor()
        return _json(await push.create(body.model_dump()), 201)

    @app.get("/v1/subscriptions", tags=["push"])
    async def list_subscriptions() -> Response:
        processor()
        return _json(push.list())

    @app.get("/v1/subscriptions/{sid}", tags=["push"], responses=_ERRORS)
    async def get_subscription(sid: str) -> Response:
        processor()
        return _json(push.get(sid))

    @app.delete("/v1/subscriptions/{sid}", tags=["push"], status_code=204, response_class=Response, responses=_ERRORS)
    async def delete_subscription(sid: str) -> Response:
        processor()
        await push.delete(sid)
        return Response(status_code=204)

    return app


_ctx_admin = RequestContext(protocol="http", client_id="admin")
