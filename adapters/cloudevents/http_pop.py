"""The HTTP door's pop consumption routes: pop for a consumer group, ack, change invisible time.

Why a router of its own: these are the routes with consumer-group state (a
popped message stays hidden from the group until acked or its invisible time
ends), unlike the reads by offset in ``http_read.py``, which move nothing.
"""

from __future__ import annotations

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from core_broker.errors import UnimqError

from .http_errors import STATUS_OF_CODE, error_response
from .http_models import ERRORS, AckIn, AckOut, InvisibleIn, InvisibleOut, PopOut, messages_responses
from .http_request import Deps, check_group, filter_of, millis, request_context
from .http_responses import cloudevents_batch, json_response, message_json, wants_cloudevents
from .mapping import CE_BATCH_CONTENT_TYPE

__all__ = ["router"]


def router(deps: Deps) -> APIRouter:
    """Pop, ack and change-invisible for a consumer group of a topic."""
    processor = deps.processor
    router = APIRouter()

    # -- pop consumption -------------------------------------------------------------------

    @router.post("/v1/topics/{topic:path}/groups/{group}/pop", tags=["consume"], response_model=PopOut,
                 responses=messages_responses(PopOut, "messages (JSON) or CloudEvents (with Accept: "
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
        check_group(group)
        msgs = await p.pop(request_context(request, "http"), group, topic, max, millis(invisible_s),
                           filter_of(tag, sql), millis(wait_s))
        if wants_cloudevents(request):
            return cloudevents_batch(
                [(pm.message, {"receipthandle": pm.receipt_handle, "deliveryattempt": str(pm.delivery_attempt)})
                 for pm in msgs]
            )
        return json_response(
            {"messages": [message_json(pm.message, pm.delivery_attempt, pm.receipt_handle) for pm in msgs]})

    @router.post("/v1/topics/{topic:path}/groups/{group}/ack", tags=["consume"], response_model=AckOut, responses=ERRORS)
    async def ack(request: Request, body: AckIn, topic: str = Path(), group: str = Path(min_length=1)) -> Response:
        """Acknowledge popped messages by receipt handle; any unknown or expired handle makes it a 400."""
        p = processor()
        check_group(group)
        ctx = request_context(request, "http")
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
            return error_response(
                STATUS_OF_CODE.get(first["error"], 400), first["error"],
                f"{len(failed)} of {len(body.receipt_handles)} receipt handles failed: {first['message']}",
                acked=acked, failed=failed)
        return json_response({"acked": acked})

    @router.post("/v1/topics/{topic:path}/groups/{group}/invisible", tags=["consume"], response_model=InvisibleOut,
                 responses=ERRORS)
    async def change_invisible(request: Request, body: InvisibleIn, topic: str = Path(),
                               group: str = Path(min_length=1)) -> Response:
        """Change a popped message's invisible time (0 releases it at once); answers the new receipt handle."""
        p = processor()
        check_group(group)
        handle, _ = await p.change_invisible(request_context(request, "http"), group, topic, body.receipt_handle,
                                             millis(body.invisible_s))
        return json_response({"receipt_handle": handle})


    return router
