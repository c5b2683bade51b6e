"""``GET /v1/messages/{id}/trace`` (and the same under ``/v1/admin``): a traced message's
timeline across doors (gateway/trace.py), for the console's search page and
``unimq admin messages trace``.

Why its own module: one read-only concern served at two places (the messaging API, where a
user who may read the topic asks it, and the admin API the console and the CLI read); the
processor's ``message_trace`` decides who may see it.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from gateway.trace import BROKER_DOOR

from .http_errors import ApiError
from .http_models import ERRORS
from .http_request import Deps, request_context
from .http_responses import json_response

__all__ = ["router", "trace_view"]


def trace_view(message_id: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    """The answer: the events in time order, with the doors they went through in that order
    (a broker's own events, its retries and dead letters, are not a door's)."""
    doors: list[str] = []
    for e in events:
        d = str(e.get("door", ""))
        if d and d != BROKER_DOOR and d not in doors:
            doors.append(d)
    return {"message_id": message_id, "topic": events[0].get("topic") if events else None,
            "doors": doors, "events": events}


def router(deps: Deps, prefix: str = "/v1", not_found: bool = True) -> APIRouter:
    """The trace route under ``prefix``; ``not_found``: a message without events is a 404
    (the messaging API), else an empty timeline (the admin API: the console asks for every
    message it shows, and a browser logs each 404 as an error)."""
    r = APIRouter(tags=["messages"])

    @r.get(prefix + "/messages/{message_id}/trace", responses=ERRORS)
    async def message_trace(request: Request, message_id: str = Path(min_length=1, max_length=128,
                                                                     description="the message id")) -> Response:
        """A traced message's life in time order: stored (by which door and client, on which
        broker), delivered (to which consumer or group, over which door, pop or pull), acked,
        retried, dead-lettered, expired. No event (its topic is not traced, it was not sampled,
        or the id is unknown): 404 ``NOT_TRACED`` under ``/v1``, an empty list under ``/v1/admin``."""
        ctx = request_context(request, "http")
        events = await deps.processor().message_trace(ctx, message_id)
        if not events and not_found:
            raise ApiError(404, "NOT_TRACED", f"no trace of message {message_id!r} (is its topic traced?)")
        return json_response(trace_view(message_id, events))

    return r
