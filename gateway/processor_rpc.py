"""The MessagingProcessor over unimq RPC: a gateway's programmatic door.

A gateway process serves its processor on its RPC port; :class:`RemoteProcessor`
is the client side with the processor's own async API, spreading calls over
several gateways. That is how the processor test suite runs unchanged against
the separated deployment (and how a pop through one gateway is acked through
another). Types of this layer that cross the wire register here.
"""

from __future__ import annotations

import itertools
from typing import Any

from core_broker.remoting.client import PeerUnavailableError, RpcClient
from core_broker.errors import UnimqError
from core_broker.remoting.wire import register_error, register_ext

from . import auth, processor as _processor_module
from .broker_client import QueueRoute, TopicRoute
from .context import RequestContext
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
]


class ProcessorRpcFacade:
    """Server side: every listed method forwards to the processor unchanged."""

    def __init__(self, processor: MessagingProcessor) -> None:
        for name in PROCESSOR_METHODS:
            setattr(self, name, getattr(processor, name))


class RemoteProcessor:
    """Client side: the processor API, each call sent to the next gateway in turn."""

    def __init__(self, gateways: list[tuple[str, int]]) -> None:
        self.clients = [RpcClient(h, p) for h, p in gateways]
        self._next = itertools.count()

    def __getattr__(self, name: str) -> Any:
        if name not in PROCESSOR_METHODS:
            raise AttributeError(name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            timeout = 30.0 + (kwargs.get("wait_ms") or 0) / 1000.0
            start = next(self._next)
            last: Exception | None = None
            for i in range(len(self.clients)):
                client = self.clients[(start + i) % len(self.clients)]
                try:
                    return await client.call(name, *args, rpc_timeout=timeout, **kwargs)
                except PeerUnavailableError as e:  # a gateway is stateless: try the next one
                    last = e
            raise last  # type: ignore[misc]

        return call

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        for c in self.clients:
            await c.close()
