"""The HTTP door's reads that move no consumer group: by queue offset (JSON or Arrow pages),
a whole topic merged across its queues, and stored CloudEvents by id.

Why together: each is a look at what is stored, resumable from what it
answered (``next_offset``, a ``cursor``), which is what the Spark source and
"did my message arrive?" need. Arrow pages (``format=arrow``) are built by the
processor (``MessagingAPI.pull_arrow``, ``gateway/arrow_pages.py``); this door
only serves them.
"""

from __future__ import annotations

import base64
import heapq
import json
from typing import Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from .http_errors import ApiError
from .http_models import ERRORS, PopOut, PullOut, messages_responses
from .http_request import Deps, filter_of, millis, request_context
from .http_responses import cloudevents_batch, json_response, message_json, wants_cloudevents
from .mapping import CE_BATCH_CONTENT_TYPE

#: Largest pull page by offset: JSON pages (a dict per message) stay small; Arrow pages are
#: columns built in bulk, and a bigger page halves the per-request cost of the Spark source
#: (the request, the page's fixed work, the worker's IPC hand-off): measured 0.5 ms a page on
#: each side on the loaded 2-core bench machine.
MAX_JSON_PAGE = 4096
MAX_ARROW_PAGE = 65536

__all__ = ["router"]


def router(deps: Deps) -> APIRouter:
    """Find events by id, pull a queue by offset, read a topic across its queues."""
    processor, index_ids = deps.processor, deps.index_ids
    router = APIRouter()

    @router.get("/v1/topics/{topic:path}/events", tags=["consume"], response_model=PopOut,
                responses=messages_responses(PopOut, "the stored events with this id (JSON messages, or "
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
        ctx = request_context(request, "http")
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
        if wants_cloudevents(request):
            return cloudevents_batch([(m, None) for m in found])
        return json_response({"messages": [message_json(m) for m in found]})


    @router.get("/v1/topics/{topic:path}/queues/{queue}/messages", tags=["consume"], response_model=PullOut,
                responses=messages_responses(PullOut, "messages from the offset", "application/vnd.apache.arrow.stream"))
    async def pull(
        request: Request,
        topic: str = Path(description="topic name"),
        queue: int = Path(ge=0, le=1023, description="queue id"),
        offset: int = Query(0, ge=0, le=2**62, description="first queue offset to read"),
        max: int = Query(32, ge=1, le=MAX_ARROW_PAGE, description="most messages to return (at most "
                         f"{MAX_JSON_PAGE} in JSON, {MAX_ARROW_PAGE} in Arrow pages)"),
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
            page = await p.pull_arrow(request_context(request, "http"), topic, queue, offset, max,
                                      filter_of(tag, sql), millis(wait_s))
            return Response(page.data, media_type=page.media_type, headers={
                "unimq-next-offset": str(page.next_offset), "unimq-min-offset": str(page.min_offset),
                "unimq-max-offset": str(page.max_offset)})
        r = await p.pull(request_context(request, "http"), topic, queue, offset, min(max, MAX_JSON_PAGE),
                         filter_of(tag, sql), millis(wait_s))
        if wants_cloudevents(request):
            return cloudevents_batch([(m, None) for m in r.messages])
        return json_response({
            "messages": [message_json(m) for m in r.messages],
            "next_offset": r.next_offset,
            "min_offset": r.min_offset,
            "max_offset": r.max_offset,
        })

    # -- a whole topic, every queue merged (registered after the queue route: its path is a suffix)

    @router.get("/v1/topics/{topic:path}/messages", tags=["consume"], responses=ERRORS)
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
        ctx = request_context(request, "http")
        stats = await p.describe_topic(ctx, topic)
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
        if wants_cloudevents(request):
            return cloudevents_batch([(m, None) for m in merged])
        return json_response({"messages": [message_json(m) for m in merged], "cursor": nxt, "remaining": remaining})


    return router
