"""Message traces: each traced message's life (stored, delivered, acked, retried, dead-lettered,
expired) recorded as events in the system trace topic, across every door.

Why here: the processor sees every door's sends, pops, pulls and acks, and the doors that
deliver from memory (AMQP queues, MQTT subscriptions, HTTP push) hold the processor; the
tracer lives beside it (``processor.tracer``) so both can record into one buffer.

Cost is the design constraint. Tracing is opt-in per topic (topic attributes
``trace_enabled`` / ``trace_sample_rate``) with a process-wide default rate
(``trace_sample_rate``, 0 = off). Every hook first reads :attr:`Tracer.on` (a plain bool,
false while no topic is traced): that is all tracing costs when it is off. When on, an event
is a tuple appended to a bounded in-memory buffer; a background task writes the buffer to
the trace topic every ``flush_ms`` (or once ``batch`` events wait) in one broker call, so no
message waits for its trace. A full buffer drops new events (counted in
``unimq_trace_events_dropped_total``) rather than slowing messages down.

Sampling is decided from the message id (a hash below ``rate``), so every gateway and door
makes the same choice for one message without carrying a mark on it.

The events buffered in one flush are written as records of the trace topic holding the
events of up to 64 messages each (a JSON list), keyed by those messages' ids
(``core_broker/trace_log.py``, the format brokers write their own events in: a pop's invisible
time running out, ``retried``, and the move to ``%DLQ%``, ``dead_lettered``), so a message's
timeline is a query by key (:func:`parse_events` keeps its events) on every broker holding
the trace topic.

A pop's settling (ack, release, dead-lettering) is traced by the gateway that settles it. A
receipt handle this process popped is found in memory; another one (popped through another
gateway of a separated deployment) names its topic, queue and offset: after the same cheap
check of its topic, the message is read from its broker in a background task for its id.
Hand-written: the events are our own model (no tracing library knows doors and receipts),
and OpenTelemetry's exporters would put the cost on the hot path this avoids.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Iterable, Sequence

from core_broker.errors import BadRequestError, UnimqError
from core_broker.model import Message, StoredMessage
from core_broker.receipt import ReceiptHandle
from core_broker.system_topics import P_ORIGIN_TOPIC, RETRY_PREFIX, TRACE_TOPIC, is_lmq
from core_broker.topic_config import TopicConfig
from core_broker.trace_log import ATTR_ENABLED, ATTR_RATE, BROKER_DOOR, sampled, topic_trace_rate, trace_records

from .broker_client import BrokerClient

__all__ = [
    "BROKER_DOOR", "EVENTS", "TRACE_TOPIC", "Tracer", "parse_events", "sort_timeline", "topic_trace_rate",
]

log = logging.getLogger("unimq.trace")

#: event names, in the order they happen to one message (equal times sort so)
EVENTS = ("stored", "delivered", "retried", "nacked", "acked", "expired", "dead_lettered")
_RANK = {e: i for i, e in enumerate(EVENTS)}

#: records per broker call (about 1,000 messages' events, a few hundred KB)
RECORDS_PER_SEND = 16

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def check_trace_attributes(attributes: dict[str, str]) -> None:
    """Raise BadRequestError unless the trace attributes are right (or absent)."""
    bad = _trace_attributes_error(attributes)
    if bad:
        raise BadRequestError(bad)


def _trace_attributes_error(attributes: dict[str, str]) -> str | None:
    enabled = attributes.get(ATTR_ENABLED)
    if enabled is not None and enabled.strip().lower() not in _TRUE + _FALSE:
        return f"{ATTR_ENABLED} must be true or false, not {enabled!r}"
    rate = attributes.get(ATTR_RATE)
    if rate is not None:
        try:
            ok = 0.0 <= float(rate) <= 1.0
        except ValueError:
            ok = False
        if not ok:
            return f"{ATTR_RATE} must be a number from 0 to 1, not {rate!r}"
    return None


def origin_topic(m: Message) -> str:
    """The topic a message was sent to (a retry or dead-letter copy names it in a property)."""
    props = m.properties
    return props.get(P_ORIGIN_TOPIC, m.topic) if props else m.topic


class Tracer:
    """The per-process trace recorder: rates per topic, the event buffer and its writer."""

    @classmethod
    def off(cls) -> "Tracer":
        """A tracer that records nothing: a processor that stores nothing itself has one (the
        client of a remote processor: the gateway it goes through traces what passes there)."""
        return cls(None, 0.0)

    def __init__(self, broker: BrokerClient | None, default_rate: float = 0.0, flush_ms: int = 100,
                 batch: int = 1024, capacity: int = 50_000, refresh_s: float = 5.0, metrics: Any = None) -> None:
        self.broker = broker
        self.metrics_sink = metrics  # gateway.metrics.Metrics: written and dropped events, per flush
        self.default = min(1.0, max(0.0, float(default_rate)))
        self.flush_s = max(flush_ms, 1) / 1000.0
        self.batch = max(1, batch)
        self.capacity = max(self.batch, capacity)
        self.refresh_s = refresh_s
        self.rates: dict[str, float] = {}  # topics whose attributes name a rate
        self.on = self.default > 0.0
        self.recorded = 0
        self.written = 0
        self.dropped = 0
        self._buf: list[tuple] = []
        self._handles: dict[str, tuple[str, str]] = {}  # receipt handle -> (message id, topic)
        self._lookups: set[asyncio.Task] = set()  # settlings of handles popped elsewhere (_look_up)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._refreshed = 0.0
        self._stopping = False
        self._reported = (0, 0)

    # -- which messages are traced ------------------------------------------------------

    def set_topic(self, tc: TopicConfig) -> None:
        """A topic was created or changed through this process: its rate applies at once."""
        self._set_rate(tc.name, topic_trace_rate(tc.attributes or {}))
        self._recompute()

    def forget_topic(self, name: str) -> None:
        self.rates.pop(name, None)
        self._recompute()

    def _set_rate(self, name: str, rate: float | None) -> None:
        if rate is None:
            self.rates.pop(name, None)
        else:
            self.rates[name] = rate

    def _recompute(self) -> None:
        self.on = self.default > 0.0 or any(r > 0.0 for r in self.rates.values())

    def sampled(self, topic: str, message_id: str) -> bool:
        """Is this message traced? The same answer for one message in every process."""
        return sampled(self.rates.get(topic, self.default), message_id)

    async def refresh(self) -> None:
        """Read every topic's attributes (changes made through other gateways arrive so)."""
        if self.broker is None:
            return
        try:
            topics = await self.broker.list_topics(False)
        except Exception as e:  # a broker down: keep what is known
            log.debug("trace: topic refresh failed: %s", e)
            return
        rates: dict[str, float] = {}
        for tc in topics:
            r = topic_trace_rate(tc.attributes or {})
            if r is not None:
                rates[tc.name] = r
        self.rates = rates
        self._recompute()
        self._refreshed = time.monotonic()

    # -- recording (every call is cheap; callers check ``on`` first) ----------------------

    def event(self, message_id: str, topic: str, event: str, door: str, **fields: Any) -> None:
        """Buffer one event of a traced message (the caller decided it is traced)."""
        if len(self._buf) >= self.capacity:
            self.dropped += 1
            return
        fields["id"] = message_id
        fields["topic"] = topic
        fields["event"] = event
        fields["door"] = door
        if "at" not in fields:  # (given: an event recorded after a look-up, at the time it happened)
            fields["at"] = round(time.time() * 1000, 3)
        self._buf.append((message_id, fields))
        self.recorded += 1
        if len(self._buf) >= self.batch and self._wake is not None:
            self._wake.set()
        if self._task is None:
            self._start()

    def message(self, m: Message, event: str, door: str, message_id: str = "", **fields: Any) -> None:
        """Record ``event`` for ``m`` if its topic and id are sampled."""
        mid = message_id or m.message_id
        topic = origin_topic(m)
        if self.sampled(topic, mid):
            self.event(mid, topic, event, door, **fields)

    def stored(self, ctx: Any, messages: Sequence[Message], results: Sequence[Any]) -> None:
        """A send call's messages were stored (the processor, after the broker answered)."""
        door = ctx.protocol
        for m, r in zip(messages, results):
            mid = r.message_id
            if self.sampled(m.topic, mid):
                if not m.message_id:
                    m.message_id = mid  # doors delivering the object from memory trace it by id
                self.event(mid, m.topic, "stored", door, client=ctx.client_id, address=ctx.remote_address,
                           broker=r.broker, queue=r.queue_id, offset=r.queue_offset)

    def popped(self, ctx: Any, group: str, popped: Iterable[Any], via: str = "pop") -> None:
        """Pop deliveries; their receipt handles are remembered so an ack finds the message."""
        handles = self._handles
        for p in popped:
            m = p.message
            topic = origin_topic(m)
            if self.sampled(topic, m.message_id):
                self.event(m.message_id, topic, "delivered", ctx.protocol, client=ctx.client_id, group=group,
                           via=via, attempt=p.delivery_attempt)
                if len(handles) >= 100_000:
                    del handles[next(iter(handles))]
                handles[p.receipt_handle] = (m.message_id, topic)

    def pulled(self, ctx: Any, messages: Iterable[StoredMessage], group: str = "") -> None:
        for m in messages:
            self.message(m, "delivered", ctx.protocol, client=ctx.client_id, group=group, via="pull")

    def settled(self, ctx: Any, group: str, handle: str, event: str, new_handle: str | None = None,
                **fields: Any) -> None:
        """An ack, a release or a dead-lettering of a popped message (by its receipt handle);
        ``new_handle``: the message stays in flight under that handle (a renewal: ``event`` "")."""
        known = self._handles.pop(handle, None)
        if known is None:
            if event:  # popped through another gateway (or before tracing was on here)
                self._look_up(ctx, group, handle, event, fields)
            return
        if new_handle:
            self._handles[new_handle] = known
        if event:  # "": a renewal, the same delivery under a new handle
            self.event(known[0], known[1], event, ctx.protocol, client=ctx.client_id, group=group, **fields)

    def acked_batch(self, ctx: Any, group: str, handles: Sequence[str], errors: Sequence[str | None]) -> None:
        for h, err in zip(handles, errors):
            if err is None:
                self.settled(ctx, group, h, "acked")

    def released(self, ctx: Any, group: str, handle: str, invisible_ms: int, new_handle: str) -> None:
        """A change of invisible time: 0 releases the message for another delivery (a nack:
        ``retried``); any other time renews the same delivery under ``new_handle``."""
        if invisible_ms == 0:
            self.settled(ctx, group, handle, "retried")
        else:
            self.settled(ctx, group, handle, "", new_handle=new_handle)

    def _look_up(self, ctx: Any, group: str, handle: str, event: str, fields: dict[str, Any]) -> None:
        """The settling of a handle this process did not pop: the handle names the queue and
        offset, and its topic whether the message may be traced (the cheap check); if it may,
        the message is read (off the caller's path) for its id and sampled like any other."""
        try:
            rh = ReceiptHandle.decode(handle)
        except UnimqError:
            return
        topic = rh.topic
        if is_lmq(topic):
            return  # a door's own delivery queue: that door traces its deliveries
        user = topic[len(RETRY_PREFIX):].rpartition("+")[2] if topic.startswith(RETRY_PREFIX) else topic
        if self.rates.get(user, self.default) <= 0.0 or len(self._lookups) >= 1_000:
            return
        fields.update(client=ctx.client_id, group=group, at=round(time.time() * 1000, 3))
        t = asyncio.get_running_loop().create_task(self._record_looked_up(rh, event, ctx.protocol, fields))
        self._lookups.add(t)
        t.add_done_callback(self._lookups.discard)

    async def _record_looked_up(self, rh: ReceiptHandle, event: str, door: str, fields: dict[str, Any]) -> None:
        if self.broker is None:
            return
        try:
            r = await self.broker.pull(rh.broker, rh.topic, rh.queue_id, rh.offset, 1, None, 0)
        except Exception as e:  # gone, or its broker down: no event
            log.debug("trace: looking up %s %d/%d failed: %s", rh.topic, rh.queue_id, rh.offset, e)
            return
        for m in r.messages:
            if m.queue_offset == rh.offset:
                self.message(m, event, door, **fields)

    # -- writing -------------------------------------------------------------------------

    def start(self) -> None:
        """Run the writer (and the refresh of topics' rates) from now on: call in a running loop."""
        if self._task is None:
            self._start()

    def _start(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # recorded outside a loop (a test's thread): written by the next one in a loop
        self._wake = asyncio.Event()
        self._task = loop.create_task(self._run(), name="unimq-trace-writer")

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        while not self._stopping:
            try:
                async with asyncio.timeout(self.flush_s if self.on or self._buf else self.refresh_s):
                    await wake.wait()
            except TimeoutError:
                pass
            wake.clear()
            await self.flush()
            if time.monotonic() - self._refreshed > self.refresh_s:
                await self.refresh()

    async def _trace_broker(self) -> tuple[str, int] | None:
        if self.broker is None:
            return None
        route = self.broker.route_nowait(TRACE_TOPIC) or await self.broker.route(TRACE_TOPIC)
        if route is None:
            await self.broker.create_topic(TopicConfig(TRACE_TOPIC, queues=1, system=True), exist_ok=True)
            self.broker.invalidate(TRACE_TOPIC)
            route = await self.broker.route(TRACE_TOPIC)
        if route is None or not route.writable:
            return None
        q = route.writable[0]
        return q.broker, q.queue_id

    async def flush(self) -> int:
        """Write what is buffered (one broker call per :data:`RECORDS_PER_SEND` records). Returns
        the events written."""
        try:
            return await self._flush()
        finally:
            self._report()

    def _report(self) -> None:
        sink = self.metrics_sink
        if sink is None or (self.written, self.dropped) == self._reported:
            return
        w, d = self._reported
        if self.written > w:
            sink.inc("trace_events_written", "internal", self.written - w)
        if self.dropped > d:
            sink.inc("trace_events_dropped", "internal", self.dropped - d)
        self._reported = (self.written, self.dropped)

    async def _flush(self) -> int:
        if not self._buf:
            return 0
        buf, self._buf = self._buf, []
        try:
            where = await self._trace_broker()
        except Exception as e:
            log.warning("trace: no trace topic (%s); %d events dropped", e, len(buf))
            self.dropped += len(buf)
            return 0
        if where is None:
            self.dropped += len(buf)
            return 0
        broker, qid = where
        assert self.broker is not None  # a trace broker was found through it
        records = trace_records(buf, qid)  # (the format brokers write too: core_broker/trace_log.py)
        n = 0
        for i in range(0, len(records), RECORDS_PER_SEND):
            part = records[i:i + RECORDS_PER_SEND]
            k = sum(c for c, _ in part)
            try:
                await self.broker.send(broker, [m for _, m in part], False, "")
                n += k
            except Exception as e:
                log.warning("trace: writing %d events failed: %s", k, e)
                self.dropped += k
                self.broker.invalidate(TRACE_TOPIC)
        self.written += n
        return n

    async def stop(self) -> None:
        """Write what is buffered and end the writer."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            if self._wake is not None:
                self._wake.set()
            _, pending = await asyncio.wait({task}, timeout=5)  # (3.11's wait_for can drop a cancel)
            for t in pending:
                t.cancel()
        try:
            await self.flush()
        except Exception:
            log.exception("trace: the last flush failed")


def parse_events(messages: Iterable[StoredMessage], message_id: str) -> list[dict]:
    """The trace events among ``messages`` (a query of the trace topic by key) for ``message_id``."""
    out = []
    for m in messages:
        try:
            got = json.loads(m.body)
        except ValueError:
            continue
        for e in got if isinstance(got, list) else [got]:
            if isinstance(e, dict) and e.get("id") == message_id:
                out.append(e)
    return out


def sort_timeline(events: list[dict]) -> list[dict]:
    """Events by time (microseconds, as recorded); equal times in the order a message's life goes."""
    return sorted(events, key=lambda e: (e.get("at", 0), _RANK.get(e.get("event", ""), 99)))
