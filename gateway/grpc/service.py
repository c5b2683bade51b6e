"""The v2 ``MessagingService`` servicer: each RPC translated into MessagingProcessor calls.

Why grpcio (``grpc.aio``) and the stubs shipped in ``rocketmq-python-client``
rather than our own HTTP/2 + protobuf code: the stubs are the protocol's
definition as the official clients use it (a dependency, not a copy), and
grpc.aio runs the servicer on the same event loop as the processor, so a call
is an ``await`` away from the store with no thread hop.

Every unary response carries a v2 ``Status``: errors raised by the processor
(``core_broker.errors``, each with a ``code``) become the v2 code of the same
name (see :func:`convert.status_code_of`), so the official client raises its
own matching exception (NotFound, BadRequest, PayloadTooLarge, Unauthorized...).
gRPC-level errors are reserved for what the protocol cannot express.

Route answers advertise the gateway itself: the proxy acts as the nameserver,
so ``broker.endpoints`` of every queue is the address the client used to reach
us (the request's ``endpoints``), falling back to the door's bound address.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, TypeVar

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc

from core_broker.errors import TopicNotFoundError, UnimqError
from core_broker.model import GetStatus, MessageType, StoredMessage
from core_broker.system_topics import is_system_topic
from gateway.access.traffic import QuotaExceededError
from gateway.auth import UnauthorizedError
from gateway.context import RequestContext
from gateway.api import ACCEPTED_MESSAGE_TYPES, MessagingAPI

from . import convert as cv
from .convert import Code
from .renewal import Renewer
from .sessions import SessionRegistry
from .login import identify
from .signature import KeyRing

log = logging.getLogger("unimq.grpc")

R = TypeVar("R")

DEFAULT_INVISIBLE_MS = 30_000
# A push consumer asks for auto-renew and no invisible time: messages are hidden for
# this long and renewed by the door (renewal.py) until the client acks or nacks them.
AUTO_RENEW_INVISIBLE_MS = 60_000
MAX_BATCH = 1024
LONG_POLL_MARGIN_S = 0.5  # end a long poll this long before the call's deadline
SESSION_IDLE_S = 120.0  # a client without a Telemetry stream, silent this long, is forgotten


def _unary(response_cls: type[R]) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """Turn exceptions of a unary handler into a response with the matching v2 status."""

    def deco(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        @functools.wraps(fn)
        async def handler(self: "MessagingService", request: Any, context: grpc.aio.ServicerContext) -> R:
            try:
                return await fn(self, request, context)
            except cv.InvalidMessage as e:
                return response_cls(status=cv.status(e.code, str(e)))  # type: ignore[call-arg]
            except UnimqError as e:
                return response_cls(status=cv.status(cv.status_code_of(e), str(e)))  # type: ignore[call-arg]
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug: answer with the protocol's error, keep serving
                log.exception("%s failed", fn.__name__)
                return response_cls(status=cv.status(Code.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}"))  # type: ignore[call-arg]

        return handler

    return deco


def _peer(context: grpc.aio.ServicerContext) -> str:
    peer = context.peer() or ""
    for prefix in ("ipv4:", "ipv6:"):
        if peer.startswith(prefix):
            return peer[len(prefix) :]
    return peer


class MessagingService(sgrpc.MessagingServiceServicer):
    """apache.rocketmq.v2.MessagingService over the processor API (:class:`MessagingAPI`)."""

    def __init__(
        self,
        processor: MessagingAPI,
        *,
        credentials: Mapping[str, str] | None = None,
        identities: Any = None,
        max_delivery_attempts: int = 16,
        retry_backoff_ms: tuple[int, ...] = (1000,),
        long_polling_ms: int = 20_000,
        cert_identity: bool = False,
    ) -> None:
        self.processor = processor
        self.cert_identity = cert_identity  # grpc_cert_identity: a verified client certificate's CN is the user
        # grpc_credentials, then the identity store's access keys (gateway.access.store.IdentityStore)
        self.identities = identities  # also its traffic limits (gateway.access.traffic)
        self.credentials = KeyRing(credentials or {}, identities.access_key if identities is not None else None,
                                   (lambda: identities.has_users) if identities is not None else None)
        self.max_delivery_attempts = max_delivery_attempts
        self.retry_backoff_ms = retry_backoff_ms
        self.long_polling_ms = long_polling_ms
        self.sessions = SessionRegistry()
        self._pruned = time.monotonic()
        self.renewer = Renewer(processor, self._client_alive, invisible_ms=AUTO_RENEW_INVISIBLE_MS)
        # the door's own address: advertised in routes when a request names no endpoints
        self.default_endpoints = cv.endpoints([("127.0.0.1", 8081)])

    # ------------------------------------------------------------------ helpers

    def _client_alive(self, client_id: str) -> bool:
        s = self.sessions.sessions.get(client_id)
        return s is not None and (s.live or time.monotonic() - s.last_seen < SESSION_IDLE_S / 4)

    async def _ctx(self, context: grpc.aio.ServicerContext) -> tuple[RequestContext, Mapping[str, str]]:
        """The processor context of a call, after checking its login (``login.py``; UnauthorizedError)."""
        md = cv.metadata_dict(context.invocation_metadata())
        principal = await identify(md, context, self.credentials, self.identities, self.cert_identity)
        ctx = RequestContext(
            protocol="grpc",
            client_id=md.get("x-mq-client-id", ""),
            remote_address=_peer(context),
            principal=principal,
            namespace=md.get("x-mq-namespace", ""),
        )
        return ctx, md

    def _endpoints(self, requested: pb.Endpoints | None) -> pb.Endpoints:
        if requested is not None and requested.addresses:
            return requested
        return self.default_endpoints

    @staticmethod
    def _topic(resource: pb.Resource) -> str:
        if not resource.name:
            raise cv.InvalidMessage(Code.ILLEGAL_TOPIC, "topic is required")
        return cv.resource_name(resource)

    @staticmethod
    def _group(resource: pb.Resource) -> str:
        if not resource.name:
            raise cv.InvalidMessage(Code.ILLEGAL_CONSUMER_GROUP, "consumer group is required")
        return cv.resource_name(resource)

    async def _route(self, ctx: RequestContext, topic: str):  # -> TopicRoute
        try:
            return await self.processor.query_route(ctx, topic)
        except TopicNotFoundError:
            # The proxy is the nameserver here: with auto-creation on, a route query
            # creates the topic, as a first send would (clients cannot send without a route).
            if not self.processor.config.auto_create_topics or is_system_topic(topic):
                raise
            await self.processor.create_topic(ctx, topic, exist_ok=True)
            return await self.processor.query_route(ctx, topic)

    def _queues(self, ns: str, topic: str, route: Any, eps: pb.Endpoints) -> list[pb.MessageQueue]:
        accept = ACCEPTED_MESSAGE_TYPES[route.config.message_type]
        return [cv.message_queue(ns, topic, q.queue_id, q.perm, q.broker, eps, accept) for q in route.queues]

    # ------------------------------------------------------------------ route, heartbeat, assignment

    @_unary(spb.QueryRouteResponse)
    async def QueryRoute(self, request: spb.QueryRouteRequest, context: grpc.aio.ServicerContext) -> spb.QueryRouteResponse:
        ctx, _ = await self._ctx(context)
        topic = self._topic(request.topic)
        route = await self._route(ctx, topic)
        eps = self._endpoints(request.endpoints if request.HasField("endpoints") else None)
        return spb.QueryRouteResponse(
            status=cv.OK, message_queues=self._queues(request.topic.resource_namespace, topic, route, eps)
        )

    @_unary(spb.HeartbeatResponse)
    async def Heartbeat(self, request: spb.HeartbeatRequest, context: grpc.aio.ServicerContext) -> spb.HeartbeatResponse:
        ctx, _ = await self._ctx(context)
        if ctx.client_id:
            group = cv.resource_name(request.group) if request.HasField("group") else ""
            self.sessions.touch(ctx.client_id, ctx.namespace, request.client_type, group)
        now = time.monotonic()
        if now - self._pruned > SESSION_IDLE_S / 4:  # clients heartbeat every 10 s
            self._pruned = now
            self.sessions.prune(SESSION_IDLE_S)
        return spb.HeartbeatResponse(status=cv.OK)

    @_unary(spb.QueryAssignmentResponse)
    async def QueryAssignment(
        self, request: spb.QueryAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> spb.QueryAssignmentResponse:
        """Pop consumption balances messages, not queues: one assignment per broker, queue id -1.

        (As RocketMQ 5's proxy does: the push consumer then runs one receive loop
        per broker and ReceiveMessage pops from every queue of the topic there.)
        """
        ctx, _ = await self._ctx(context)
        topic = self._topic(request.topic)
        self._group(request.group)
        route = await self._route(ctx, topic)
        eps = self._endpoints(request.endpoints if request.HasField("endpoints") else None)
        accept = ACCEPTED_MESSAGE_TYPES[route.config.message_type]
        assignments = []
        for broker in route.brokers:
            perm = 0
            for q in route.queues:
                if q.broker == broker:
                    perm |= q.perm
            mq = cv.message_queue(request.topic.resource_namespace, topic, -1, perm, broker, eps, accept)
            if mq.permission in (pb.Permission.READ, pb.Permission.READ_WRITE):
                assignments.append(pb.Assignment(message_queue=mq))
        return spb.QueryAssignmentResponse(status=cv.OK, assignments=assignments)

    @_unary(spb.NotifyClientTerminationResponse)
    async def NotifyClientTermination(
        self, request: spb.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> spb.NotifyClientTerminationResponse:
        ctx, _ = await self._ctx(context)
        if ctx.client_id:
            self.sessions.remove(ctx.client_id)
        return spb.NotifyClientTerminationResponse(status=cv.OK)

    # ------------------------------------------------------------------ produce

    @_unary(spb.SendMessageResponse)
    async def SendMessage(self, request: spb.SendMessageRequest, context: grpc.aio.ServicerContext) -> spb.SendMessageResponse:
        ctx, _ = await self._ctx(context)
        if not request.messages:
            raise cv.InvalidMessage(Code.BAD_REQUEST, "a send request needs at least one message")
        msgs = []
        kinds = set()
        for m in request.messages:
            msg, transactional = cv.from_v2(m)
            msgs.append(msg)
            kinds.add(transactional)
        if len(kinds) > 1:
            raise cv.InvalidMessage(Code.BAD_REQUEST, "transactional and other messages cannot share one request")
        transactional = kinds.pop()
        ids = self.identities
        if ids is not None and ids.traffic.active:  # over its rate: answered late, or TOO_MANY_REQUESTS
            await ids.traffic.admit(ctx.principal, ctx.client_id, len(msgs), sum(len(m.body) for m in msgs),
                                    "grpc", self.processor.metrics)
        if ctx.client_id:
            for msg in msgs:
                self.sessions.published(ctx.client_id, ctx.namespace, msg.topic)
        results = await self.processor.send(ctx, msgs, transactional=transactional)
        entries = [
            spb.SendResultEntry(
                status=cv.OK, message_id=r.message_id, transaction_id=r.transaction_id or "", offset=r.queue_offset
            )
            for r in results
        ]
        return spb.SendMessageResponse(status=cv.OK, entries=entries)

    @_unary(spb.EndTransactionResponse)
    async def EndTransaction(
        self, request: spb.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> spb.EndTransactionResponse:
        ctx, _ = await self._ctx(context)
        topic = self._topic(request.topic)
        if not request.transaction_id:
            raise cv.InvalidMessage(Code.INVALID_TRANSACTION_ID, "transaction id is required")
        if request.resolution == pb.TransactionResolution.COMMIT:
            commit = True
        elif request.resolution == pb.TransactionResolution.ROLLBACK:
            commit = False
        else:
            raise cv.InvalidMessage(Code.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
        await self.processor.end_transaction(
            ctx,
            topic,
            request.transaction_id,
            commit,
            from_check=request.source == pb.TransactionSource.SOURCE_SERVER_CHECK,
        )
        return spb.EndTransactionResponse(status=cv.OK)

    async def check_transaction(self, topic: str, producer_group: str, message: StoredMessage, transaction_id: str) -> bool:
        """The processor's transaction checker: ask a live producer of ``topic`` over Telemetry.

        The producer's TransactionChecker answers with EndTransaction(source=SERVER_CHECK).
        Returns False when no producer of the topic has a stream open (the broker asks again later).
        """
        session = self.sessions.pick(self.sessions.producers_of(topic, producer_group))
        if session is None:
            return False
        cmd = spb.TelemetryCommand(
            recover_orphaned_transaction_command=spb.RecoverOrphanedTransactionCommand(
                message=cv.to_v2(message, session.namespace, message_type=pb.MessageType.TRANSACTION),
                transaction_id=transaction_id,
            )
        )
        return session.push(cmd)

    # ------------------------------------------------------------------ pop consumption

    async def ReceiveMessage(
        self, request: spb.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[spb.ReceiveMessageResponse]:
        try:
            ctx, _ = await self._ctx(context)
            group = self._group(request.group)
            topic = self._topic(request.message_queue.topic)
            flt = cv.filter_of(request.filter_expression) if request.HasField("filter_expression") else None
            batch = request.batch_size or 32
            if batch < 1 or batch > MAX_BATCH:
                raise cv.InvalidMessage(Code.BAD_REQUEST, f"batch size must be 1..{MAX_BATCH}")
            if request.HasField("invisible_duration"):
                invisible = cv.duration_ms(request.invisible_duration)
                if invisible <= 0:
                    raise cv.InvalidMessage(Code.ILLEGAL_INVISIBLE_TIME, "invisible duration must be positive")
            else:
                invisible = self.renewer.invisible_ms if request.auto_renew else DEFAULT_INVISIBLE_MS
            renew = request.auto_renew and bool(ctx.client_id)
            wait = cv.duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
            if wait < 0:
                raise cv.InvalidMessage(Code.ILLEGAL_POLLING_TIME, "long polling timeout must not be negative")
            remaining = context.time_remaining()
            if remaining is not None:
                wait = int(max(0.0, min(wait / 1000.0, remaining - LONG_POLL_MARGIN_S)) * 1000)
            if ctx.client_id:
                self.sessions.touch(ctx.client_id, ctx.namespace, group=group)
            popped = await self.processor.pop(ctx, group, topic, batch, invisible, flt, wait)
        except cv.InvalidMessage as e:
            yield spb.ReceiveMessageResponse(status=cv.status(e.code, str(e)))
            return
        except UnimqError as e:
            yield spb.ReceiveMessageResponse(status=cv.status(cv.status_code_of(e), str(e)))
            return
        if not popped:
            yield spb.ReceiveMessageResponse(status=cv.status(Code.MESSAGE_NOT_FOUND, "no new message"))
            return
        ns = request.group.resource_namespace
        delivered = False
        try:
            yield spb.ReceiveMessageResponse(status=cv.OK)
            # The push consumer's metrics subtract this from its clock: it must be present.
            yield spb.ReceiveMessageResponse(delivery_timestamp=cv.to_timestamp(int(time.time() * 1000)))
            for p in popped:
                frame = spb.ReceiveMessageResponse()
                cv.to_v2(
                    p.message,
                    ns,
                    receipt_handle=p.receipt_handle,
                    delivery_attempt=p.delivery_attempt,
                    invisible_ms=invisible,
                    into=frame.message,
                )
                yield frame
            delivered = True
            if renew:
                for p in popped:
                    self.renewer.hold(ctx, group, topic, p.receipt_handle, p.invisible_until_ms)
        finally:
            if not delivered:  # the caller went away: hand the messages back at once
                asyncio.get_running_loop().create_task(self._release(ctx, group, topic, popped))

    async def _release(self, ctx: RequestContext, group: str, topic: str, popped: list) -> None:
        for p in popped:
            try:
                await self.processor.change_invisible(ctx, group, topic, p.receipt_handle, 0)
            except UnimqError:
                pass

    async def _ack_one(self, ctx: RequestContext, group: str, topic: str, entry: spb.AckMessageEntry) -> spb.AckMessageResultEntry:
        try:
            if not entry.receipt_handle:
                raise cv.InvalidMessage(Code.INVALID_RECEIPT_HANDLE, "receipt handle is required")
            await self.processor.ack(ctx, group, topic, await self.renewer.release(entry.receipt_handle))
            st = cv.OK
        except cv.InvalidMessage as e:
            st = cv.status(e.code, str(e))
        except UnimqError as e:
            st = cv.status(cv.status_code_of(e), str(e))
        return spb.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=st)

    @_unary(spb.AckMessageResponse)
    async def AckMessage(self, request: spb.AckMessageRequest, context: grpc.aio.ServicerContext) -> spb.AckMessageResponse:
        ctx, _ = await self._ctx(context)
        group = self._group(request.group)
        topic = self._topic(request.topic)
        if not request.entries:
            raise cv.InvalidMessage(Code.BAD_REQUEST, "nothing to ack")
        if len(request.entries) == 1:
            results = [await self._ack_one(ctx, group, topic, request.entries[0])]
        else:
            results = list(await asyncio.gather(*(self._ack_one(ctx, group, topic, e) for e in request.entries)))
        failed = [r for r in results if r.status.code != Code.OK]
        if not failed:
            overall = cv.OK
        elif len(results) == 1:
            overall = results[0].status
        else:
            overall = cv.status(Code.MULTIPLE_RESULTS, f"{len(failed)} of {len(results)} entries failed")
        return spb.AckMessageResponse(status=overall, entries=results)

    async def _receipt_request(
        self,
        request: spb.ChangeInvisibleDurationRequest | spb.ForwardMessageToDeadLetterQueueRequest,
        context: grpc.aio.ServicerContext,
    ) -> tuple[RequestContext, str, str]:
        """The caller, group and topic of a request about one received message (its receipt handle)."""
        ctx, _ = await self._ctx(context)
        group = self._group(request.group)
        topic = self._topic(request.topic)
        if not request.receipt_handle:
            raise cv.InvalidMessage(Code.INVALID_RECEIPT_HANDLE, "receipt handle is required")
        return ctx, group, topic

    @_unary(spb.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(
        self, request: spb.ChangeInvisibleDurationRequest, context: grpc.aio.ServicerContext
    ) -> spb.ChangeInvisibleDurationResponse:
        ctx, group, topic = await self._receipt_request(request, context)
        invisible = cv.duration_ms(request.invisible_duration)
        if invisible < 0:
            raise cv.InvalidMessage(Code.ILLEGAL_INVISIBLE_TIME, "invisible duration must not be negative")
        current = await self.renewer.release(request.receipt_handle)  # the client decides from now on
        handle, _ = await self.processor.change_invisible(ctx, group, topic, current, invisible)
        return spb.ChangeInvisibleDurationResponse(status=cv.OK, receipt_handle=handle)

    @_unary(spb.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(
        self, request: spb.ForwardMessageToDeadLetterQueueRequest, context: grpc.aio.ServicerContext
    ) -> spb.ForwardMessageToDeadLetterQueueResponse:
        ctx, group, topic = await self._receipt_request(request, context)
        await self.processor.forward_to_dlq(ctx, group, topic, await self.renewer.release(request.receipt_handle))
        return spb.ForwardMessageToDeadLetterQueueResponse(status=cv.OK)

    # ------------------------------------------------------------------ pull consumption

    async def PullMessage(
        self, request: spb.PullMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[spb.PullMessageResponse]:
        try:
            ctx, _ = await self._ctx(context)
            self._group(request.group)
            topic = self._topic(request.message_queue.topic)
            if request.offset < 0:
                raise cv.InvalidMessage(Code.ILLEGAL_OFFSET, "offset must not be negative")
            batch = request.batch_size or 32
            if batch < 1 or batch > MAX_BATCH:
                raise cv.InvalidMessage(Code.BAD_REQUEST, f"batch size must be 1..{MAX_BATCH}")
            flt = cv.filter_of(request.filter_expression) if request.HasField("filter_expression") else None
            wait = cv.duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
            remaining = context.time_remaining()
            if remaining is not None:
                wait = int(max(0.0, min(wait / 1000.0, remaining - LONG_POLL_MARGIN_S)) * 1000)
            r = await self.processor.pull(ctx, topic, request.message_queue.id, request.offset, batch, flt, wait)
        except cv.InvalidMessage as e:
            yield spb.PullMessageResponse(status=cv.status(e.code, str(e)))
            return
        except UnimqError as e:
            yield spb.PullMessageResponse(status=cv.status(cv.status_code_of(e), str(e)))
            return
        if r.status == GetStatus.FOUND:
            st = cv.OK
        elif r.status in (GetStatus.OFFSET_MOVED, GetStatus.OFFSET_OVERFLOW_BADLY):
            st = cv.status(Code.ILLEGAL_OFFSET, f"{r.status.value}: valid offsets are {r.min_offset}..{r.max_offset}")
        else:
            st = cv.status(Code.MESSAGE_NOT_FOUND, r.status.value)
        yield spb.PullMessageResponse(status=st)
        ns = request.group.resource_namespace
        for m in r.messages:
            frame = spb.PullMessageResponse()
            cv.to_v2(m, ns, into=frame.message)
            yield frame
        yield spb.PullMessageResponse(next_offset=r.next_offset)

    @_unary(spb.UpdateOffsetResponse)
    async def UpdateOffset(self, request: spb.UpdateOffsetRequest, context: grpc.aio.ServicerContext) -> spb.UpdateOffsetResponse:
        ctx, _ = await self._ctx(context)
        group = self._group(request.group)
        topic = self._topic(request.message_queue.topic)
        if request.offset < 0:
            raise cv.InvalidMessage(Code.ILLEGAL_OFFSET, "offset must not be negative")
        await self.processor.commit_offset(ctx, group, topic, request.message_queue.id, request.offset)
        return spb.UpdateOffsetResponse(status=cv.OK)

    @_unary(spb.GetOffsetResponse)
    async def GetOffset(self, request: spb.GetOffsetRequest, context: grpc.aio.ServicerContext) -> spb.GetOffsetResponse:
        ctx, _ = await self._ctx(context)
        group = self._group(request.group)
        topic = self._topic(request.message_queue.topic)
        offset = await self.processor.get_offset(ctx, group, topic, request.message_queue.id)
        if offset is None:
            return spb.GetOffsetResponse(
                status=cv.status(Code.OFFSET_NOT_FOUND, f"group {group!r} has no offset for this queue")
            )
        return spb.GetOffsetResponse(status=cv.OK, offset=offset)

    @_unary(spb.QueryOffsetResponse)
    async def QueryOffset(self, request: spb.QueryOffsetRequest, context: grpc.aio.ServicerContext) -> spb.QueryOffsetResponse:
        ctx, _ = await self._ctx(context)
        topic = self._topic(request.message_queue.topic)
        policy = request.query_offset_policy
        ts = 0
        if policy == pb.QueryOffsetPolicy.BEGINNING:
            name = "begin"
        elif policy == pb.QueryOffsetPolicy.END:
            name = "end"
        else:
            if not request.HasField("timestamp"):
                raise cv.InvalidMessage(Code.BAD_REQUEST, "a TIMESTAMP query needs a timestamp")
            name, ts = "timestamp", cv.timestamp_ms(request.timestamp)
        offset = await self.processor.query_offset(ctx, topic, request.message_queue.id, name, ts)
        return spb.QueryOffsetResponse(status=cv.OK, offset=offset)

    # ------------------------------------------------------------------ unsupported

    @_unary(spb.RecallMessageResponse)
    async def RecallMessage(self, request: spb.RecallMessageRequest, context: grpc.aio.ServicerContext) -> spb.RecallMessageResponse:
        self._ctx(context)
        return spb.RecallMessageResponse(status=cv.status(Code.UNSUPPORTED, "recalling a delay message is not supported"))

    @_unary(spb.SyncLiteSubscriptionResponse)
    async def SyncLiteSubscription(
        self, request: spb.SyncLiteSubscriptionRequest, context: grpc.aio.ServicerContext
    ) -> spb.SyncLiteSubscriptionResponse:
        self._ctx(context)
        return spb.SyncLiteSubscriptionResponse(status=cv.status(Code.UNSUPPORTED, "lite topics are not supported"))

    # ------------------------------------------------------------------ telemetry

    async def _settings_for(self, ctx: RequestContext, settings: pb.Settings) -> pb.Settings:
        fifo = False
        if settings.WhichOneof("pub_sub") == "subscription":
            for entry in settings.subscription.subscriptions:
                try:
                    route = await self.processor.query_route(ctx, cv.resource_name(entry.topic))
                except UnimqError:
                    continue
                fifo = fifo or route.config.message_type == MessageType.FIFO
        return cv.settings_reply(
            settings,
            max_body_size=self.processor.config.max_message_size,
            fifo=fifo,
            long_polling_ms=self.long_polling_ms,
            max_delivery_attempts=self.max_delivery_attempts,
            retry_backoff_ms=self.retry_backoff_ms,
        )

    async def Telemetry(self, request_iterator: AsyncIterator[spb.TelemetryCommand], context: grpc.aio.ServicerContext) -> None:
        """Settings exchange, and the server's channel to the client (orphaned transaction checks).

        One reader task consumes the client's commands; this coroutine is the only
        writer, draining an outbox that both the reader (settings answers) and
        :meth:`check_transaction` fill.
        """
        try:
            ctx, _ = await self._ctx(context)
        except UnauthorizedError as e:
            await context.write(spb.TelemetryCommand(status=cv.status(Code.UNAUTHORIZED, str(e))))
            return
        session = self.sessions.get(ctx.client_id, ctx.namespace)
        lease = await self._connection_slot(ctx, session, context)
        try:
            await self._telemetry(ctx, session, request_iterator, context)
        finally:
            if lease is not None:
                lease.release()

    async def _connection_slot(self, ctx: RequestContext, session: Any, context: grpc.aio.ServicerContext) -> Any:
        """A Telemetry stream is the client's connection (``gateway.access.traffic``): its slot, or the
        stream ends with TOO_MANY_REQUESTS and gRPC RESOURCE_EXHAUSTED when a limit refuses it."""
        ids = self.identities
        if ids is None:
            return None
        try:  # a client's new stream replaces its old one (which is about to end)
            return ids.traffic.connect(ctx.principal, ctx.client_id, address=ctx.remote_address,
                                       replaces=session.live)
        except QuotaExceededError as e:
            self.processor.metrics.inc("quota_exceeded", "grpc")
            log.warning("refused: protocol=grpc client=%s from=%s: %s", ctx.client_id, ctx.remote_address, e)
            await context.write(spb.TelemetryCommand(status=cv.status(Code.TOO_MANY_REQUESTS, str(e))))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        return None

    def _subscriptions_allowed(self, ctx: RequestContext, settings: pb.Settings) -> str | None:
        """Why a consumer's settings hold more subscriptions than its limit allows, else None."""
        ids = self.identities
        if ids is None or not ids.traffic.active or settings.WhichOneof("pub_sub") != "subscription":
            return None
        most = ids.traffic.meter(ctx.principal, ctx.client_id).subscriptions()
        n = len(settings.subscription.subscriptions)
        if most is None or n <= most:
            return None
        self.processor.metrics.inc("quota_exceeded", "grpc")
        return f"{n} subscriptions, more than the {most} allowed"

    async def _telemetry(self, ctx: RequestContext, session: Any, request_iterator: AsyncIterator[spb.TelemetryCommand],
                         context: grpc.aio.ServicerContext) -> None:
        outbox: asyncio.Queue[spb.TelemetryCommand | None] = asyncio.Queue()
        session.outboxes.append(outbox)
        session.streams_opened += 1

        async def read() -> None:
            try:
                async for cmd in request_iterator:
                    which = cmd.WhichOneof("command")
                    if which == "settings":
                        refused = self._subscriptions_allowed(ctx, cmd.settings)
                        if refused is not None:  # a subscription limit: TOO_MANY_REQUESTS, settings not taken
                            outbox.put_nowait(spb.TelemetryCommand(status=cv.status(Code.TOO_MANY_REQUESTS, refused)))
                            continue
                        session.apply_settings(cmd.settings)
                        reply = await self._settings_for(ctx, cmd.settings)
                        outbox.put_nowait(spb.TelemetryCommand(status=cv.OK, settings=reply))
                    else:  # thread stack traces, verify results: nothing asked for them
                        log.debug("telemetry from %s: ignoring %s", ctx.client_id, which)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the stream broke (client gone, bad frame)
                log.debug("telemetry stream of %s ended: %r", ctx.client_id, e)
            finally:
                outbox.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                item = await outbox.get()
                if item is None:
                    break
                await context.write(item)
        finally:
            reader.cancel()
            if outbox in session.outboxes:
                session.outboxes.remove(outbox)
