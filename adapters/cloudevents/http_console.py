"""The JSON admin API (``/v1/admin/...``): what the console (``/ui``) and ``unimq admin`` read.

Why its own router, mounted as its own small app (:func:`app`, with its OpenAPI document at
``/v1/admin/openapi.json`` and docs at ``/v1/admin/docs``): it is one concern (operating the
server, not messaging), to be guarded by the admin permission as a whole, and the messaging
API's document stays what messaging clients read.
Every answer comes from the processor's typed calls (``gateway/api.py``) and the doors' client
tables (``gateway/clients.py``); shapes are built in ``admin_views.py``. Lists take
``q`` (a substring of the name), ``offset`` and ``limit`` and answer ``{"total", "items"}``.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from core_broker.errors import UnimqError
from core_broker.system_topics import is_system_topic
from gateway.api import BrokerInfo, ClusterView
from gateway.auth import Action, Resource
from gateway.clients import ClientInfo

from . import admin_views as views
from .http_errors import ApiError
from .http_models import ERRORS
from .http_request import Deps, check_group, request_context
from .http_responses import json_response
from .push import PushManager

__all__ = ["PushClients", "router"]

MAX_INT = 2**62  # offsets and times: what the store and the RPC carry
_LIMIT = Query(50, ge=1, le=1000, description="items per page")
_OFFSET = Query(0, ge=0, description="items to skip")
_FILTER = Query("", description="only names containing this")


class ResetIn(BaseModel):
    """Where to move a consumer group: exactly one of ``offset`` and ``timestamp_ms``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"topic": "orders", "offset": 0}, {"topic": "orders", "timestamp_ms": 1760000000000, "queue_id": 3}]})

    topic: StrictStr = Field(min_length=1)
    queue_id: StrictInt | None = Field(None, ge=0, le=MAX_INT, description="one queue (default: every queue)")
    offset: StrictInt | None = Field(None, ge=0, le=MAX_INT, description="clamped to each queue's bounds")
    timestamp_ms: StrictInt | None = Field(None, ge=0, le=MAX_INT,
                                           description="the first message stored at or after this time")


class ResendIn(BaseModel):
    """Which dead letters to send again, and where."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"topic": "orders", "max": 100}]})

    topic: StrictStr | None = Field(None, min_length=1, description="default: the one topic the group consumes")
    max: StrictInt = Field(100, ge=1, le=100_000)


class PushClients:
    """Push subscriptions as the HTTP door's clients (:class:`gateway.clients.ClientSource`)."""

    door = "http"

    def __init__(self, push: PushManager) -> None:
        self.push = push

    def ids(self) -> list[str]:
        return list(self.push.subs)

    def describe(self, client_id: str) -> ClientInfo | None:
        sub = self.push.subs.get(client_id)
        if sub is None:
            return None
        runner = self.push.runners.get(client_id)
        stats = {o: n for (sid, o), n in list(self.push.stats.items()) if sid == client_id}
        return ClientInfo("http", client_id, runner is not None, sub["sink"], "",
                          {"kind": "push subscription", "topic": sub["topic"], "group": sub["group"],
                           "sink": sub["sink"], "inflight": runner.inflight if runner is not None else 0,
                           "deliveries": stats})

    def connections(self) -> int:
        return len(self.push.runners)

    async def disconnect(self, client_id: str) -> bool:
        return False  # a subscription is deleted (DELETE /v1/subscriptions/{id}), not disconnected


def router(deps: Deps) -> APIRouter:
    """Overview, topics, groups (reset, resend), clients (disconnect), messages, cluster."""
    processor = deps.processor
    state = deps.state
    meter = views.RateMeter()
    controller_addr: str = getattr(state.settings, "http_admin_controller", "")
    r = APIRouter(tags=["admin"])

    async def replicated_groups() -> tuple[list[dict[str, Any]], str | None]:
        """The controller's groups (none without ``http_admin_controller``), or why not."""
        if not controller_addr:
            return [], None
        try:
            return await views.controller_groups(controller_addr), None
        except (OSError, UnimqError) as e:
            return [], f"controller {controller_addr}: {e}"

    def retention_hours() -> float:
        return float(state.settings.store.retention_hours)

    @r.get("/overview", responses=ERRORS)
    async def overview(request: Request) -> Response:
        """Messages in/out (totals and per second) and connections per door, store size and disk
        headroom, brokers, counts of topics and groups."""
        ctx = request_context(request, "http")
        p = processor()
        totals = views.door_totals(p.metrics.counters)
        flat = {f"{d}/{k}": v for d, c in totals.items() for k, v in c.items() if k in ("messages_in", "messages_out")}
        rates = meter.rates(flat)
        conns = state.clients.connections()
        doors: dict[str, dict[str, Any]] = {}
        for d in sorted(set(totals) | set(conns) | {"mqtt", "amqp", "http", "grpc"}):
            c = totals.get(d, {})
            doors[d] = {"messages_in": c.get("messages_in", 0), "messages_out": c.get("messages_out", 0),
                        "bytes_in": c.get("bytes_in", 0), "bytes_out": c.get("bytes_out", 0),
                        "in_per_s": rates.get(f"{d}/messages_in", 0.0), "out_per_s": rates.get(f"{d}/messages_out", 0.0),
                        "connections": conns.get(d, 0)}
        if "cloudevents" in doors:  # CloudEvents come in through the HTTP door
            ce = doors.pop("cloudevents")
            for k in ("messages_in", "messages_out", "bytes_in", "bytes_out", "in_per_s", "out_per_s"):
                doors["http"][k] = round(doors["http"][k] + ce[k], 2)
        stats = await p.store_stats(ctx)
        cluster = await p.cluster(ctx)
        replication, _ = await replicated_groups()
        groups = views.group_rows(await p.consumer_groups(ctx))
        return json_response({
            "time_ms": int(time.time() * 1000), "phase": state.phase,
            "doors": doors,
            "store": {k: stats.get(k) for k in ("commitlog_bytes", "disk_total_bytes", "disk_free_bytes")},
            "brokers": [BrokerInfo(*b)._asdict() for b in ClusterView(*cluster).brokers],
            "replication": [{"group": g["group"], "master": g["master"], "in_sync": g["in_sync"],
                             "members": len(g["members"]),
                             "max_lag": max((m["lag"] or 0 for m in g["members"]), default=0)} for g in replication],
            "topics": len(await p.list_topics(ctx, False)),
            "groups": len(groups), "lag": sum(g["lag"] for g in groups.values()),
            "listening": {k: f"{h}:{port}" for k, (h, port) in state.listening.items()},
        })

    @r.get("/topics", responses=ERRORS)
    async def topics(request: Request, q: str = _FILTER, offset: int = _OFFSET, limit: int = _LIMIT,
                     include_system: bool = Query(False, description="also %DLQ%, %RETRY% and other system topics")
                     ) -> Response:
        """Topics (a page, by name): type, queues with offsets, messages, retention, consumer groups."""
        ctx = request_context(request, "http")
        p = processor()
        names = sorted(t.name for t in await p.list_topics(ctx, include_system) if q in t.name)
        total, names_page = views.page(names, offset, limit)
        rows = await views.topic_rows(p, ctx, names_page, await p.consumer_groups(ctx), retention_hours())
        return json_response({"total": total, "items": rows})

    @r.get("/topics/{topic:path}", responses=ERRORS)
    async def topic(request: Request, topic: str = Path(description="topic name")) -> Response:
        """One topic as a row of ``/topics``."""
        ctx = request_context(request, "http")
        p = processor()
        rows = await views.topic_rows(p, ctx, [topic], await p.consumer_groups(ctx), retention_hours())
        if not rows:
            raise ApiError(404, "TOPIC_NOT_FOUND", f"topic {topic!r} not found")
        return json_response(rows[0])

    @r.get("/groups", responses=ERRORS)
    async def groups(request: Request, q: str = _FILTER, offset: int = _OFFSET, limit: int = _LIMIT,
                     topic: str = Query("", description="only groups consuming this topic")) -> Response:
        """Consumer groups (a page): topics, lag, in flight, retry backlog, dead letters."""
        ctx = request_context(request, "http")
        p = processor()
        all_groups = views.group_rows(await p.consumer_groups(ctx))
        picked = [g for name, g in sorted(all_groups.items())
                  if q in name and (not topic or topic in g["topics"]) and not name.startswith("%")]
        total, rows = views.page(picked, offset, limit)
        await views.add_dead_letters(p, ctx, rows)
        return json_response({"total": total, "items": [{k: v for k, v in g.items() if k != "queues"} for g in rows]})

    @r.get("/groups/{group}", responses=ERRORS)
    async def group(request: Request, group: str = Path(description="consumer group")) -> Response:
        """One group with its queues: consumer offset, max offset, lag, in flight."""
        ctx = request_context(request, "http")
        p = processor()
        g = views.group_rows(await p.consumer_groups(ctx)).get(group)
        if g is None:
            raise ApiError(404, "GROUP_NOT_FOUND", f"consumer group {group!r} not found")
        await views.add_dead_letters(p, ctx, [g])
        return json_response(g)

    @r.post("/groups/{group}/reset", responses=ERRORS)
    async def reset(request: Request, body: ResetIn, group: str = Path(description="consumer group")) -> Response:
        """Move a group on a topic (``queue_id`` for one queue, else all) to ``offset`` or to the
        first message stored at or after ``timestamp_ms``; messages after it are delivered again."""
        ctx = request_context(request, "http")
        check_group(group)
        if (body.offset is None) == (body.timestamp_ms is None):
            raise ApiError(400, "BAD_REQUEST", "give exactly one of 'offset' and 'timestamp_ms'")
        moved = await processor().reset_offset(ctx, group, body.topic, body.queue_id, offset=body.offset,
                                               timestamp_ms=body.timestamp_ms)
        return json_response({"group": group, "topic": body.topic,
                              "queues": [{"queue_id": q, "offset": o} for q, o in moved]})

    @r.post("/groups/{group}/resend-dlq", responses=ERRORS)
    async def resend(request: Request, body: ResendIn | None = None, group: str = Path(description="consumer group")) -> Response:
        """Send the group's dead letters (``%DLQ%<group>``) again to ``topic`` (default: the one
        topic the group consumes), at most ``max`` (100); each leaves the dead-letter topic."""
        ctx = request_context(request, "http")
        check_group(group)
        body = body or ResendIn()
        p = processor()
        topic = body.topic
        if topic is None:
            g = views.group_rows(await p.consumer_groups(ctx)).get(group)
            mine = g["topics"] if g is not None else []
            if len(mine) != 1:
                raise ApiError(400, "BAD_REQUEST", f"group {group!r} consumes {len(mine)} topics: name 'topic'")
            topic = mine[0]
        if is_system_topic(topic):
            raise ApiError(400, "BAD_REQUEST", "dead letters go back to an application topic")
        sent = await views.resend_dead_letters(p, ctx, group, topic, body.max, f"unimq-admin-resend-{group}")
        return json_response({"group": group, "topic": topic, "resent": sent})

    @r.get("/clients", responses=ERRORS)
    async def clients(request: Request, door: str = Query("", description="mqtt, amqp, grpc or http (push subscriptions)"),
                      q: str = _FILTER, offset: int = _OFFSET, limit: int = _LIMIT) -> Response:
        """Clients of every door (a page): MQTT sessions with subscriptions, AMQP connections with
        channels, gRPC clients, push subscriptions; and open connections per door."""
        ctx = request_context(request, "http")
        processor().authorize(ctx, Action.ADMIN, Resource.CLUSTER, "clients")
        pg = state.clients.page(door, q, offset, limit)
        return json_response({"total": pg.total, "items": [c.to_json() for c in pg.clients],
                              "connections": state.clients.connections()})

    @r.post("/clients/{door}/{client_id:path}/disconnect", responses=ERRORS)
    async def disconnect(request: Request, door: str = Path(description="mqtt, amqp or grpc"),
                         client_id: str = Path(description="the client id (AMQP: the peer address)")) -> Response:
        """Close a client's connection (an MQTT session stays; its will is published)."""
        processor().authorize(request_context(request, "http"), Action.ADMIN, Resource.CLUSTER, "clients")
        source = state.clients.source(door)
        if source is None:
            raise ApiError(404, "NOT_FOUND", f"no door {door!r} here")
        if not await source.disconnect(client_id):
            raise ApiError(404, "CLIENT_NOT_FOUND", f"no connected {door} client {client_id!r}")
        return json_response({"door": door, "client_id": client_id, "disconnected": True})

    @r.get("/messages", responses=ERRORS)
    async def messages(request: Request, id: str = Query("", description="a message id"),
                       key: str = Query("", description="a message key (with topic)"),
                       topic: str = Query("", description="the topic to search by key or time"),
                       begin_ms: int = Query(0, ge=0, le=MAX_INT), end_ms: int = Query(MAX_INT, ge=0, le=MAX_INT),
                       max: int = Query(32, ge=1, le=1000)) -> Response:
        """Find messages by id, by key (in a topic), or by store time (in a topic): body as text,
        JSON and hex, properties, and the door it came in by (``protocol``)."""
        ctx = request_context(request, "http")
        p = processor()
        if id:
            m = await p.query_message_by_id(ctx, id)
            found = [m] if m is not None else []
        elif key and topic:
            found = await p.query_messages_by_key(ctx, topic, key, begin_ms, end_ms, max)
        elif topic:
            found = await views.search_by_time(p, ctx, topic, begin_ms, end_ms, max)
        else:
            raise ApiError(400, "BAD_REQUEST", "give 'id', or 'topic' with 'key' or a time range")
        return json_response({"items": [views.message_view(m) for m in found]})

    @r.get("/cluster", responses=ERRORS)
    async def cluster(request: Request) -> Response:
        """Nameservers, brokers (writable, replicated, live) and, with ``http_admin_controller``
        set, each replicated group's master and in-sync set from the controller."""
        ctx = request_context(request, "http")
        p = processor()
        view = ClusterView(*await p.cluster(ctx))
        groups, error = await replicated_groups()
        return json_response({"nameservers": list(view.nameservers),
                              "brokers": [BrokerInfo(*b)._asdict() for b in view.brokers],
                              "groups": groups, "controller_error": error,
                              "listening": {k: f"{h}:{port}" for k, (h, port) in state.listening.items()}})

    return r
