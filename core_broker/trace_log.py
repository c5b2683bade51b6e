"""Message-trace records, and the events a broker records itself (its retries and dead letters).

Why in the broker: a popped message whose invisible time runs out is revived by the broker's
pop service (moved to the group's retry topic, or after ``max_delivery_attempts`` to
``%DLQ%<group>``), with no gateway call in sight. In the separated deployment that happens in
the broker process, so the broker writes these events itself, into its own queue of the
trace topic (:data:`TRACE_TOPIC`, created here like a retry topic and registered with the
nameservers), in the same record format the gateways write (:func:`trace_records`). A timeline
is a query by message id on every broker hosting the trace topic, so it finds them beside the
gateways' events. The alternative, reporting them to a gateway, needs a channel from brokers
to gateways and a gateway alive; writing where they happen needs neither.

Which messages are traced is the gateways' rule (gateway/trace.py), read here from the same
topic attributes (:func:`topic_trace_rate`) with the process-wide ``trace_sample_rate`` as
:attr:`BrokerTrace.default` (set by the broker's role), and the same hash of the message id, so
broker and gateways pick the same messages. The off case is one topic-table lookup per revived
message (:meth:`BrokerTrace.traced`); only a traced topic's message is read for its id.

Events are buffered during a revive round and written at its end (:meth:`BrokerTrace.write`).
Hand-written: the format is our own (JSON lists of events, keyed by message ids).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Iterable

from crc32c import crc32c

from .model import Message
from .system_topics import LMQ_PREFIX, P_ORIGIN_TOPIC, RETRY_PREFIX, TRACE_TOPIC

log = logging.getLogger("unimq.trace")

__all__ = ["ATTR_ENABLED", "ATTR_RATE", "BrokerTrace", "PER_RECORD", "sampled", "topic_trace_rate", "trace_records"]

#: messages whose events share one record of the trace topic (each id is one of its keys)
PER_RECORD = 64

#: the topic attributes a trace reads
ATTR_ENABLED = "trace_enabled"
ATTR_RATE = "trace_sample_rate"
_FALSE = ("0", "false", "no", "off")

#: the ``door`` of the events a broker records itself (not a door: ``doors`` of a timeline skip it)
BROKER_DOOR = "broker"
#: the buffer of one revive round (more are dropped, counted in ``dropped``)
CAPACITY = 10_000


def topic_trace_rate(attributes: dict[str, str]) -> float | None:
    """The sample rate a topic's attributes ask for; None: they say nothing (the default applies).

    ``trace_enabled = false`` turns a topic off whatever the rate; ``true`` traces at
    ``trace_sample_rate`` (1.0 when absent); a rate alone is that rate.
    """
    enabled = attributes.get(ATTR_ENABLED)
    rate = attributes.get(ATTR_RATE)
    if enabled is None and rate is None:
        return None
    if enabled is not None and enabled.strip().lower() in _FALSE:
        return 0.0
    try:
        return min(1.0, max(0.0, float(rate))) if rate is not None else 1.0
    except ValueError:
        return None


def sampled(rate: float, message_id: str) -> bool:
    """Is a message of a topic traced at ``rate``? The same answer in every process."""
    if rate <= 0.0 or not message_id:
        return False
    return rate >= 1.0 or crc32c(message_id.encode()) % 10_000 < rate * 10_000


def trace_records(buf: Iterable[tuple[str, dict]], queue_id: int) -> list[tuple[int, Message]]:
    """Events ``(message id, event)`` as trace-topic records: (events in it, record).

    A record holds the events of up to :data:`PER_RECORD` messages (a JSON list) and is keyed
    by all their ids: the store's cost is mostly per record, so tracing writes few records; a
    query by one id reads the records naming it and keeps that id's events.
    """
    by_id: dict[str, list[dict]] = {}
    for mid, f in buf:
        evs = by_id.get(mid)
        if evs is None:
            by_id[mid] = [f]
        else:
            evs.append(f)
    dumps = json.dumps
    ids = list(by_id)
    records = []
    for i in range(0, len(ids), PER_RECORD):
        chunk = ids[i:i + PER_RECORD]
        evs = [e for mid in chunk for e in by_id[mid]]
        records.append((len(evs), Message(TRACE_TOPIC, dumps(evs, separators=(",", ":")).encode(), tag="trace",
                                          keys=tuple(chunk), protocol="internal", queue_id=queue_id)))
    return records


class BrokerTrace:
    """The broker's own trace events: which revived messages are traced, and their buffer."""

    def __init__(self, store: Any, broker: str, ensure_topic: Callable[[str], None]) -> None:
        self.store = store  # core_broker.message_store.MessageStore: topic table, read_at, put_nowait
        self.broker = broker
        self.ensure_topic = ensure_topic
        self.default = 0.0  # the process-wide trace_sample_rate (set by the broker's role)
        self.pending: list[tuple[str, dict]] = []
        self.written = 0
        self.dropped = 0

    def rate(self, topic: str) -> float:
        """The sample rate of a user topic (its attributes, else the default)."""
        tc = self.store.topics.get(topic)
        r = topic_trace_rate(tc.attributes) if tc is not None and tc.attributes else None
        return self.default if r is None else r

    def traced(self, topic: str) -> bool:
        """May messages of queue ``topic`` (a user topic or a group's retry topic) be traced?
        The cheap check made for every revived message."""
        if topic.startswith(RETRY_PREFIX):
            topic = topic[len(RETRY_PREFIX):].rpartition("+")[2]
        elif topic.startswith(LMQ_PREFIX):
            return False  # a door's delivery queue (an MQTT shared group's): the door traces it
        return self.rate(topic) > 0.0

    def record(self, topic: str, queue_id: int, offset: int, event: str, **fields: Any) -> None:
        """Buffer ``event`` for the message at ``offset`` of ``topic`` if it is sampled (read for
        its id: call after :meth:`traced` said yes)."""
        m = self.store.read_at(topic, queue_id, offset)
        if m is None:
            return
        origin = m.properties.get(P_ORIGIN_TOPIC, m.topic) if m.properties else m.topic
        mid = m.message_id
        if not sampled(self.rate(origin), mid):
            return
        if len(self.pending) >= CAPACITY:
            self.dropped += 1
            return
        fields.update(id=mid, topic=origin, event=event, door=BROKER_DOOR, broker=self.broker,
                      at=round(time.time() * 1000, 3))
        self.pending.append((mid, fields))

    def write(self) -> None:
        """Write the buffered events into this broker's queue of the trace topic (created like
        a retry topic), as the journal's entries of the same revive round are: memory copies."""
        buf, self.pending = self.pending, []
        records = trace_records(buf, 0)
        left = len(buf)
        try:
            self.ensure_topic(TRACE_TOPIC)
            for n, m in records:
                self.store.put_nowait(m)
                self.written += n
                left -= n
        except Exception as e:  # a full disk: the events are lost, never the revival
            self.dropped += left
            log.warning("trace: writing the broker's trace events failed: %s", e)
