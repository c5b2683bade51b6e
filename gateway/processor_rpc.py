"""The MessagingProcessor over unimq RPC: a gateway's programmatic door.

A gateway process serves its processor on its RPC port; :class:`RemoteProcessor`
is the client side with the processor's own async API, spreading calls over
several gateways. That is how the processor test suite runs unchanged against
the separated deployment (and how a pop through one gateway is acked through
another). Types of this layer that cross the wire register here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from typing import Any

from core_broker.remoting.client import PeerUnavailableError, RpcClient
from core_broker.errors import UnimqError
from core_broker.remoting.rows import (
    get_result_from_block,
    get_result_to_block,
    messages_from_block,
    messages_to_block,
    popped_from_block,
    popped_to_block,
)
from core_broker.remoting.wire import pack_block, register_error, register_ext, unpack_block
from core_broker.transaction_service import TransactionCheckLostError

from . import api, auth, processor as _processor_module
from .api import CALLS, MessagingAPI, Router, SendResult, route_extra
from .broker_client import QueueRoute, TopicRoute
from .context import RequestContext
from .namespace import namespace_of, unwrap, unwrap_result
from .trace import Tracer

_new_tuple = tuple.__new__

for _mod in (api, auth, _processor_module):
    for _v in vars(_mod).values():
        if isinstance(_v, type) and issubclass(_v, UnimqError):
            register_error(_v)

register_ext(
    32, RequestContext,
    lambda c: [c.protocol, c.client_id, c.remote_address, c.principal, c.namespace, c.trusted],
    lambda f: RequestContext(*f),
)
register_ext(33, SendResult, lambda r: list(r), lambda f: SendResult(*f))
register_ext(34, QueueRoute, lambda q: [q.broker, q.queue_id, q.perm], lambda f: QueueRoute(*f))
register_ext(35, TopicRoute, lambda r: [r.config, r.queues], lambda f: TopicRoute(f[0], list(f[1])))

# The facade's own calls: how transaction checks reach remote producers (see ProcessorRpcFacade).
_CHECK_METHODS = ("poll_transaction_checks", "confirm_transaction_checks")
#: What the processor RPC serves: exactly the processor API's calls (gateway/api.py), plus the checks.
PROCESSOR_METHODS = [*CALLS, *_CHECK_METHODS]
_OWN_METHODS = (*_CHECK_METHODS, "send", "pop", "pull", "pull_lanes", "read_table")  # the facade's own code, not a pass-through
_CALL_SET = frozenset(CALLS)


class ProcessorRpcFacade:
    """Server side: every call of the processor API forwards to the processor unchanged.

    Transaction checks reach remote callers by polling: the first
    ``poll_transaction_checks`` registers a checker that queues checks while
    somebody has polled recently, so a remote producer can resolve them. A
    queued check is delivered only once the producer confirms it ran its checker
    (``done`` of its next poll, or ``confirm_transaction_checks``); until then the
    broker holds the transaction as in flight. A check this gateway cannot deliver
    because it stops is reported lost (:class:`TransactionCheckLostError`), and the
    broker does not count it.
    """

    POLL_GRACE_S = 30.0
    CONFIRM_TIMEOUT_S = 10.0  # a producer that took a check and went silent: it counts

    def __init__(self, processor: MessagingAPI) -> None:
        for name in CALLS:
            if name not in _OWN_METHODS:
                setattr(self, name, getattr(processor, name))
        self._processor = processor
        self._send, self._pop, self._pull = processor.send, processor.pop, processor.pull
        self._table = processor.read_table
        self._checks: dict[str, asyncio.Queue] = {}  # per namespace of the pollers
        self._last_poll: dict[str, float] = {}
        self._waiting: dict[str, list[asyncio.Future]] = {}  # tid -> futures of checks handed out
        self._registered = False
        self._closed = False

    # send, pop and pull carry their batches as blocks of rows (core_broker/remoting/rows.py)

    async def send(self, ctx: RequestContext, block: bytes, **kwargs: Any) -> bytes:
        """``block``: messages as rows; answers the SendResults as rows."""
        return pack_block(await self._send(ctx, messages_from_block(block), **kwargs))

    async def pop(self, *args: Any, **kwargs: Any) -> bytes:
        return popped_to_block(await self._pop(*args, **kwargs))

    async def pull(self, *args: Any, **kwargs: Any) -> bytes:
        return get_result_to_block(await self._pull(*args, **kwargs))

    async def pull_lanes(self, *args: Any, **kwargs: Any) -> list[bytes | None]:
        return [None if r is None else get_result_to_block(r) for r in await self._processor.pull_lanes(*args, **kwargs)]

    async def read_table(self, *args: Any, **kwargs: Any) -> bytes:
        return get_result_to_block(await self._table(*args, **kwargs))

    async def _queue_check(self, topic: str, group: str, message: Any, tid: str) -> bool:
        ns = namespace_of(topic)
        q = self._checks.get(ns)
        if self._closed or q is None or time.monotonic() - self._last_poll.get(ns, 0.0) > self.POLL_GRACE_S:
            return False
        fut = asyncio.get_running_loop().create_future()
        try:
            q.put_nowait(([unwrap(ns, topic), unwrap(ns, group), unwrap_result(ns, message), tid], fut))
        except asyncio.QueueFull:
            return False
        try:
            async with asyncio.timeout(self.CONFIRM_TIMEOUT_S):
                return await fut  # True once confirmed; TransactionCheckLostError when closing
        except TimeoutError:
            return False
        finally:
            futs = self._waiting.get(tid)
            if futs is not None and fut in futs:
                futs.remove(fut)
                if not futs:
                    del self._waiting[tid]

    def confirm_transaction_checks(self, transaction_ids: list[str]) -> None:
        """A remote producer ran its checker for these checks (idempotent)."""
        for tid in transaction_ids:
            for fut in self._waiting.pop(tid, ()):
                if not fut.done():
                    fut.set_result(True)

    async def poll_transaction_checks(
        self, wait_ms: int = 10_000, namespace: str = "", done: list[str] | None = None
    ) -> list:
        """Checks of transactions in ``namespace`` for a remote producer to resolve; ``done``
        confirms the checks of the previous poll."""
        if done:
            self.confirm_transaction_checks(done)
        if not self._registered:
            self._registered = True
            self._processor.add_transaction_checker(self._queue_check)
        q = self._checks.setdefault(namespace, asyncio.Queue(maxsize=10_000))
        self._last_poll[namespace] = time.monotonic()
        items: list = []
        try:
            async with asyncio.timeout(wait_ms / 1000.0):
                items.append(await q.get())
        except TimeoutError:
            return []
        finally:
            self._last_poll[namespace] = time.monotonic()
        while not q.empty() and len(items) < 256:
            items.append(q.get_nowait())
        out = []
        for check, fut in items:
            if fut.done():  # its checker gave up waiting (timeout or close)
                continue
            self._waiting.setdefault(check[3], []).append(fut)
            out.append(check)
        return out

    def close(self) -> None:
        """The gateway stops: every check not confirmed yet is lost (the broker checks again)."""
        self._closed = True
        lost = [f for futs in self._waiting.values() for f in futs]
        self._waiting.clear()
        for q in self._checks.values():
            while not q.empty():
                lost.append(q.get_nowait()[1])
        for f in lost:
            if not f.done():
                f.set_exception(TransactionCheckLostError("the gateway stopped before the producer confirmed"))


log = logging.getLogger("unimq.processor_rpc")


class RemoteProcessor:
    """Client side: the processor API, each call sent to the next gateway in turn."""

    def __init__(self, gateways: list[tuple[str, int]], namespace: str = "", spread: bool = False,
                 preferred: int = 0) -> None:
        """``spread``: every call goes to the next gateway in turn; otherwise calls stick to
        the ``preferred`` gateway and fail over to the others, as a client connected to one
        gateway does (its round robin and route cache are then the ones it sees)."""
        self.clients = [RpcClient(h, p) for h, p in gateways]
        self.spread = spread
        self.preferred = preferred % max(1, len(self.clients))
        self._next = itertools.count()
        # A client bound to a namespace sees only its topics and groups (RocketMQ's namespaces).
        self.namespace = namespace
        self._unconfirmed: dict[int, list[str]] = {}
        self._acks: dict[tuple, list] = {}  # acks of this event-loop turn, per (ctx, group, topic)
        self._ack_tasks: set[asyncio.Task] = set()
        self._checker: Any = None
        self._pollers: list[asyncio.Task] = []
        self._routers: list[Router] = []
        # a door built on this client traces nothing itself: the gateways the calls go through
        # trace what passes there
        self.tracer = Tracer.off()

    def add_router(self, router: Router) -> None:
        """A door built on this client routes what is sent through this client (as doors in
        one process do through their processor); what other clients and the gateways' own doors
        send is routed by the processor of the gateway it goes through."""
        self._routers.append(router)

    def remove_router(self, router: Router) -> None:
        if router in self._routers:
            self._routers.remove(router)

    def door_feed(self) -> None:
        """No feed over the gateway RPC: a door on this client keeps its door state to itself."""
        return None

    def __getattr__(self, name: str) -> Any:
        # the processor API's other calls go over the wire as they are
        if name not in _CALL_SET:
            raise AttributeError(name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._invoke(name, *args, **kwargs)

        return call

    async def _invoke(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self.namespace and args and isinstance(args[0], RequestContext):
            args = (dataclasses.replace(args[0], namespace=self.namespace), *args[1:])
        timeout = 30.0 + (kwargs.get("wait_ms") or 0) / 1000.0
        start = next(self._next) if self.spread else self.preferred
        last: Exception | None = None
        for i in range(len(self.clients)):
            client = self.clients[(start + i) % len(self.clients)]
            try:
                return await client.call(name, *args, rpc_timeout=timeout, **kwargs)
            except PeerUnavailableError as e:  # a gateway is stateless: try the next one
                last = e
        raise last  # type: ignore[misc]

    async def send(self, ctx: RequestContext, messages: Any, **kwargs: Any) -> list[SendResult]:
        routers = self._routers
        if routers:
            for m in messages:
                route_extra(routers, m)
        block = await self._invoke("send", ctx, messages_to_block(messages), **kwargs)
        results = [_new_tuple(SendResult, r) for r in unpack_block(block)]
        for router in routers:
            try:
                router.after_send(messages, results)
            except Exception:  # a door's live delivery must never fail a stored send
                log.exception("router %r failed after a send", router)
        return results

    async def pop(self, *args: Any, **kwargs: Any) -> list:
        return popped_from_block(await self._invoke("pop", *args, **kwargs))

    async def pull(self, *args: Any, **kwargs: Any) -> Any:
        return get_result_from_block(await self._invoke("pull", *args, **kwargs))

    async def pull_lanes(self, *args: Any, **kwargs: Any) -> list:
        return [None if b is None else get_result_from_block(b) for b in await self._invoke("pull_lanes", *args, **kwargs)]

    async def read_table(self, *args: Any, **kwargs: Any) -> Any:
        return get_result_from_block(await self._invoke("read_table", *args, **kwargs))

    def ack(self, ctx: RequestContext, group: str, topic: str, receipt_handle: str) -> "asyncio.Future[None]":
        """Acks with the same context, group and topic issued in one event-loop turn (a
        consumer settling a popped batch concurrently) travel as one ``ack_batch`` call.

        Returns a future rather than being a coroutine: a consumer gathering the acks of a
        popped batch then costs no task per ack. A handle the batch could not ack is asked
        again alone, so its future fails with the same typed error a lone ack gets."""
        key = (ctx, group, topic)
        loop = asyncio.get_running_loop()
        batch = self._acks.get(key)
        if batch is None:
            batch = self._acks[key] = []
            loop.call_soon(self._flush_acks, key)
        fut = loop.create_future()
        batch.append((receipt_handle, fut))
        return fut

    def _flush_acks(self, key: tuple) -> None:
        batch = self._acks.pop(key, None)
        if batch:
            t = asyncio.ensure_future(self._send_acks(key, batch))
            self._ack_tasks.add(t)
            t.add_done_callback(self._ack_tasks.discard)

    async def _send_acks(self, key: tuple, batch: list) -> None:
        ctx, group, topic = key
        try:
            codes = await self._invoke("ack_batch", ctx, group, topic, [h for h, _ in batch])
        except BaseException as e:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e if isinstance(e, Exception) else PeerUnavailableError("cancelled"))
            if not isinstance(e, Exception):
                raise
            return
        failed = []
        for (h, fut), code in zip(batch, codes):
            if code is None:
                if not fut.done():
                    fut.set_result(None)
            else:
                failed.append((h, fut))
        for h, fut in failed:  # rare: ask alone for that handle's typed error
            try:
                await self._invoke("ack", ctx, group, topic, h)
            except Exception as e:
                if not fut.done():
                    fut.set_exception(e)
            else:
                if not fut.done():
                    fut.set_result(None)

    def set_transaction_checker(self, checker: Any) -> None:
        """Poll every gateway for transaction checks and hand them to ``checker``."""
        self._checker = checker
        for t in self._pollers:
            t.cancel()
        self._pollers = [asyncio.ensure_future(self._poll(c)) for c in self.clients] if checker else []

    async def _poll(self, client: RpcClient) -> None:
        # checks whose checker ran: confirmed with the next poll (or by stop())
        done = self._unconfirmed.setdefault(id(client), [])
        while True:
            try:
                checks = await client.call(
                    "poll_transaction_checks", 2_000, self.namespace, list(done), rpc_timeout=30.0
                )
            except PeerUnavailableError:
                await asyncio.sleep(0.5)
                continue
            done.clear()  # the gateway took the confirmations with that poll
            for topic, group, message, tid in checks:
                done.append(tid)  # before the call: a checker cancelled midway did run
                try:
                    await self._checker(topic, group, message, tid)
                except Exception:
                    log.exception("transaction checker failed")

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        pollers = self._pollers
        for t in pollers:
            t.cancel()
        await asyncio.gather(*pollers, return_exceptions=True)
        for c in self.clients:
            done = self._unconfirmed.pop(id(c), None)
            if done:  # checks this producer ran whose confirmation the cancelled poll did not carry
                try:
                    await c.call("confirm_transaction_checks", done, rpc_timeout=2.0)
                except Exception as e:  # the gateway then reports them lost; the broker checks again
                    log.debug("could not confirm transaction checks: %s", e)
            await c.close()
