"""MessagingProcessor: the one door to the brokers for every protocol adapter.

MQTT, AMQP, HTTP/CloudEvents and gRPC adapters translate their frames into
these calls; nothing here knows any wire protocol. The processor owns what
must be the same whichever door a client came through: authorization,
metrics, topic auto-creation, message-type checks, producer load balancing
(round robin over writable queues; a FIFO message group hashed to one queue),
and routing each call to the broker that owns the data.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Callable, Sequence

from core_broker.broker_controller import TopicStats
from core_broker.errors import (BadRequestError, BrokerWriteBlockedError, InvalidArgumentError,
                                 TopicNotFoundError, UnimqError)
from core_broker.remoting.client import PeerUnavailableError
from core_broker.filter import compile_filter
from core_broker.model import FilterExpression, GetResult, Message, MessageType, StoredMessage
from core_broker.pop_service import PoppedMessage
from core_broker.receipt import InvalidReceiptHandleError, broker_of
from core_broker.system_topics import dlq_topic, is_lmq, is_system_topic
from core_broker.topic_config import TopicConfig, merge_attributes, validate_attributes, validate_topic_name
from core_broker.transaction_service import TransactionChecker

from .api import (
    ACCEPTED_MESSAGE_TYPES,
    MessageTypeMismatchError,
    NoWritableQueueError,
    ProcessorConfig,
    Router,
    SendResult,
    route_extra,
)
from .auth import Action, AllowAll, Authorizer, ForbiddenError, Resource, UnauthorizedError
from .broker_client import BrokerClient, TopicRoute
from .context import RequestContext
from .door_state import DoorStateCalls
from .door_watch import DoorWatchCalls
from .metrics import Metrics
from .namespace import namespaced_calls
from .processor_admin import AdminCalls
from .processor_columnar import ColumnarCalls
from .processor_trace import TraceCalls
from .trace import Tracer, check_trace_attributes
from .batch_codec import expand_all, expand_popped
from .batch_send import check_batchable, pack_call
from .processor_bulk import BulkCalls
from .processor_lanes import LaneCalls
from .send_now import SendNow, too_large
from .send_plan import PLAIN_KEYS as _PLAIN_KEYS, TopicPlan, clean_properties, message_type_of, run_length, select_queue

__all__ = [
    "ACCEPTED_MESSAGE_TYPES", "MessageTypeMismatchError", "MessagingProcessor", "NoWritableQueueError",
    "ProcessorConfig", "Router", "SendResult", "message_type_of",
]

log = logging.getLogger("unimq.processor")

_tuple_new = tuple.__new__
_NONE_FAILED: frozenset[str] = frozenset()  # a send's failed brokers until one fails (copied before use)
_PUB, _SUB, _TOPIC, _GROUP = Action.PUBLISH, Action.SUBSCRIBE, Resource.TOPIC, Resource.GROUP


@namespaced_calls
class MessagingProcessor(AdminCalls, ColumnarCalls, DoorStateCalls, DoorWatchCalls, TraceCalls, BulkCalls, LaneCalls, SendNow):
    """The processor API (gateway/api.py :class:`MessagingAPI`) over a broker client.

    Namespaces are applied to every call of the API by the class decorator
    (gateway/namespace.py); the methods below are written for one namespace.
    """

    def __init__(
        self,
        broker: BrokerClient,
        config: ProcessorConfig | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.broker = broker
        self.config = config or ProcessorConfig()
        self.metrics = Metrics()
        self._rr = itertools.count()
        self._route_rr: dict[str, int] = {}
        self._plans: dict[str, TopicPlan] = {}
        self._route_nowait = broker.route_nowait
        self._checkers: list[TransactionChecker] = []
        self._routers: list[Router] = []
        self.set_authorizer(authorizer or AllowAll())
        # message traces: every hook reads tracer.on first (false: tracing costs that read)
        self.tracer = Tracer(broker, self.config.trace_sample_rate, self.config.trace_flush_ms, metrics=self.metrics)

    async def start(self) -> None:
        await self.broker.start()
        await self.tracer.refresh()
        self.tracer.start()

    async def stop(self) -> None:
        await self.tracer.stop()
        await self.broker.stop()

    # ------------------------------------------------------------------ authorization

    def set_authorizer(self, authorizer: Authorizer) -> None:
        """Install the authorizer every call of every door asks (see gateway/auth.py)."""
        self.authorizer = authorizer
        self._check: Callable[[RequestContext, Action, Resource, str], None] = authorizer.check
        self._allow_all = type(authorizer) is AllowAll

    def authorize(self, ctx: RequestContext, action: Action, resource: Resource, name: str) -> None:
        """Raise ForbiddenError/UnauthorizedError unless ``ctx`` may do ``action`` on ``name``:
        for what a door decides itself (an MQTT subscription's filter, a delivery)."""
        self._check(ctx, action, resource, name)

    def allowed(self, ctx: RequestContext, action: Action, resource: Resource, name: str) -> bool:
        """:meth:`authorize` as a yes/no, for doors whose protocol refuses without an error."""
        try:
            self._check(ctx, action, resource, name)
        except (ForbiddenError, UnauthorizedError):
            return False
        return True

    def _consume_check(self, ctx: RequestContext, group: str, topic: str) -> None:
        if self._allow_all:  # consumption's hot paths pay one call, as with one check
            return
        check = self._check
        check(ctx, _SUB, _TOPIC, topic)
        check(ctx, _SUB, _GROUP, group)

    def _may_use(self, ctx: RequestContext, topic: str) -> bool:
        return self.allowed(ctx, _PUB, _TOPIC, topic) or self.allowed(ctx, _SUB, _TOPIC, topic)

    def _use_check(self, ctx: RequestContext, topic: str) -> None:
        """Producers and consumers alike ask for routes and descriptions: either right will do."""
        try:
            self._check(ctx, _PUB, _TOPIC, topic)
        except ForbiddenError:
            self._check(ctx, _SUB, _TOPIC, topic)

    # ------------------------------------------------------------------ helpers

    async def _route(self, ctx: RequestContext, topic: str, create: bool = False) -> TopicRoute:
        route = await self.broker.route(topic)
        if route is None:
            if create and self.config.auto_create_topics and not is_system_topic(topic):
                validate_topic_name(topic)
                await self.broker.create_topic(
                    TopicConfig(topic, queues=self.config.default_queue_count), exist_ok=True
                )
                route = await self.broker.route(topic)
            if route is None:
                raise TopicNotFoundError(f"topic {topic!r} does not exist")
        return route

    @staticmethod
    def _broker_of_handle(receipt_handle: str) -> str:
        return broker_of(receipt_handle)

    # ------------------------------------------------------------------ send

    def _plan_nowait(self, ctx: RequestContext, topic: str) -> TopicPlan | None:
        """Everything a send needs about one topic, once per call; None when the route
        is not at hand without a round trip (then :meth:`_send_plan`)."""
        self._publish_check(ctx, topic)
        route = self._route_nowait(topic)
        if route is None:
            return None
        return self._plan_for(topic, route)

    def _publish_check(self, ctx: RequestContext, topic: str) -> None:
        """Every send to ``topic`` asks: not a broker-reserved topic, and the caller may publish."""
        if topic[:1] == "%" and not is_lmq(topic):
            raise BadRequestError(f"topic {topic!r} is reserved for the broker")
        if not self._allow_all:  # the out-of-the-box broker pays no call
            self._check(ctx, _PUB, _TOPIC, topic)

    async def _send_plan(self, ctx: RequestContext, topic: str) -> TopicPlan:
        route = await self._route(ctx, topic, create=True)
        return self._plan_for(topic, route)

    def _plan_for(self, topic: str, route: TopicRoute) -> TopicPlan:
        # Kept across calls while the broker client hands out the same route object
        # (the round-robin position lives in the plan).
        plan = self._plans.get(topic)
        if plan is None or plan.route is not route:
            if len(self._plans) > 65536:
                self._plans.clear()
            plan = self._plans[topic] = TopicPlan(route, plan.rr if plan is not None else 0)
        return plan

    async def send(
        self,
        ctx: RequestContext,
        messages: Sequence[Message],
        *,
        transactional: bool = False,
        producer_group: str = "",
    ) -> list[SendResult]:
        """Send one message or a batch (all to one topic or several).

        One flat loop on purpose (the hottest path of every door; short paths: send_now.py): per topic of
        the call one route, authorization and type table (:class:`TopicPlan`); per message its own checks.
        """
        n = len(messages)
        if n == 1 and not transactional:
            if (now_done := self._send_now(ctx, messages)) is not None:  # waits for nothing: send_now.py
                return now_done
            # only a batch topic with a linger gathers single sends: asked without a coroutine first
            lp = self._plans.get(messages[0].topic)
            if lp is not None and lp.linger and (lingered := await self._lingered(ctx, messages)) is not None:
                return lingered  # gathered into a batch (batch.linger_ms): processor_bulk.py
        elif n > 1 and not transactional and (run := self._send_run(ctx, messages)) is not None:
            return run  # one topic's plain messages, waiting for nothing: send_now.py
        if not n:
            raise BadRequestError("nothing to send")
        if n > self.config.max_batch:
            raise BadRequestError(f"a batch holds at most {self.config.max_batch} messages")
        max_size = self.config.door_message_limits.get(ctx.protocol, self.config.max_message_size)
        plans: dict[str, TopicPlan] = {}
        # per topic of the call: [plan, first round-robin position, messages so far, run length]
        states: dict[str, list] = {}
        st: list = []
        plan: TopicPlan | None = None
        # the current topic's plan fields, in locals while its run lasts (read per message)
        accepts: frozenset[str] = frozenset()
        batch: str | None = None
        rr_inline = False  # round robin inline (else plan.select per message)
        writable: list = []
        nw = 1
        last_topic = None
        now = int(time.time() * 1000)
        protocol = ctx.protocol
        host = ctx.remote_address
        routers = self._routers
        routing: Sequence[Router] = ()  # the routers with something to route for last_proto
        last_proto = None
        brokers: list[str] = []  # per message: the broker its queue is on
        one_broker: str | None = None
        mixed = False
        nbytes = 0
        for m in messages:
            topic = m.topic
            if topic is not last_topic:
                st = states.get(topic)  # type: ignore[assignment]
                if st is None:
                    plan = self._plan_nowait(ctx, topic)
                    if plan is None:
                        plan = await self._send_plan(ctx, topic)
                    plans[topic] = plan
                    # contiguous queue runs (send_plan.run_length): the store writes each at once
                    st = states[topic] = [plan, plan.rr, 0, n if plan.batch else run_length(n, plan.nw)]
                plan = st[0]
                accepts, batch, writable, nw = plan.accepts, plan.batch, plan.writable, plan.nw
                rr_inline = not plan.fifo and nw > 0
                last_topic = topic
            size = len(m.body)
            nbytes += size
            if size > max_size:
                raise too_large(size, max_size)
            # the message's type as a plain string (a str hash is cached; an enum's is not)
            if transactional:
                mtype = "TRANSACTION"
            elif m.message_group:
                mtype = "FIFO"
            elif m.delivery_time_ms:
                mtype = "DELAY"
            else:
                mtype = "NORMAL"
            if mtype not in accepts:
                raise plan.refused(mtype)  # type: ignore[union-attr]
            if batch is not None:
                check_batchable(topic, mtype)
            props = m.properties
            if props and not _PLAIN_KEYS.issuperset(props):
                clean_properties(m)
            if m.protocol == "internal":
                m.protocol = protocol
            if not m.born_host:
                m.born_host = host
            if not m.born_timestamp_ms:
                m.born_timestamp_ms = now
            if m.protocol is not last_proto and routers:
                last_proto = m.protocol
                routing = [r for r in routers if r.routes_from(last_proto)]
            if routing:
                route_extra(routing, m)
            if rr_inline:  # round robin in runs, inline
                j = st[2]
                st[2] = j + 1
                q = writable[(st[1] + j // st[3]) % nw]
            else:
                q = plan.select(m)  # type: ignore[union-attr]
            m.queue_id = q.queue_id
            b = q.broker
            brokers.append(b)
            if b != one_broker:
                if one_broker is None:
                    one_broker = b
                else:
                    mixed = True
        for p, rr0, k, per in states.values():
            if k:
                p.rr = rr0 + -(-k // per)  # the next call starts at the next queue
        sent, packed = messages, None
        if n > 1 and any(p.batch is not None for p in plans.values()):  # batch topics: gateway/batch_send.py
            packed = pack_call(messages, brokers, {t: p.batch for t, p in plans.items() if p.batch is not None})
            sent, brokers, mixed = packed.stored, packed.brokers, len(set(packed.brokers)) > 1
        results: list[SendResult] | None = None
        failed: frozenset[str] | set[str] = _NONE_FAILED
        if not mixed:  # the common case: every message of the call goes to one broker
            try:
                put = await self.broker.send(one_broker, sent, transactional, producer_group)  # type: ignore[arg-type]  # set: n > 0
            except (PeerUnavailableError, BrokerWriteBlockedError):
                failed = {one_broker}  # type: ignore[arg-type]  # regrouped below
            else:
                new = _tuple_new
                if len(sent) == 1:
                    m = sent[0]
                    r, tid = put[0]
                    results = [new(SendResult, (r[1], m.topic, one_broker, m.queue_id, r[3], tid, r[6]))]
                else:
                    results = [
                        new(SendResult, (r[1], m.topic, one_broker, m.queue_id, r[3], tid, r[6]))
                        for m, (r, tid) in zip(sent, put)
                    ]
        if results is None:
            by_broker: dict[str, list[tuple[int, Message]]] = {}
            for i, (m, b) in enumerate(zip(sent, brokers)):
                by_broker.setdefault(b, []).append((i, m))
            results = await self._send_grouped(by_broker, plans, transactional, producer_group, len(sent), set(failed))
        if packed is not None:
            results = packed.results(results)
        if self.tracer.on:
            self.tracer.stored(ctx, messages, results)
        metrics = self.metrics
        if len(plans) == 1:
            metrics.count_in(protocol, last_topic, n, nbytes)  # type: ignore[arg-type]
        else:
            metrics.inc("messages_in", protocol, n)
            metrics.inc("bytes_in", protocol, nbytes)
            for m in messages:
                metrics.inc_topic("messages_in", protocol, m.topic)
                metrics.inc_topic("bytes_in", protocol, m.topic, len(m.body))
        if routers:
            self._after_send(messages, results)
        return results

    def _after_send(self, messages: Sequence[Message], results: list[SendResult]) -> None:  # both send paths
        for router in self._routers:
            try:
                router.after_send(messages, results)
            except Exception:  # a door's live delivery must never fail a stored send
                log.exception("router %r failed after a send", router)

    async def _send_grouped(
        self,
        by_broker: dict[str, list[tuple[int, Message]]],
        plans: dict[str, TopicPlan],
        transactional: bool,
        producer_group: str,
        n: int,
        failed: set[str],
    ) -> list[SendResult]:
        """Messages spread over several brokers, or a broker that failed: one call per broker,
        all brokers at once, and a broker that is down or draining is replaced by the topic's
        queues on the others."""
        results: list[SendResult | None] = [None] * n
        send = self.broker.send

        async def to(broker: str, items: list[tuple[int, Message]]) -> list:
            if broker in failed:
                raise PeerUnavailableError(f"broker {broker!r} failed in this send")
            return await send(broker, [m for _, m in items], transactional, producer_group)

        for attempt in range(3):
            groups = list(by_broker.items())
            if len(groups) == 1:
                try:
                    answers: list = [await to(*groups[0])]
                except (PeerUnavailableError, BrokerWriteBlockedError) as e:
                    answers = [e]
            else:  # separated mode: the brokers' round trips overlap
                answers = await asyncio.gather(*(to(b, items) for b, items in groups), return_exceptions=True)
            lost: list[tuple[int, Message]] = []
            for (broker, items), put in zip(groups, answers):
                if isinstance(put, (PeerUnavailableError, BrokerWriteBlockedError)):
                    # that broker is down or draining; the topic stays writable through
                    # the queues of the others
                    failed.add(broker)
                    if attempt == 2:
                        raise put
                    lost += items
                    continue
                if isinstance(put, BaseException):
                    raise put
                new = _tuple_new  # (message_id, queue_offset and extra_offsets of the PutResult)
                for (i, m), (r, tid) in zip(items, put):
                    results[i] = new(SendResult, (r[1], m.topic, broker, m.queue_id, r[3], tid, r[6]))
            if not lost:
                break
            by_broker = {}
            for i, m in lost:
                route = plans[m.topic].route
                alive = TopicRoute(route.config, [q for q in route.queues if q.broker not in failed])
                q = select_queue(alive, m, self._route_rr)
                m.queue_id = q.queue_id
                by_broker.setdefault(q.broker, []).append((i, m))
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------ cross-protocol routing

    def add_router(self, router: "Router") -> None:
        """Let a door route every message sent through any door (see :class:`Router`)."""
        self._routers.append(router)

    def remove_router(self, router: "Router") -> None:
        if router in self._routers:
            self._routers.remove(router)

    async def end_transaction(
        self,
        ctx: RequestContext,
        topic: str,
        transaction_id: str,
        commit: bool,
        *,
        from_check: bool = False,
        broker: str | None = None,
    ) -> None:
        self._check(ctx, _PUB, _TOPIC, topic)
        kind = "check" if from_check else "client"
        last: Exception | None = None
        tried: set[str] = set()
        for fresh in (False, True):
            if not fresh:
                brokers = [broker] if broker is not None else (await self._route(ctx, topic)).brokers
            elif broker is None:
                # separated: a route cached while a cluster (re)started may lack the broker that
                # holds the half message; ask the nameservers again before saying "unknown"
                self.broker.invalidate(topic)
                route = await self.broker.route(topic)
                brokers = route.brokers if route is not None else []
            else:
                break
            for b in brokers:  # the id names its broker only implicitly: try the topic's brokers
                if b in tried:
                    continue
                tried.add(b)
                try:
                    await self.broker.end_transaction(b, transaction_id, commit, kind)
                    self.metrics.inc("transactions_committed" if commit else "transactions_rolled_back", ctx.protocol)
                    return
                except UnimqError as e:
                    last = e
        raise last if last else TopicNotFoundError(f"topic {topic!r} has no broker")

    def set_transaction_checker(self, checker: TransactionChecker | None) -> None:
        """Replace every registered checker with ``checker`` (None: no checks are delivered)."""
        self._checkers = [checker] if checker is not None else []
        self.broker.set_transaction_checker(self._dispatch_check if self._checkers else None)

    def add_transaction_checker(self, checker: TransactionChecker) -> None:
        """Add a checker; a check goes to each in turn until one says it asked a producer.

        Several doors (the gRPC door's Telemetry streams, remote callers polling the
        processor RPC) may each hold producers of some topics.
        """
        self._checkers.append(checker)
        self.broker.set_transaction_checker(self._dispatch_check)

    def remove_transaction_checker(self, checker: TransactionChecker) -> None:
        """Undo :meth:`add_transaction_checker` (a door that stops)."""
        if checker in self._checkers:
            self._checkers.remove(checker)
        self.broker.set_transaction_checker(self._dispatch_check if self._checkers else None)

    async def _dispatch_check(self, topic: str, producer_group: str, message: StoredMessage, tid: str) -> bool:
        for checker in list(self._checkers):
            if await checker(topic, producer_group, message, tid):
                return True
        return False

    # ------------------------------------------------------------------ pop consumption

    async def pop(
        self,
        ctx: RequestContext,
        group: str,
        topic: str,
        max_count: int = 32,
        invisible_ms: int = 30_000,
        filter_expression: FilterExpression | None = None,
        wait_ms: int = 0,
        *,
        from_latest: bool = False,
    ) -> list[PoppedMessage]:
        """Receive up to ``max_count`` messages hidden for ``invisible_ms``; long-poll ``wait_ms``."""
        self._consume_check(ctx, group, topic)
        if not group:
            raise BadRequestError("a consumer group is required")
        if filter_expression is not None:
            compile_filter(filter_expression)  # a bad expression is the caller's error, before any wait
        route = self._route_nowait(topic)
        if route is None:
            route = await self._route(ctx, topic)
        brokers = route.readable_brokers
        if not brokers:
            return []
        if len(brokers) == 1:
            order = brokers
        else:
            start = next(self._rr) % len(brokers)
            order = brokers[start:] + brokers[:start]
        out: list[PoppedMessage] = []
        # ask each broker without waiting first; long-poll the first one only if all are empty
        live: list[str] = []
        for b in order:
            try:
                out.extend(
                    await self.broker.pop(
                        b, group, topic, max_count - len(out), invisible_ms, filter_expression, 0, from_latest
                    )
                )
            except PeerUnavailableError:
                continue  # separated mode: a dead broker's queues are skipped
            live.append(b)
            if len(out) >= max_count:
                break
        if not out and wait_ms > 0 and live:
            # Long-poll one broker; with several, wake often enough to see the others.
            per = wait_ms if len(live) == 1 else min(wait_ms, 1000)
            deadline = time.monotonic() + wait_ms / 1000.0
            i = 0
            while not out and time.monotonic() < deadline:
                left = int((deadline - time.monotonic()) * 1000)
                b = live[i % len(live)]
                i += 1
                try:
                    out = await self.broker.pop(
                        b, group, topic, max_count, invisible_ms, filter_expression, max(0, min(per, left)), from_latest
                    )
                except PeerUnavailableError:
                    live.remove(b)
                    if not live:
                        break
        if out:
            out = expand_popped(out)  # a message of a batch record as itself (gateway/batch_codec.py)
            self.metrics.count_out(ctx.protocol, topic, len(out), sum(len(pm.message.body) for pm in out))
            if self.tracer.on and not is_lmq(topic):  # a door's LMQ pop is traced as its delivery
                self.tracer.popped(ctx, group, out)
        return out

    async def ack(self, ctx: RequestContext, group: str, topic: str, receipt_handle: str) -> None:
        self._consume_check(ctx, group, topic)
        await self.broker.ack(self._broker_of_handle(receipt_handle), group, receipt_handle)
        self.metrics.inc("acks", ctx.protocol)
        if self.tracer.on:
            self.tracer.settled(ctx, group, receipt_handle, "acked")

    async def ack_batch(
        self, ctx: RequestContext, group: str, topic: str, receipt_handles: Sequence[str]
    ) -> list[str | None]:
        """Ack several messages at once: one broker call and one journal record per broker.

        Returns, per handle, None or the error code it failed with (a bad or stale handle
        does not fail the others).
        """
        self._consume_check(ctx, group, topic)
        by_broker: dict[str, list[int]] = {}
        for i, h in enumerate(receipt_handles):
            try:
                b = broker_of(h)
            except UnimqError:
                b = ""
            idx = by_broker.get(b)
            if idx is None:
                by_broker[b] = [i]
            else:
                idx.append(i)
        out: list[str | None] = [None] * len(receipt_handles)
        batch = self.broker.ack_batch

        async def settle(b: str, idx: list[int]) -> None:
            if not b:
                for i in idx:
                    out[i] = InvalidReceiptHandleError.code
                return
            hs = receipt_handles if len(by_broker) == 1 else [receipt_handles[i] for i in idx]
            res = await batch(b, group, hs)
            for i, r in zip(idx, res):
                out[i] = r

        if len(by_broker) == 1:
            await settle(*next(iter(by_broker.items())))
        else:  # one call per broker, all at once
            await asyncio.gather(*(settle(b, idx) for b, idx in by_broker.items()))
        self.metrics.inc("acks", ctx.protocol, out.count(None))
        if self.tracer.on:
            self.tracer.acked_batch(ctx, group, receipt_handles, out)
        return out

    async def change_invisible(
        self, ctx: RequestContext, group: str, topic: str, receipt_handle: str, invisible_ms: int
    ) -> tuple[str, int]:
        """Re-hide (or, with 0, release at once) a popped message; returns the new handle."""
        self._consume_check(ctx, group, topic)
        out = await self.broker.change_invisible(
            self._broker_of_handle(receipt_handle), group, receipt_handle, invisible_ms
        )
        if self.tracer.on:
            self.tracer.released(ctx, group, receipt_handle, invisible_ms, out[0])
        return out

    async def forward_to_dlq(self, ctx: RequestContext, group: str, topic: str, receipt_handle: str) -> None:
        self._consume_check(ctx, group, topic)
        await self.broker.forward_to_dlq(self._broker_of_handle(receipt_handle), group, receipt_handle)
        self.broker.invalidate(dlq_topic(group))  # separated: the DLQ may be new, or new on that broker
        self.metrics.inc("dead_lettered", ctx.protocol)
        if self.tracer.on:
            self.tracer.settled(ctx, group, receipt_handle, "dead_lettered", dlq=dlq_topic(group))

    # ------------------------------------------------------------------ pull consumption

    async def _queue_broker(self, ctx: RequestContext, topic: str, queue_id: int, broker: str | None) -> str:
        if broker is not None:
            return broker
        route = await self._route(ctx, topic)
        owners = [q.broker for q in route.queues if q.queue_id == queue_id]
        if not owners:
            raise BadRequestError(f"topic {topic!r} has no queue {queue_id}")
        return owners[0]

    async def pull(
        self,
        ctx: RequestContext,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        filter_expression: FilterExpression | None = None,
        wait_ms: int = 0,
        *,
        broker: str | None = None,
    ) -> GetResult:
        """Read a queue by offset (queue-level load balancing; what Spark uses)."""
        self._check(ctx, _SUB, _TOPIC, topic)
        b = await self._queue_broker(ctx, topic, queue_id, broker)
        r = await self.broker.pull(b, topic, queue_id, offset, max_count, filter_expression, wait_ms)
        if r.messages:
            r = r._replace(messages=expand_all(r.messages))
            self.metrics.count_out(ctx.protocol, topic, len(r.messages), sum(len(m.body) for m in r.messages))
            if self.tracer.on and not is_lmq(topic):  # a door's LMQ read-back is traced as its delivery
                self.tracer.pulled(ctx, r.messages)
        return r

    async def commit_offset(
        self, ctx: RequestContext, group: str, topic: str, queue_id: int, offset: int, *, broker: str | None = None
    ) -> None:
        self._consume_check(ctx, group, topic)
        await self.broker.commit_offset(await self._queue_broker(ctx, topic, queue_id, broker), group, topic, queue_id, offset)

    async def get_offset(
        self, ctx: RequestContext, group: str, topic: str, queue_id: int, *, broker: str | None = None
    ) -> int | None:
        """The group's committed offset, or None if it never committed one."""
        self._consume_check(ctx, group, topic)
        b = await self._queue_broker(ctx, topic, queue_id, broker)
        return await self.broker.get_offset(b, group, topic, queue_id)

    async def query_offset(
        self,
        ctx: RequestContext,
        topic: str,
        queue_id: int,
        policy: str = "end",
        timestamp_ms: int = 0,
        *,
        broker: str | None = None,
    ) -> int:
        self._check(ctx, _SUB, _TOPIC, topic)
        b = await self._queue_broker(ctx, topic, queue_id, broker)
        return await self.broker.query_offset(b, topic, queue_id, policy, timestamp_ms)

    # ------------------------------------------------------------------ route and admin

    async def query_route(self, ctx: RequestContext, topic: str) -> TopicRoute:
        self._use_check(ctx, topic)
        return await self._route(ctx, topic, create=False)

    async def create_topic(
        self,
        ctx: RequestContext,
        name: str,
        queues: int | None = None,
        message_type: MessageType | str = MessageType.NORMAL,
        exist_ok: bool = False,
        attributes: dict[str, str] | None = None,
    ) -> TopicConfig:
        """A new topic; ``attributes`` (strings) are kept with it, e.g. ``tier_retention_hours``
        (hours as a number, 0 = keep in the tier for ever). An existing topic keeps its own."""
        self._check(ctx, Action.CREATE, _TOPIC, name)
        if is_system_topic(name) and not is_lmq(name):
            raise BadRequestError("topic names starting with '%' are reserved (doors may create '%LMQ%' queues)")
        try:
            mtype = MessageType(message_type)
        except ValueError:
            raise InvalidArgumentError(
                f"unknown topic type {message_type!r}: one of NORMAL, FIFO, DELAY, TRANSACTION, COMPACTED"
            ) from None
        attrs = validate_attributes(attributes or {})
        check_trace_attributes(attrs)
        tc = TopicConfig(name, queues=self.config.default_queue_count if queues is None else queues, message_type=mtype,
                         attributes=attrs)
        created = await self.broker.create_topic(tc, exist_ok=exist_ok)
        if created.attributes:
            self.tracer.set_topic(created)
        return created

    async def host_lmq(self, ctx: RequestContext, name: str, broker: str) -> None:
        """Make an LMQ known on ``broker`` so its part of the LMQ can be pulled there.

        A multi-dispatched message's LMQ entries are written by the broker that stores the
        message. Every broker reads every LMQ (queue 0) without a topic-table entry or a
        route; hosting notes the LMQ in ``broker``'s memory (no write), so that it names
        the LMQ as its own (``get_topic``) before an entry arrives there.
        """
        self._check(ctx, Action.CREATE, _TOPIC, name)
        if not is_lmq(name):
            raise BadRequestError("only '%LMQ%' topics are hosted per broker")
        await self.broker.host_queue(broker, name)

    async def update_topic(
        self, ctx: RequestContext, name: str, *, queues: int | None = None, perm: int | None = None,
        attributes: dict[str, str | None] | None = None,
    ) -> TopicConfig:
        """Add queues, set the permission (ADMIN), merge ``attributes`` (a None value removes one,
        checked as at creation; alone they need CREATE, as creating the topic does, or ADMIN)."""
        if queues is not None or perm is not None or not self.allowed(ctx, Action.CREATE, _TOPIC, name):
            self._check(ctx, Action.ADMIN, _TOPIC, name)
        tc = (await self._route(ctx, name)).config
        attrs = (await self.broker.describe_topic(name)).config.attributes  # a route carries none
        updated = TopicConfig(
            name, queues=queues if queues is not None else tc.queues, message_type=tc.message_type,
            perm=perm if perm is not None else tc.perm, attributes=merge_attributes(attrs, attributes or {}),
        )
        if updated.queues < tc.queues:
            raise BadRequestError("queues can be added to a topic, not removed")
        check_trace_attributes(updated.attributes)
        done = await self.broker.update_topic(updated)
        self.tracer.set_topic(updated)
        return done

    async def delete_topic(self, ctx: RequestContext, name: str) -> None:
        self._check(ctx, Action.DELETE, _TOPIC, name)
        if is_system_topic(name) and not name.startswith(("%DLQ%", "%RETRY%", "%LMQ%")):
            raise BadRequestError("system topics cannot be deleted")
        await self.broker.delete_topic(name)
        self.tracer.forget_topic(name)

    async def list_topics(self, ctx: RequestContext, include_system: bool = False) -> list[TopicConfig]:
        """The topics the caller may publish to or consume from."""
        topics = await self.broker.list_topics(include_system)
        if self._allow_all:
            return topics
        return [t for t in topics if self._may_use(ctx, t.name)]

    async def describe_topic(self, ctx: RequestContext, name: str) -> TopicStats:
        self._use_check(ctx, name)
        return await self.broker.describe_topic(name)

    # ------------------------------------------------------------------ query

    async def query_message_by_id(self, ctx: RequestContext, message_id: str) -> StoredMessage | None:
        m = await self.broker.query_by_id(message_id)
        if m is not None:
            self._check(ctx, _SUB, _TOPIC, m.topic)  # the resource is known once found
        return expand_all([m])[0] if m is not None else m  # a batch's first message, as itself

    async def query_messages_by_key(
        self, ctx: RequestContext, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**62, max_count: int = 32
    ) -> list[StoredMessage]:
        self._check(ctx, _SUB, _TOPIC, topic)
        return await self.broker.query_by_key(topic, key, begin_ms, end_ms, max_count)

    # ------------------------------------------------------------------ observability

    async def consumer_lag(self, ctx: RequestContext) -> list[tuple[str, str, int]]:
        """(group, topic, messages not yet consumed) for every pop and pull consumer group."""
        self._check(ctx, Action.ADMIN, Resource.CLUSTER, "")
        return await self.broker.consumer_lag()

    async def store_stats(self, ctx: RequestContext) -> dict:
        """Store size and flush timings, summed over the brokers (see BrokerController.store_stats)."""
        self._check(ctx, Action.ADMIN, Resource.CLUSTER, "")
        return await self.broker.store_stats()

