"""``GET /metrics``: the whole process's figures in Prometheus text format, via prometheus-client.

Why a custom collector instead of prometheus-client's Counter objects: the
numbers already live where they are counted, for every door alike (the
processor's per-door, per-topic counters; the broker's pop cursors and
consumer offsets; the store's size and fdatasync timings; the push manager's
outcomes). Copying them into client-library metrics on every message would put
a second counter on the hot path; a collector reads them once per scrape.
Each app gets its own registry, so several servers in one process (tests) do
not share metrics.

Families:

- ``unimq_messages_in_total{protocol,topic}`` / ``unimq_messages_out_total{protocol,topic}``, and
  ``unimq_bytes_in_total`` / ``unimq_bytes_out_total`` likewise (message bodies): the topic label
  is bounded, the ``max_topics`` busiest topics by name and the rest summed as ``other``, so a
  server with 10,000 topics does not make 10,000 series per door
- ``unimq_<operation>_total{protocol}`` for the processor's other counters (acks, dead letters, ...)
- ``unimq_consumer_lag_messages{group,topic}``: messages not yet consumed by a group
- ``unimq_consumer_inflight_messages{group}``, ``unimq_consumer_retry_messages{group}`` (waiting
  in its retry topics), ``unimq_dead_letter_messages{group}`` (held by its dead-letter topic)
- ``unimq_connections{door}``: open connections per door (push subscriptions for ``http``)
- ``unimq_store_commitlog_bytes``, ``unimq_store_disk_free_bytes``, ``unimq_store_disk_total_bytes``
- ``unimq_store_flush_seconds``: histogram of commitlog fdatasync durations
- ``unimq_push_deliveries_total{subscription,outcome}``: delivered, failed_attempt, dead_lettered, filtered
- with ``http_admin_controller`` set: ``unimq_replication_lag_bytes{group,member}`` (commitlog bytes a
  member is behind its master, as the controller last heard) and ``unimq_replication_in_sync{group,member}``
- with tiered storage on: ``unimq_tier_backlog_segments`` / ``unimq_tier_backlog_bytes`` (sealed
  segments waiting for upload), ``unimq_tier_uploaded_segments`` (segments readable in the tier),
  ``unimq_tier_upload_failures_total`` (failed upload attempts since start)
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from core_broker.errors import UnimqError
from core_broker.system_topics import DLQ_PREFIX, RETRY_PREFIX, dlq_topic
from gateway.api import GroupQueueStats, MessagingAPI
from gateway.clients import ClientRegistry
from gateway.context import RequestContext

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_CTX = RequestContext(protocol="http", client_id="metrics", trusted=True)


class UnimqCollector:
    """Reads the processor's, broker's and push manager's figures at scrape time."""

    def __init__(self, processor: MessagingAPI | None, push: Any = None, clients: ClientRegistry | None = None,
                 max_topics: int = 100, controller: str = "") -> None:
        self.processor = processor
        self.push = push
        self.clients = clients
        self.max_topics = max_topics
        self.controller = controller
        self._lag: list[tuple[str, str, int]] = []
        self._groups: list[GroupQueueStats] = []
        self._dlq: dict[str, int] = {}
        self._repl: list[dict[str, Any]] = []
        self._store: dict[str, Any] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)  # type: ignore[arg-type]

    async def render(self) -> bytes:
        """Take the asynchronous readings, then let prometheus-client format everything."""
        p = self.processor
        try:
            self._lag = await p.consumer_lag(_CTX) if p is not None else []
            self._store = await p.store_stats(_CTX) if p is not None else {}
            self._groups = [GroupQueueStats(*g) for g in await p.consumer_groups(_CTX)] if p is not None else []
        except (AttributeError, NotImplementedError, UnimqError):  # a broker client without the accessors
            self._lag, self._store, self._groups = [], {}, []
        self._dlq = {}
        if p is not None:
            for g in sorted({g.group for g in self._groups if not g.group.startswith("%")}):
                try:
                    st = await p.describe_topic(_CTX, dlq_topic(g))
                except UnimqError:  # no dead letters yet
                    continue
                self._dlq[g] = sum(max(q.max_offset - q.min_offset, 0) for q in st.queues)
        self._repl = []
        if self.controller:
            from .admin_views import controller_groups

            try:
                self._repl = await controller_groups(self.controller)
            except (OSError, UnimqError):  # the controller is down: no replication series this scrape
                pass
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        p = self.processor
        if p is None:
            return
        metrics = p.metrics
        fams: dict[str, CounterMetricFamily] = {}
        for (name, proto, topic), v in sorted(self._bounded(metrics.topic_counters).items()):
            fam = fams.get(name)
            if fam is None:
                fam = fams[name] = CounterMetricFamily(
                    f"unimq_{name}", f"{name.replace('_', ' ')} per door (protocol) and topic", labels=["protocol", "topic"]
                )
            fam.add_metric([proto, topic], v)
        for name in ("messages_in", "messages_out", "bytes_in", "bytes_out"):
            if name not in fams:
                fams[name] = CounterMetricFamily(f"unimq_{name}", f"{name.replace('_', ' ')} per door and topic",
                                                 labels=["protocol", "topic"])
        yield from fams.values()
        others: dict[str, CounterMetricFamily] = {}
        for (name, proto), v in sorted(metrics.counters.items()):
            if name in ("messages_in", "messages_out", "bytes_in", "bytes_out"):
                continue
            fam = others.get(name)
            if fam is None:
                fam = others[name] = CounterMetricFamily(f"unimq_{name}", f"{name.replace('_', ' ')} per door",
                                                         labels=["protocol"])
            fam.add_metric([proto], v)
        yield from others.values()

        lag = GaugeMetricFamily("unimq_consumer_lag_messages", "messages not yet consumed, per consumer group and topic",
                                labels=["group", "topic"])
        for g, t, n in self._lag:
            lag.add_metric([g, t], n)
        yield lag
        yield from self._group_families()

        conns = GaugeMetricFamily("unimq_connections", "open connections per door (http: push subscriptions)",
                                  labels=["door"])
        for door, n in sorted((self.clients.connections() if self.clients is not None else {}).items()):
            conns.add_metric([door], n)
        yield conns

        s = self._store
        yield GaugeMetricFamily("unimq_store_commitlog_bytes", "bytes held by the commitlog",
                                value=s.get("commitlog_bytes", 0))
        if "disk_free_bytes" in s:
            yield GaugeMetricFamily("unimq_store_disk_free_bytes", "free bytes on the store's file system",
                                    value=s["disk_free_bytes"])
            yield GaugeMetricFamily("unimq_store_disk_total_bytes", "size of the store's file system",
                                    value=s["disk_total_bytes"])
        bounds = s.get("flush_buckets", ())
        counts = s.get("flush_counts", ())
        if bounds and counts:
            cum, buckets = 0, []
            for le, n in zip(bounds, counts):
                cum += n
                buckets.append((repr(float(le)), cum))
            cum += counts[-1]
            buckets.append(("+Inf", cum))
            yield HistogramMetricFamily("unimq_store_flush_seconds", "commitlog fdatasync latency", buckets=buckets,
                                        sum_value=s.get("flush_seconds_sum", 0.0))

        yield from _tier_families(s)
        yield from self._replication_families()

        push = CounterMetricFamily("unimq_push_deliveries", "push subscription delivery outcomes",
                                   labels=["subscription", "outcome"])
        if self.push is not None:
            for (sid, outcome), v in sorted(self.push.stats.items()):
                push.add_metric([sid, outcome], v)
        yield push


    def _bounded(self, counters: dict[tuple[str, str, str], int]) -> dict[tuple[str, str, str], int]:
        """The per-topic counters with at most ``max_topics`` topics named (the busiest by
        messages in and out), the others summed under ``topic="other"``."""
        per_topic: dict[str, int] = defaultdict(int)
        for (name, _, topic), v in list(counters.items()):
            if name.startswith("messages_"):
                per_topic[topic] += v
        if len(per_topic) <= self.max_topics:
            return dict(counters)
        keep = set(sorted(per_topic, key=lambda t: (-per_topic[t], t))[: self.max_topics])
        out: dict[tuple[str, str, str], int] = defaultdict(int)
        for (name, proto, topic), v in list(counters.items()):
            out[(name, proto, topic if topic in keep else "other")] += v
        return out

    def _group_families(self) -> Iterator[Metric]:
        inflight = GaugeMetricFamily("unimq_consumer_inflight_messages",
                                     "messages delivered to a consumer group and neither acked nor back yet",
                                     labels=["group"])
        retry = GaugeMetricFamily("unimq_consumer_retry_messages",
                                  "messages waiting in a consumer group's retry topics", labels=["group"])
        dead = GaugeMetricFamily("unimq_dead_letter_messages",
                                 "messages held by a consumer group's dead-letter topic", labels=["group"])
        per_inflight: dict[str, int] = defaultdict(int)
        per_retry: dict[str, int] = defaultdict(int)
        for g in self._groups:
            if g.group.startswith("%") or g.topic.startswith(DLQ_PREFIX):
                continue
            per_inflight[g.group] += g.inflight
            if g.topic.startswith(RETRY_PREFIX):
                per_retry[g.group] += g.lag
        for name in sorted(per_inflight):
            inflight.add_metric([name], per_inflight[name])
            retry.add_metric([name], per_retry.get(name, 0))
        for name, n in sorted(self._dlq.items()):
            dead.add_metric([name], n)
        yield inflight
        yield retry
        yield dead

    def _replication_families(self) -> Iterator[Metric]:
        if not self.controller:
            return
        lag = GaugeMetricFamily("unimq_replication_lag_bytes",
                                "commitlog bytes a group member is behind its master", labels=["group", "member"])
        sync = GaugeMetricFamily("unimq_replication_in_sync", "1 when a member is the master or in the in-sync set",
                                 labels=["group", "member"])
        for g in self._repl:
            for m in g["members"]:
                if m["lag"] is not None:
                    lag.add_metric([g["group"], m["id"]], m["lag"])
                sync.add_metric([g["group"], m["id"]], 1 if m["role"] != "out-of-sync" else 0)
        yield lag
        yield sync


def _tier_families(s: dict[str, Any]) -> Iterator[Metric]:
    """The tier's upload figures, when the brokers run one (their stats carry ``tier_*``)."""
    if "tier_backlog_segments" not in s:
        return
    yield GaugeMetricFamily("unimq_tier_backlog_segments", "sealed commitlog segments waiting for upload to the tier",
                            value=s.get("tier_backlog_segments", 0))
    yield GaugeMetricFamily("unimq_tier_backlog_bytes", "bytes of sealed commitlog segments waiting for upload",
                            value=s.get("tier_backlog_bytes", 0))
    yield GaugeMetricFamily("unimq_tier_uploaded_segments", "commitlog segments readable in the tier",
                            value=s.get("tier_uploaded_segments", 0))
    yield CounterMetricFamily("unimq_tier_upload_failures", "failed tier upload attempts since start",
                              value=s.get("tier_upload_failures", 0))
