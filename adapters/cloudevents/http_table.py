"""The HTTP door's view of a COMPACTED topic as a table, and its admin trigger to compact now.

Why a route of its own rather than a pull option: a table row is "the latest
message of a key", which only the broker's compaction knows how to find
cheaply (``core_broker/compaction.py``); paging walks the topic's queues one
after the other with an opaque ``cursor``, as the topic read does.
"""

from __future__ import annotations

import base64
import json

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from .http_errors import ApiError
from .http_models import ERRORS
from .http_request import Deps, request_context
from .http_responses import json_response, message_json

__all__ = ["router"]


def _cursor_out(queue_id: int, offset: int) -> str:
    raw = json.dumps({"q": queue_id, "o": offset}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _cursor_in(cursor: str) -> tuple[int, int]:
    try:
        d = json.loads(base64.urlsafe_b64decode(cursor.encode() + b"=" * (-len(cursor) % 4)))
        q, o = int(d["q"]), int(d["o"])
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ApiError(400, "BAD_REQUEST", "cursor is not one this API gave") from None
    if q < 0 or o < 0:
        raise ApiError(400, "BAD_REQUEST", "cursor is not one this API gave")
    return q, o


def router(deps: Deps) -> APIRouter:
    """``GET /v1/topics/{topic}/table`` and ``POST /v1/topics/{topic}/compact``."""
    processor = deps.processor
    router = APIRouter()

    @router.get("/v1/topics/{topic:path}/table", tags=["consume"], responses=ERRORS)
    async def read_table(
        request: Request,
        topic: str = Path(description="a COMPACTED topic"),
        cursor: str | None = Query(None, description="where the previous page ended (its `cursor`); none: the start"),
        max: int = Query(256, ge=1, le=4096, description="most rows to return"),
    ) -> Response:
        """A COMPACTED topic read as a table: the latest message of every key, deleted keys left out.

        Answers `rows` (each a message with its `key`) and `cursor`, to pass back for the next
        page; `cursor` is null once every queue is read. A key written while the table is read
        may come twice (its older value, then its newer one, in that order)."""
        p = processor()
        ctx = request_context(request, "http")
        stats = await p.describe_topic(ctx, topic)
        if stats.config.message_type.value != "COMPACTED":
            raise ApiError(400, "BAD_REQUEST", f"topic {topic!r} is {stats.config.message_type.value}, not COMPACTED")
        queues = sorted(q.queue_id for q in stats.queues)
        q_at, offset = _cursor_in(cursor) if cursor else (queues[0] if queues else 0, 0)
        rows: list[dict] = []
        nxt: str | None = None
        for qid in (q for q in queues if q >= q_at):
            off = offset if qid == q_at else 0
            while len(rows) < max:
                r = await p.read_table(ctx, topic, qid, off, max - len(rows))
                for m in r.messages:
                    row = message_json(m)
                    row["key"] = m.keys[0] if m.keys else None
                    rows.append(row)
                if r.next_offset <= off or r.next_offset >= r.max_offset:
                    off = r.next_offset
                    break
                off = r.next_offset
            if len(rows) >= max:
                more = off < next(q.max_offset for q in stats.queues if q.queue_id == qid) or qid != queues[-1]
                nxt = _cursor_out(qid, off) if more else None
                break
        return json_response({"rows": rows, "cursor": nxt})

    @router.post("/v1/topics/{topic:path}/compact", tags=["topics"], responses=ERRORS)
    async def compact(request: Request, topic: str = Path(description="a COMPACTED topic")) -> Response:
        """Compact a COMPACTED topic now, as far as it can go (the segment being written never is):
        answers `passes`, `queues` and `removed` (messages dropped). Runs until done."""
        return json_response(await processor().compact_topic(request_context(request, "http"), topic))

    return router
