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

- ``unimq_messages_in_total{protocol,topic}`` / ``unimq_messages_out_total{protocol,topic}``
- ``unimq_<operation>_total{protocol}`` for the processor's other counters (acks, dead letters, ...)
- ``unimq_consumer_lag_messages{group,topic}``: messages not yet consumed by a group
- ``unimq_store_commitlog_bytes``: bytes held by the commitlog
- ``unimq_store_flush_seconds``: histogram of commitlog fdatasync durations
- ``unimq_push_deliveries_total{subscription,outcome}``: delivered, failed_attempt, dead_lettered, filtered
- with tiered storage on: ``unimq_tier_backlog_segments`` / ``unimq_tier_backlog_bytes`` (sealed
  segments waiting for upload), ``unimq_tier_uploaded_segments`` (segments readable in the tier),
  ``unimq_tier_upload_failures_total`` (failed upload attempts since start)
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from core_broker.errors import UnimqError
from gateway.api import MessagingAPI
from gateway.context import RequestContext

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_CTX = RequestContext(protocol="http", client_id="metrics", trusted=True)


class UnimqCollector:
    """Reads the processor's, broker's and push manager's figures at scrape time."""

    def __init__(self, processor: MessagingAPI | None, push: Any = None) -> None:
        self.processor = processor
        self.push = push
        self._lag: list[tuple[str, str, int]] = []
        self._store: dict[str, Any] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)  # type: ignore[arg-type]

    async def render(self) -> bytes:
        """Take the asynchronous readings, then let prometheus-client format everything."""
        p = self.processor
        try:
            self._lag = await p.consumer_lag(_CTX) if p is not None else []
            self._store = await p.store_stats(_CTX) if p is not None else {}
        except (AttributeError, NotImplementedError, UnimqError):  # a broker client without the accessors
            self._lag, self._store = [], {}
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        p = self.processor
        if p is None:
            return
        metrics = p.metrics
        fams: dict[str, CounterMetricFamily] = {}
        for (name, proto, topic), v in sorted(metrics.topic_counters.items()):
            fam = fams.get(name)
            if fam is None:
                fam = fams[name] = CounterMetricFamily(
                    f"unimq_{name}", f"{name.replace('_', ' ')} per door (protocol) and topic", labels=["protocol", "topic"]
                )
            fam.add_metric([proto, topic], v)
        for name in ("messages_in", "messages_out"):
            if name not in fams:
                fams[name] = CounterMetricFamily(f"unimq_{name}", f"{name.replace('_', ' ')} per door and topic",
                                                 labels=["protocol", "topic"])
        yield from fams.values()
        others: dict[str, CounterMetricFamily] = {}
        for (name, proto), v in sorted(metrics.counters.items()):
            if name in ("messages_in", "messages_out"):
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

        s = self._store
        yield GaugeMetricFamily("unimq_store_commitlog_bytes", "bytes held by the commitlog",
                                value=s.get("commitlog_bytes", 0))
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

        push = CounterMetricFamily("unimq_push_deliveries", "push subscription delivery outcomes",
                                   labels=["subscription", "outcome"])
        if self.push is not None:
            for (sid, outcome), v in sorted(self.push.stats.items()):
                push.add_metric([sid, outcome], v)
        yield push


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
