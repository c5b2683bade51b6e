"""Push subscriptions: the gateway pops a topic for a consumer group and POSTs each event to a webhook.

Why delivery runs here and not in the broker: a push subscription is nothing
but a pop consumer whose "client" is an HTTP endpoint, so it reuses pop
semantics as they are (receipt handles, invisible time, per-group cursors,
dead-letter topic) and needs no broker feature of its own. What must survive a
restart is the subscription itself, kept with the processor's ``kv_put``, and
the group's pop state, which the broker already keeps.

Delivery is at-least-once: a message is acked only after a 2xx answer. Any
other answer, a timeout or a connection error is retried with exponential
backoff (the message is kept invisible with ``change_invisible`` meanwhile, so
no other consumer of the group takes it); after ``max_attempts`` it is
forwarded to the group's dead-letter topic ``%DLQ%<group>``. If the gateway
stops mid-retry, the message becomes visible again when its invisible time
runs out and is delivered again after the restart.

Filters follow the CloudEvents Subscriptions API dialects ``exact``,
``prefix``, ``suffix`` and the combinators ``all``, ``any`` and ``not``,
evaluated on the CloudEvent attributes of each message (so a message that came
in by MQTT is filtered on its derived ``type``/``source``/``subject``); a
message that does not match is acked without delivery.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections import defaultdict
from typing import Any, Mapping
from urllib.parse import urlsplit

import httpx

from core_broker.errors import BadRequestError, TopicNotFoundError, UnimqError
from gateway.api import MessagingAPI
from gateway.context import RequestContext

from .mapping import CE_JSON_CONTENT_TYPE, event_attributes, to_binary_http, to_structured_json

log = logging.getLogger("unimq.http.push")

KV_NAMESPACE = "http.push"
CTX = RequestContext(protocol="cloudevents", client_id="unimq-push", trusted=True)
POLL_WAIT_MS = 5_000

DEFAULTS: dict[str, Any] = {
    "mode": "binary",
    "max_attempts": 5,
    "initial_backoff_ms": 500,
    "max_backoff_ms": 60_000,
    "timeout_s": 10.0,
    "max_inflight": 16,
    "start": "latest",
}
LIMITS: dict[str, tuple[float, float]] = {
    "max_attempts": (1, 100),
    "initial_backoff_ms": (1, 3_600_000),
    "max_backoff_ms": (1, 86_400_000),
    "timeout_s": (0.1, 300.0),
    "max_inflight": (1, 256),
}
DIALECTS = ("exact", "prefix", "suffix", "all", "any", "not")


class SubscriptionError(BadRequestError):
    code = "INVALID_SUBSCRIPTION"


class SubscriptionNotFoundError(UnimqError):
    code = "SUBSCRIPTION_NOT_FOUND"


# ------------------------------------------------------------------------------ filters


def validate_filter(f: Any, where: str = "filters") -> None:
    """Raise SubscriptionError unless ``f`` is one filter expression of a supported dialect."""
    if not isinstance(f, dict) or len(f) != 1:
        raise SubscriptionError(f"{where}: a filter is an object with exactly one dialect key ({', '.join(DIALECTS)})")
    (dialect, arg), = f.items()
    if dialect in ("exact", "prefix", "suffix"):
        if not isinstance(arg, dict) or not arg:
            raise SubscriptionError(f"{where}.{dialect}: must map attribute names to string values")
        for k, v in arg.items():
            if not isinstance(v, str) or not k:
                raise SubscriptionError(f"{where}.{dialect}.{k}: the value must be a string")
    elif dialect in ("all", "any"):
        if not isinstance(arg, list) or not arg:
            raise SubscriptionError(f"{where}.{dialect}: must be a non-empty list of filters")
        for i, sub in enumerate(arg):
            validate_filter(sub, f"{where}.{dialect}[{i}]")
    elif dialect == "not":
        validate_filter(arg, f"{where}.not")
    elif dialect == "sql":
        raise SubscriptionError(f"{where}: the 'sql' (CESQL) dialect is not supported; use exact, prefix, suffix, all, any, not")
    else:
        raise SubscriptionError(f"{where}: unknown filter dialect {dialect!r}; supported: {', '.join(DIALECTS)}")


def matches(f: Mapping[str, Any], attrs: Mapping[str, str]) -> bool:
    """Evaluate one filter on a CloudEvent's attributes (strings)."""
    (dialect, arg), = f.items()
    if dialect == "exact":
        return all(attrs.get(k) == v for k, v in arg.items())
    if dialect == "prefix":
        return all((a := attrs.get(k)) is not None and a.startswith(v) for k, v in arg.items())
    if dialect == "suffix":
        return all((a := attrs.get(k)) is not None and a.endswith(v) for k, v in arg.items())
    if dialect == "all":
        return all(matches(x, attrs) for x in arg)
    if dialect == "any":
        return any(matches(x, attrs) for x in arg)
    if dialect == "not":
        return not matches(arg, attrs)
    return False


# ------------------------------------------------------------------------------ subscriptions


def normalize(spec: Mapping[str, Any], allowed_hosts: list[str]) -> dict[str, Any]:
    """Validate a subscription request and fill in defaults; raises SubscriptionError."""
    topic = spec.get("topic")
    if not isinstance(topic, str) or not topic:
        raise SubscriptionError("'topic' is required")
    sink = spec.get("sink")
    if not isinstance(sink, str) or not sink:
        raise SubscriptionError("'sink' (the webhook URL) is required")
    try:
        u = urlsplit(sink)
        host = u.hostname
        _ = u.port
    except ValueError as e:
        raise SubscriptionError(f"'sink' is not a valid URL: {e}") from None
    if u.scheme not in ("http", "https") or not host:
        raise SubscriptionError("'sink' must be an absolute http:// or https:// URL")
    if allowed_hosts and "*" not in allowed_hosts and host not in allowed_hosts:
        raise SubscriptionError(f"sink host {host!r} is not allowed (http_push_allowed_hosts: {', '.join(allowed_hosts)})")
    protocol = spec.get("protocol", "HTTP")
    if protocol not in ("HTTP", "http"):
        raise SubscriptionError("only the 'HTTP' delivery protocol is supported")
    out: dict[str, Any] = {"topic": topic, "sink": sink, "protocol": "HTTP"}
    group = spec.get("group")
    if group is not None and (
        not isinstance(group, str) or not group or group.startswith("%") or len(group) > 200
        or any(ord(c) < 32 or ord(c) == 127 for c in group)
    ):
        raise SubscriptionError("'group' must be a non-empty consumer group name (not starting with '%')")
    out["group"] = group
    filters = spec.get("filters", [])
    if filters is None:
        filters = []
    if not isinstance(filters, list):
        raise SubscriptionError("'filters' must be a list of filter expressions")
    for i, f in enumerate(filters):
        validate_filter(f, f"filters[{i}]")
    out["filters"] = filters
    mode = spec.get("mode", DEFAULTS["mode"])
    if mode not in ("binary", "structured"):
        raise SubscriptionError("'mode' must be 'binary' or 'structured'")
    out["mode"] = mode
    start = spec.get("start", DEFAULTS["start"])
    if start not in ("latest", "earliest"):
        raise SubscriptionError("'start' must be 'latest' or 'earliest'")
    out["start"] = start
    for k, (lo, hi) in LIMITS.items():
        v = spec.get(k, DEFAULTS[k])
        if v is None:
            v = DEFAULTS[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
            raise SubscriptionError(f"'{k}' must be a number between {lo} and {hi}")
        out[k] = float(v) if k == "timeout_s" else int(v)
    if out["max_backoff_ms"] < out["initial_backoff_ms"]:
        raise SubscriptionError("'max_backoff_ms' must not be smaller than 'initial_backoff_ms'")
    return out


class _Runner:
    """One subscription's delivery loop: pop, POST, ack / retry / dead-letter."""

    def __init__(self, manager: "PushManager", sub: dict[str, Any]) -> None:
        self.m = manager
        self.sub = sub
        self.inflight = 0
        self._slot = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.task: asyncio.Task[None] | None = None

    @property
    def lease_ms(self) -> int:
        return int(self.sub["timeout_s"] * 1000) + 10_000

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop(), name=f"unimq-push-{self.sub['id']}")

    async def stop(self) -> None:
        tasks = [t for t in (self.task, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass

    async def _loop(self) -> None:
        sub = self.sub
        p = self.m.processor
        pause = 0.5
        while True:
            while self.inflight >= sub["max_inflight"]:
                self._slot.clear()
                await self._slot.wait()
            try:
                popped = await p.pop(
                    CTX, sub["group"], sub["topic"], sub["max_inflight"] - self.inflight, self.lease_ms,
                    wait_ms=POLL_WAIT_MS, from_latest=sub["start"] == "latest",
                )
                pause = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as e:  # topic deleted, store stopping...: keep the loop, slow down
                log.debug("push %s: pop failed: %s", sub["id"], e)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 10.0)
                continue
            for pm in popped:
                self.inflight += 1
                t = asyncio.create_task(self._deliver(pm))
                self._tasks.add(t)
                t.add_done_callback(self._done)

    def _done(self, t: asyncio.Task[None]) -> None:
        self._tasks.discard(t)
        self.inflight -= 1
        self._slot.set()
        if not t.cancelled() and t.exception() is not None:
            log.warning("push %s: delivery task failed: %r", self.sub["id"], t.exception())

    async def _deliver(self, pm: Any) -> None:
        sub = self.sub
        p = self.m.processor
        msg = pm.message
        group, topic = sub["group"], sub["topic"]
        stats = self.m.stats
        sid = sub["id"]
        if sub["filters"]:
            attrs = event_attributes(msg)
            if not all(matches(f, attrs) for f in sub["filters"]):
                stats[(sid, "filtered")] += 1
                await p.ack(CTX, group, topic, pm.receipt_handle)
                return
        handle = pm.receipt_handle
        attempt = max(int(pm.delivery_attempt), 1)
        while True:
            ok = await self._post(msg)
            if ok:
                stats[(sid, "delivered")] += 1
                await p.ack(CTX, group, topic, handle)
                return
            stats[(sid, "failed_attempt")] += 1
            tracer = self.m.processor.tracer  # failed push attempts (gateway/trace.py)
            if tracer.on:  # the pop, ack and dead-lettering are the processor's events
                tracer.message(msg, "retried", "cloudevents", client=CTX.client_id, group=group,
                               subscription=sid, attempt=attempt, reason="push failed")
            if attempt >= sub["max_attempts"]:
                stats[(sid, "dead_lettered")] += 1
                await p.forward_to_dlq(CTX, group, topic, handle)
                log.info("push %s: message %s dead-lettered after %d attempts", sid, msg.message_id, attempt)
                return
            delay_ms = min(sub["initial_backoff_ms"] * (2 ** (attempt - 1)), sub["max_backoff_ms"])
            delay_ms = int(delay_ms * random.uniform(0.9, 1.1))
            handle, _ = await p.change_invisible(CTX, group, topic, handle, delay_ms + self.lease_ms)
            await asyncio.sleep(delay_ms / 1000.0)
            attempt += 1

    async def _post(self, msg: Any) -> bool:
        sub = self.sub
        if sub["mode"] == "binary":
            headers, body = to_binary_http(msg)
        else:
            headers, body = {"content-type": CE_JSON_CONTENT_TYPE}, to_structured_json(msg)
        try:
            r = await self.m.client.post(sub["sink"], content=body, headers=headers, timeout=sub["timeout_s"])
        except httpx.HTTPError as e:
            log.debug("push %s: %s: %r", sub["id"], sub["sink"], e)
            return False
        return 200 <= r.status_code < 300


class PushManager:
    """All push subscriptions of one gateway: durable specs, one delivery loop each."""

    def __init__(self, processor: MessagingAPI, allowed_hosts: list[str] | None = None) -> None:
        self.processor = processor
        self.allowed_hosts = list(allowed_hosts or [])
        self.subs: dict[str, dict[str, Any]] = {}
        self.runners: dict[str, _Runner] = {}
        self.stats: dict[tuple[str, str], int] = defaultdict(int)
        self.client: httpx.AsyncClient = None  # type: ignore[assignment]
        self._lock = asyncio.Lock()
        self.started = False

    async def start(self) -> None:
        """Load the durable subscriptions and start delivering."""
        self.client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64), follow_redirects=False,
        )
        items = await self.processor.kv_items(CTX, KV_NAMESPACE)
        for sid, raw in items.items():
            try:
                sub = json.loads(raw)
            except ValueError:
                log.warning("push subscription %s: unreadable, skipped", sid)
                continue
            self.subs[sid] = sub
            self._run(sub)
        self.started = True
        if items:
            log.info("push: %d subscription(s) resumed", len(items))

    async def stop(self) -> None:
        self.started = False
        for r in list(self.runners.values()):
            await r.stop()
        self.runners.clear()
        if self.client is not None:
            await self.client.aclose()

    def _run(self, sub: dict[str, Any]) -> None:
        r = _Runner(self, sub)
        self.runners[sub["id"]] = r
        r.start()

    async def create(self, spec: Mapping[str, Any], owner: str | None = None) -> dict[str, Any]:
        """A new subscription; ``owner``: the user creating it (counted against its subscription limit)."""
        sub = normalize(spec, self.allowed_hosts)
        sid = uuid.uuid4().hex
        sub["id"] = sid
        if owner is not None:
            sub["owner"] = owner
        if not sub["group"]:
            sub["group"] = f"push-{sid}"
        sub["created"] = int(time.time() * 1000)
        p = self.processor
        # Place the group's cursors now, so "latest" means "after this subscription was created".
        try:
            await self._touch(sub)
        except TopicNotFoundError:
            await p.create_topic(CTX, sub["topic"], exist_ok=True)
            await self._touch(sub)
        async with self._lock:
            await p.kv_put(CTX, KV_NAMESPACE, sid, json.dumps(sub).encode())
            self.subs[sid] = sub
            if self.started:
                self._run(sub)
        return sub

    async def _touch(self, sub: dict[str, Any]) -> None:
        stats = await self.processor.describe_topic(CTX, sub["topic"])
        if sub["start"] == "latest":
            for q in stats.queues:
                # A pull-style committed offset at the end of each queue is where a new pop cursor starts.
                if await self.processor.get_offset(CTX, sub["group"], sub["topic"], q.queue_id) is None:
                    await self.processor.commit_offset(CTX, sub["group"], sub["topic"], q.queue_id, q.max_offset)

    def list(self) -> list[dict[str, Any]]:
        return sorted(self.subs.values(), key=lambda s: s.get("created", 0))

    def get(self, sid: str) -> dict[str, Any]:
        sub = self.subs.get(sid)
        if sub is None:
            raise SubscriptionNotFoundError(f"subscription {sid!r} does not exist")
        return sub

    async def delete(self, sid: str) -> None:
        async with self._lock:
            self.get(sid)
            await self.processor.kv_put(CTX, KV_NAMESPACE, sid, None)
            self.subs.pop(sid, None)
            r = self.runners.pop(sid, None)
        if r is not None:
            await r.stop()
