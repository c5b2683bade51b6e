"""What the HTTP door's routes read from a request, and what they share from their server.

Why: every router needs the same few things: the processor, once the process
is ready (:class:`Deps`, 503 before that), the caller's context, a bounded
body, and the query parameters every consuming route takes the same way
(filters, group names, seconds as milliseconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from fastapi import Request

from core_broker.model import FilterExpression, FilterType, Message
from gateway.api import MessagingAPI
from gateway.context import RequestContext

from .http_auth import context_of
from .http_errors import ApiError

if TYPE_CHECKING:  # imported for type hints only
    from gateway.door import ServerState

__all__ = [
    "Deps", "check_group", "decode_header", "filter_of", "millis", "read_body", "request_context",
]

@dataclass
class Deps:
    """What the routes of one app share: the server's state and the door's settings."""

    state: ServerState[Any]
    max_body: int  # http_max_body_bytes
    index_ids: bool  # http_index_event_ids

    @classmethod
    def of(cls, state: ServerState[Any]) -> Deps:
        settings = state.settings
        return cls(state, getattr(settings, "http_max_body_bytes", 16 * 1024 * 1024),
                   getattr(settings, "http_index_event_ids", False))

    async def admit(self, ctx: RequestContext, msgs: Sequence[Message]) -> None:
        """Hold a publish back while its caller is over its rate; 429 when that persists
        (``gateway.access.traffic``; nothing to do when no limit is set)."""
        ids = self.state.identities
        if ids is not None and ids.traffic.active and not ctx.trusted:
            await ids.traffic.admit(ctx.principal, ctx.client_id, len(msgs), sum(len(m.body) for m in msgs),
                                    ctx.protocol, self.processor().metrics)

    def processor(self) -> MessagingAPI:
        """The processor, or 503 while the process is not ready (starting or stopping)."""
        state = self.state
        p = state.processor
        if p is None or not state.ready:
            raise ApiError(503, "SERVICE_UNAVAILABLE", f"unimq is {state.phase}")
        return p


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


def decode_header(v: bytes) -> str:
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        return v.decode("latin-1")


def request_context(request: Request, protocol: str) -> RequestContext:
    """Who is calling (as :class:`~.http_auth.AuthMiddleware` established), from where."""
    return context_of(request.scope, protocol)


def filter_of(tag: str | None, sql: str | None) -> FilterExpression | None:
    if tag is not None and sql is not None:
        raise ApiError(400, "BAD_REQUEST", "give a 'tag' or an 'sql' filter, not both")
    if sql is not None:
        return FilterExpression(sql, FilterType.SQL92)
    if tag is not None:
        return FilterExpression(tag, FilterType.TAG)
    return None


def check_group(group: str) -> None:
    """Group names become part of retry and dead-letter topic names: same rules as topics, no '%' lead."""
    if not group or len(group) > 200 or group.startswith("%") or any(ord(c) < 32 or ord(c) == 127 for c in group):
        raise ApiError(400, "BAD_REQUEST",
                       "a consumer group name is 1 to 200 characters, without control characters, not starting with '%'")


def millis(seconds: float) -> int:
    return int(round(seconds * 1000))
