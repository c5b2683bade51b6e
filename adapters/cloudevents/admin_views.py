"""What the admin API answers, built from the processor's typed calls: the JSON shapes the
console and ``unimq admin`` read, server-side paging, per-second rates, message bodies shown
three ways, and resending dead letters.

Why apart from the routes (``http_console.py``): these are plain functions of the processor's
answers, testable without HTTP, and the routes stay a list of paths. Why server-side paging
everywhere: a list of 10,000 topics or 100,000 MQTT sessions must not be described in full to
show 50 of them, so each list is filtered on cheap names first and only the page is described.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any, Iterable, Sequence, TypeVar

from core_broker.errors import TopicNotFoundError, UnimqError
from core_broker.model import Message, StoredMessage
from core_broker.system_topics import DLQ_PREFIX, RETRY_PREFIX, dlq_topic, is_system_topic
from gateway.api import GroupQueueStats, MessagingAPI
from gateway.context import RequestContext

from .http_responses import message_json

__all__ = [
    "RateMeter", "group_rows", "message_view", "page", "resend_dead_letters", "search_by_time", "topic_rows",
]

T = TypeVar("T")

#: Bytes of a body the admin API shows as hex (and as text) at most.
BODY_SHOW_LIMIT = 64 * 1024


def page(items: Sequence[T], offset: int, limit: int) -> tuple[int, Sequence[T]]:
    """(total, the ``limit`` items from ``offset``)."""
    return len(items), items[offset : offset + limit]


class RateMeter:
    """Per-second rates of growing counters, from the last two readings at least ``min_s`` apart
    (the console refreshes every few seconds; several viewers share the same readings)."""

    def __init__(self, min_s: float = 1.0) -> None:
        self.min_s = min_s
        self._prev: tuple[float, dict[str, int]] | None = None
        self._last: tuple[float, dict[str, int]] | None = None
        self._rates: dict[str, float] = {}

    def rates(self, totals: dict[str, int], now: float | None = None) -> dict[str, float]:
        now = time.monotonic() if now is None else now
        if self._last is None:
            self._last = (now, dict(totals))
            return {k: 0.0 for k in totals}
        t0, before = self._last
        if now - t0 >= self.min_s:
            self._rates = {k: max(v - before.get(k, 0), 0) / (now - t0) for k, v in totals.items()}
            self._prev, self._last = self._last, (now, dict(totals))
        return {k: round(self._rates.get(k, 0.0), 2) for k in totals}


def door_totals(counters: dict[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    """``{door: {"messages_in": n, "messages_out": n, "bytes_in": n, ...}}`` from the processor's counters."""
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for (name, proto), v in list(counters.items()):
        out[proto][name] = v
    return out


# ---------------------------------------------------------------------------- topics and groups


async def topic_rows(p: MessagingAPI, ctx: RequestContext, names: Iterable[str],
                     groups: Sequence[GroupQueueStats], retention_hours: float) -> list[dict[str, Any]]:
    """One row per topic of ``names`` (a page): type, queues, offsets, messages, retention, consumers."""
    consumers: dict[str, set[str]] = defaultdict(set)
    for g in groups:
        consumers[g.topic].add(g.group)
    rows = []
    for name in names:
        try:
            st = await p.describe_topic(ctx, name)
        except UnimqError:  # deleted meanwhile
            continue
        queues = [{"queue_id": q.queue_id, "min_offset": q.min_offset, "max_offset": q.max_offset,
                   "messages": max(q.max_offset - q.min_offset, 0)} for q in st.queues]
        attrs = dict(st.config.attributes)
        rows.append({
            "name": name, "type": st.config.message_type.value, "queues": queues,
            "messages": sum(q["messages"] for q in queues),
            "max_offset": sum(q.max_offset for q in st.queues),
            "retention_hours": retention_hours,
            "tier_retention_hours": float(attrs["tier_retention_hours"]) if "tier_retention_hours" in attrs else None,
            "attributes": attrs, "system": is_system_topic(name),
            "consumers": sorted(consumers.get(name, ())),
        })
    return rows


def origin_of(topic: str, group: str) -> str:
    """The topic a group's queue is about: ``%RETRY%<group>+<topic>`` is ``topic``'s retries."""
    prefix = f"{RETRY_PREFIX}{group}+"
    return topic[len(prefix):] if topic.startswith(prefix) else topic


def group_rows(stats: Sequence[GroupQueueStats]) -> dict[str, dict[str, Any]]:
    """Per group: its topics, lag, in flight, retry backlog and dead letters, and its queues."""
    out: dict[str, dict[str, Any]] = {}
    for s in stats:
        s = GroupQueueStats(*s)  # a tuple when it came over the processor RPC
        g = out.get(s.group)
        if g is None:
            g = out[s.group] = {"group": s.group, "topics": [], "lag": 0, "inflight": 0, "retry": 0, "dlq": 0,
                                "queues": []}
        row = {"topic": s.topic, "queue_id": s.queue_id, "broker": s.broker, "consumer_offset": s.consumer_offset,
               "max_offset": s.max_offset, "lag": s.lag, "inflight": s.inflight}
        g["queues"].append(row)
        if s.topic.startswith(RETRY_PREFIX):
            g["retry"] += s.lag
        elif s.topic.startswith(DLQ_PREFIX):
            continue
        else:
            g["lag"] += s.lag
            if s.topic not in g["topics"]:
                g["topics"].append(s.topic)
        g["inflight"] += s.inflight
    return out


async def add_dead_letters(p: MessagingAPI, ctx: RequestContext, groups: Iterable[dict[str, Any]]) -> None:
    """Set each group's ``dlq``: messages held by its dead-letter topic."""
    for g in groups:
        try:
            st = await p.describe_topic(ctx, dlq_topic(g["group"]))
        except UnimqError:  # no dead letter ever (no such topic)
            continue
        g["dlq"] = sum(max(q.max_offset - q.min_offset, 0) for q in st.queues)


# ---------------------------------------------------------------------------- messages


def message_view(m: StoredMessage) -> dict[str, Any]:
    """A message as the console shows it: the JSON every consumer gets plus the body as text
    (when UTF-8), as JSON (when it parses) and as hex, each of the first 64 KiB."""
    d = message_json(m)
    body = m.body[:BODY_SHOW_LIMIT]
    d["body_size"] = len(m.body)
    d["body_truncated"] = len(m.body) > BODY_SHOW_LIMIT
    try:
        d["body_text"] = body.decode("utf-8")
    except UnicodeDecodeError:
        d["body_text"] = None
    d["body_json"] = None
    if d["body_text"] is not None and not d["body_truncated"]:
        try:
            d["body_json"] = json.loads(d["body_text"])
        except ValueError:
            pass
    d["body_hex"] = body.hex()
    return d


async def search_by_time(p: MessagingAPI, ctx: RequestContext, topic: str, begin_ms: int, end_ms: int,
                         max_count: int) -> list[StoredMessage]:
    """Messages of ``topic`` stored in ``[begin_ms, end_ms]``, oldest first, at most ``max_count``:
    each queue read from the first offset stored at ``begin_ms``."""
    st = await p.describe_topic(ctx, topic)
    found: list[StoredMessage] = []
    for q in st.queues:
        off = await p.query_offset(ctx, topic, q.queue_id, "timestamp", begin_ms)
        n = 0
        while off < q.max_offset and n < max_count:
            r = await p.pull(ctx, topic, q.queue_id, off, min(max_count, 256))
            if not r.messages:
                break
            for m in r.messages:
                if begin_ms <= m.store_timestamp_ms <= end_ms:
                    found.append(m)
                    n += 1
            if r.messages[-1].store_timestamp_ms > end_ms or r.next_offset <= off:
                break
            off = r.next_offset
    found.sort(key=lambda m: (m.store_timestamp_ms, m.queue_id, m.queue_offset))
    return found[:max_count]


async def resend_dead_letters(p: MessagingAPI, ctx: RequestContext, group: str, topic: str, max_count: int,
                              resend_group: str) -> int:
    """Move up to ``max_count`` messages of ``group``'s dead-letter topic back to ``topic``: each is
    sent again (a new message, same body, tag, keys and properties) and then taken off the
    dead-letter topic, read by the consumer group ``resend_group`` (so none is resent twice)."""
    dlq = dlq_topic(group)
    sent = 0
    while sent < max_count:
        try:
            popped = await p.pop(ctx, resend_group, dlq, min(32, max_count - sent), 60_000)
        except TopicNotFoundError:  # no dead letter ever
            break
        if not popped:
            break
        copies = [Message(topic, pm.message.body, tag=pm.message.tag, keys=pm.message.keys,
                          properties=dict(pm.message.properties), message_group=pm.message.message_group)
                  for pm in popped]
        await p.send(ctx, copies)
        await p.ack_batch(ctx, resend_group, dlq, [pm.receipt_handle for pm in popped])
        sent += len(popped)
    return sent


async def controller_groups(addresses: str, timeout_s: float = 3.0) -> list[dict[str, Any]]:
    """Each replicated broker group as the controller reports it: master, epoch, in-sync set,
    members with their confirmed offsets and their lag behind the master."""
    from nameserver.client import parse_addresses
    from nameserver.controller_client import ControllerClient

    client = ControllerClient(parse_addresses(addresses), timeout_s=timeout_s)
    await client.start()
    try:
        report = await client.cluster_report()
    finally:
        await client.stop()
    out = []
    for name, g in sorted(report.items()):
        offsets: dict[str, int | None] = g.get("offsets", {})
        master_off = offsets.get(g["master_id"]) if g["master_id"] else None
        members = []
        for b, addr in sorted(g["members"].items()):
            off = offsets.get(b)
            role = "master" if b == g["master_id"] else ("in-sync" if b in g["in_sync"] else "out-of-sync")
            members.append({"id": b, "address": addr, "role": role, "offset": off,
                            "lag": master_off - off if master_off is not None and off is not None else None})
        out.append({"group": name, "master": g["master_id"], "master_address": g["master_addr"],
                    "epoch": g["master_epoch"], "in_sync": list(g["in_sync"]), "members": members})
    return out
