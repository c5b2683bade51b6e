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
from core_broker.remoting.wire import register_error, register_ext

from . import auth, processor as _processor_module
from .broker_client import QueueRoute, TopicRoute
from .context import RequestContext
from .namespace import namespace_of, unwrap, unwrap_result
from .processor import MessagingProcessor, SendResult

for _mod in (auth, _processor_module):
    for _v in vars(_mod).values():
        if isinstance(_v, type) and issubclass(_v, UnimqError):
            register_error(_v)

register_ext(
    32, RequestContext,
    lambda c: [c.protocol, c.client_id, c.remote_address, c.principal, c.namespace],
    lambda f: RequestContext(*f),
)
register_ext(33, SendResult, lambda r: list(r), lambda f: SendResult(*f))
register_ext(34, QueueRoute, lambda q: [q.broker, q.queue_id, q.perm], lambda f: QueueRoute(*f))
register_ext(35, TopicRoute, lambda r: [r.config, r.queues], lambda f: TopicRoute(f[0], list(f[1])))

PROCESSOR_METHODS = [
    "send", "end_transaction", "pop", "ack", "change_invisible", "forward_to_dlq", "pull", "commit_offset",
    "get_offset", "query_offset", "query_route", "create_topic", "update_topic", "delete_topic", "list_topics",
    "describe_topic", "query_message_by_id", "query_messages_by_key", "kv_put", "kv_get", "kv_items",
    "poll_transaction_checks",
]


class ProcessorRpcFacade:
    """Server side: every listed method forwards to the processor unchanged.

    Transaction checks reach remote callers by polling: the first
    ``poll_transaction_checks`` registers a checker that queues checks while
    somebody has polled recently, so a remote producer can resolve them.
    """

    POLL_GRACE_S = 30.0

    def __init__(self, processor: MessagingProcessor) -> None:
        for name in PROCESSOR_METHODS:
            if name != "poll_transaction_checks":
                setattr(self, name, getattr(processor, name))
        self._processor = processor
        self._checks: dict[str, asyncio.Queue] = {}  # per namespace of the pollers
        self._last_poll: dict[str, float] = {}
        self._registered = False

    async def _queue_check(self, topic: str, group: str, message: Any, tid: str) -> bool:
        ns = namespace_of(topic)
        q = self._checks.get(ns)
        if q is None or time.monotonic() - self._last_poll.get(ns, 0.0) > self.POLL_GRACE_S:
            return False
        try:
            q.put_nowait([unwrap(ns, topic), unwrap(ns, group), unwrap_result(ns, message), tid])
        except asyncio.QueueFull:
            return False
        return True

    async def poll_transaction_checks(self, wait_ms: int = 10_000, namespace: str = "") -> list:
        """Checks of transactions in ``namespace`` for a remote producer to resolve."""
        if not self._registered:
            self._registered = True
            self._processor.add_transaction_checker(self._queue_check)
        q = self._checks.setdefault(namespace, asyncio.Queue(maxsize=10_000))
        self._last_poll[namespace] = time.monotonic()
        out: list = []
        try:
            async with asyncio.timeout(wait_ms / 1000.0):
                out.append(await q.get())
        except TimeoutError:
            return out
        finally:
            self._last_poll[namespace] = time.monotonic()
        while not q.empty() and len(out) < 256:
            out.append(q.get_nowait())
        return out


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

    def __getattr__(self, name: str) -> Any:
        if name not in PROCESSOR_METHODS:
            raise AttributeError(name)

        async def call(*args: Any, **kwargs: Any) -> Any:
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

        return call

    def set_transaction_checker(self, checker: Any) -> None:
        """Poll every gateway for transaction checks and hand them to ``checker``."""
        self._checker = checker
        for t in getattr(self, "_pollers", []):
            t.cancel()
        self._pollers = [asyncio.ensure_future(self._poll(c)) for c in self.clients] if checker else []

    async def _poll(self, client: RpcClient) -> None:
        while True:
            try:
                checks = await client.call("poll_transaction_checks", 2_000, self.namespace, rpc_timeout=30.0)
            except PeerUnavailableError:
                await asyncio.sleep(0.5)
                continue
            for topic, group, message, tid in checks:
                try:
                    await self._checker(topic, group, message, tid)
                except Exception:
                    log.exception("transaction checker failed")

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        for t in getattr(self, "_pollers", []):
            t.cancel()
        for c in self.clients:
            await c.close()
