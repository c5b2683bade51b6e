"""The processor API: the one typed contract between the doors and the processor.

Every door (MQTT, AMQP, HTTP/CloudEvents, gRPC) holds its processor typed as
:class:`MessagingAPI` and calls nothing else on it. Two layers, because two
kinds of callers exist:

- :class:`ProcessorCalls`: the calls that carry a :class:`RequestContext` and
  plain data. They are what the processor RPC serves to remote callers
  (``gateway/processor_rpc.py`` serves exactly :data:`CALLS`), what a
  namespace rewrites (``gateway/namespace.py`` wraps exactly :data:`CALLS`),
  and what the authorizer is asked about (each one checks the caller).
- :class:`MessagingAPI`: those plus what only makes sense in the door's own
  process: the configuration, the counters, cross-protocol routers,
  transaction-check callbacks, Arrow pages (built from zero-copy reads of the
  store), and explicit authorization checks for what a door decides alone (an
  MQTT subscription).

Both lists are written once, here; everything that needs "the processor's
methods" derives them from these protocols (:func:`protocol_methods`), so a
new call is added in one place. The contract's value types (results, the
configuration, the router hook and the errors only the processor raises) live
here too, so doors import this module rather than the processor's.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple, Protocol, Sequence

from core_broker.broker_controller import TopicStats
from core_broker.errors import BadRequestError, UnimqError
from core_broker.model import DispatchTarget, FilterExpression, GetResult, Message, MessageType, StoredMessage
from core_broker.pop_service import PoppedMessage
from core_broker.topic_config import TopicConfig
from core_broker.transaction_service import TransactionChecker

from .auth import Action, Authorizer, Resource
from .broker_client import BrokerInfo, ClusterView, TopicRoute
from .context import RequestContext
from .metrics import Metrics
from .trace import Tracer

__all__ = [
    "ACCEPTED_MESSAGE_TYPES", "ArrowPage", "BrokerInfo", "ClusterView", "GroupQueueStats", "ArrowUnavailableError", "CALLS", "MessageTypeMismatchError",
    "MessagingAPI", "NoWritableQueueError", "ProcessorCalls", "ProcessorConfig", "Router", "SendResult",
    "protocol_methods",
]


# ---------------------------------------------------------------------------- value types


#: The message size limit of doors that set none of their own (RocketMQ's default maxMessageSize).
DEFAULT_DOOR_MESSAGE_SIZE = 4 * 1024 * 1024


@dataclass
class ProcessorConfig:
    auto_create_topics: bool = True
    default_queue_count: int = 8
    max_message_size: int = DEFAULT_DOOR_MESSAGE_SIZE
    max_batch: int = 1024
    # Per door (RequestContext.protocol): a larger (or smaller) limit than max_message_size, e.g.
    # AMQP's 128 MiB (RabbitMQ's default) for apps migrating with large messages.
    door_message_limits: dict[str, int] = field(default_factory=dict)
    # Message traces (gateway/trace.py): the sample rate of topics without trace attributes
    # (0: only topics that ask are traced) and how often buffered trace events are written.
    trace_sample_rate: float = 0.0
    trace_flush_ms: int = 100


class SendResult(NamedTuple):
    message_id: str
    topic: str
    broker: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None
    # queue offsets the message got in each of its extra_dispatch targets, in order
    # (doors that multi-dispatch into LMQs use them to hand a fresh message on directly)
    extra_offsets: tuple[int, ...] = ()


class ArrowPage(NamedTuple):
    """A pull as one Arrow IPC stream in the Spark table's schema (``gateway/arrow_pages.py``), with the
    media type to serve it as and the read's bounds."""

    data: bytes | memoryview
    media_type: str
    next_offset: int
    min_offset: int
    max_offset: int


class GroupQueueStats(NamedTuple):
    """One queue a consumer group reads, as the broker holding it counts (the admin API's groups)."""

    group: str
    topic: str  # the topic, or the group's %RETRY%/%DLQ% topic
    queue_id: int
    broker: str
    consumer_offset: int  # lowest offset not yet done (pop groups) or the committed offset (pull groups)
    max_offset: int
    inflight: int  # popped, neither acked nor back yet

    @property
    def lag(self) -> int:
        return max(self.max_offset - self.consumer_offset, 0)


class Router(Protocol):
    """A door's view of every message sent through any door: the cross-protocol seam.

    ``route`` runs before the message is stored and names the door's own queues
    it must be multi-dispatched into (an MQTT subscription's LMQ for a message
    that came in over AMQP on ``amq.topic``, an AMQP queue bound to ``amq.topic``
    for a message that came in over MQTT, ...). A door returns nothing for the
    messages it routed itself. ``after_send`` runs once they are stored, for live
    delivery (waking sessions, QoS 0 fan-out). Both are synchronous and must be cheap.
    """

    def routes_from(self, protocol: str) -> bool:
        """Whether :meth:`route` may name a queue for a message that came in by ``protocol`` now:
        asked once per run of one protocol in a send, so that a door with nothing to route
        (its own messages, no bindings) costs nothing per message."""
        ...

    def route(self, message: Message) -> Iterable[DispatchTarget]: ...

    def after_send(self, messages: Sequence[Message], results: Sequence[SendResult]) -> None: ...


def route_extra(routers: Sequence[Router], m: Message) -> None:
    """Add to ``m.extra_dispatch`` the queues ``routers`` name for it (each queue once, never
    the message's own): what every implementation of :meth:`MessagingAPI.send` does first."""
    extra: list[DispatchTarget] | None = None  # made when a router names a queue (most messages: none)
    for router in routers:
        for t in router.route(m):
            if extra is None:
                extra = list(m.extra_dispatch)
            if t not in extra and (t.topic, t.queue_id) != (m.topic, m.queue_id):
                extra.append(t)
    if extra is not None and len(extra) != len(m.extra_dispatch):
        m.extra_dispatch = tuple(extra)


# Which message types a topic of each type accepts. Doors without topic types
# (MQTT, AMQP, HTTP) send NORMAL messages, which typed topics other than
# TRANSACTION take as well; a transactional message needs a TRANSACTION topic.
# (The gRPC door advertises it as a queue's accept_message_types.)
ACCEPTED_MESSAGE_TYPES: dict[MessageType, set[MessageType]] = {
    MessageType.NORMAL: {MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY},
    MessageType.FIFO: {MessageType.FIFO, MessageType.NORMAL},
    MessageType.DELAY: {MessageType.DELAY, MessageType.NORMAL},
    MessageType.TRANSACTION: {MessageType.TRANSACTION},
    MessageType.COMPACTED: {MessageType.NORMAL},  # and each message needs a key (send_plan.py)
}


class MessageTypeMismatchError(BadRequestError):
    code = "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"


class NoWritableQueueError(UnimqError):
    code = "FORBIDDEN"


class ArrowUnavailableError(UnimqError):
    """Arrow pages need pyarrow and numpy (the ``spark`` extra), which this server lacks."""

    code = "NOT_ACCEPTABLE"


# ---------------------------------------------------------------------------- the calls


class ProcessorCalls(Protocol):
    """What any caller may ask the processor, locally or over the processor RPC.

    Each call takes the caller's context first; its arguments and results are
    plain data that cross the RPC. Names of topics and groups are the caller's
    (a namespaced context sees its own names only).
    """

    async def send(
        self, ctx: RequestContext, messages: Sequence[Message], *, transactional: bool = False,
        producer_group: str = "",
    ) -> list[SendResult]: ...

    async def end_transaction(
        self, ctx: RequestContext, topic: str, transaction_id: str, commit: bool, *, from_check: bool = False,
        broker: str | None = None,
    ) -> None: ...

    async def pop(
        self, ctx: RequestContext, group: str, topic: str, max_count: int = 32, invisible_ms: int = 30_000,
        filter_expression: FilterExpression | None = None, wait_ms: int = 0, *, from_latest: bool = False,
    ) -> list[PoppedMessage]: ...

    async def ack(self, ctx: RequestContext, group: str, topic: str, receipt_handle: str) -> None: ...

    async def ack_batch(
        self, ctx: RequestContext, group: str, topic: str, receipt_handles: Sequence[str]
    ) -> list[str | None]: ...

    async def change_invisible(
        self, ctx: RequestContext, group: str, topic: str, receipt_handle: str, invisible_ms: int
    ) -> tuple[str, int]: ...

    async def forward_to_dlq(self, ctx: RequestContext, group: str, topic: str, receipt_handle: str) -> None: ...

    async def pull(
        self, ctx: RequestContext, topic: str, queue_id: int, offset: int, max_count: int = 32,
        filter_expression: FilterExpression | None = None, wait_ms: int = 0, *, broker: str | None = None,
    ) -> GetResult: ...

    async def commit_offset(
        self, ctx: RequestContext, group: str, topic: str, queue_id: int, offset: int, *, broker: str | None = None
    ) -> None: ...

    async def pull_lanes(
        self, ctx: RequestContext, broker: str, reads: Sequence[tuple[RequestContext, str, int, int]]
    ) -> list[GetResult | None]: ...

    async def commit_lanes(
        self, ctx: RequestContext, group: str, broker: str, offsets: Sequence[tuple[str, int]]
    ) -> None: ...

    async def get_offset(
        self, ctx: RequestContext, group: str, topic: str, queue_id: int, *, broker: str | None = None
    ) -> int | None: ...

    async def query_offset(
        self, ctx: RequestContext, topic: str, queue_id: int, policy: str = "end", timestamp_ms: int = 0, *,
        broker: str | None = None,
    ) -> int: ...

    async def query_route(self, ctx: RequestContext, topic: str) -> TopicRoute: ...

    async def read_table(
        self, ctx: RequestContext, topic: str, queue_id: int, offset: int = 0, max_count: int = 256
    ) -> GetResult: ...

    async def compact_topic(self, ctx: RequestContext, topic: str) -> dict: ...

    async def create_topic(
        self, ctx: RequestContext, name: str, queues: int | None = None,
        message_type: MessageType | str = MessageType.NORMAL, exist_ok: bool = False,
        attributes: dict[str, str] | None = None,
    ) -> TopicConfig: ...

    async def host_lmq(self, ctx: RequestContext, name: str, broker: str) -> None: ...

    async def update_topic(
        self, ctx: RequestContext, name: str, *, queues: int | None = None, perm: int | None = None,
        attributes: dict[str, str | None] | None = None,
    ) -> TopicConfig: ...

    async def delete_topic(self, ctx: RequestContext, name: str) -> None: ...

    async def list_topics(self, ctx: RequestContext, include_system: bool = False) -> list[TopicConfig]: ...

    async def describe_topic(self, ctx: RequestContext, name: str) -> TopicStats: ...

    async def query_message_by_id(self, ctx: RequestContext, message_id: str) -> StoredMessage | None: ...

    async def query_messages_by_key(
        self, ctx: RequestContext, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**62, max_count: int = 32
    ) -> list[StoredMessage]: ...

    async def kv_put(self, ctx: RequestContext, namespace: str, key: str, value: bytes | None) -> None: ...

    async def kv_get(self, ctx: RequestContext, namespace: str, key: str) -> bytes | None: ...

    async def kv_items(self, ctx: RequestContext, namespace: str) -> dict[str, bytes]: ...

    async def kv_put_many(self, ctx: RequestContext, namespace: str, items: dict[str, bytes | None],
                          writer: str = "") -> None: ...

    async def kv_create_many(self, ctx: RequestContext, namespace: str, items: dict[str, bytes],
                             writer: str = "") -> set[str]: ...

    async def kv_get_many(self, ctx: RequestContext, namespace: str, keys: list[str]) -> dict[str, bytes | None]: ...

    async def consumer_lag(self, ctx: RequestContext) -> list[tuple[str, str, int]]: ...

    async def store_stats(self, ctx: RequestContext) -> dict: ...

    async def consumer_groups(self, ctx: RequestContext) -> list[GroupQueueStats]:
        """Every consumer group's queues with offsets and in-flight counts (admin)."""
        ...

    async def reset_offset(
        self, ctx: RequestContext, group: str, topic: str, queue_id: int | None = None, *,
        offset: int | None = None, timestamp_ms: int | None = None,
    ) -> list[tuple[int, int]]:
        """Move ``group`` on ``topic`` (one queue, or all) to ``offset`` or to the first message
        stored at or after ``timestamp_ms``; what follows is delivered again. Returns
        ``(queue_id, new offset)`` per queue (admin)."""
        ...

    async def remap_queue(self, ctx: RequestContext, topic: str, queue_id: int, broker: str) -> dict:
        """A static topic's logic queue written on ``broker`` from now on; its new map (admin)."""
        ...

    async def release_queue(self, ctx: RequestContext, topic: str, queue_id: int, broker: str) -> dict:
        """Scale-in: ``broker``'s drained old part of a static topic's logic queue forgotten (admin)."""
        ...

    async def cluster(self, ctx: RequestContext) -> ClusterView:
        """The nameservers and brokers this processor reaches (admin)."""
        ...

    async def message_trace(self, ctx: RequestContext, message_id: str) -> list[dict]:
        """A traced message's events (stored, delivered, acked, ...) sorted by time
        (gateway/trace.py); SUBSCRIBE on its topic."""
        ...


class DoorFeed(Protocol):
    """The brokers' door-state feed (``core_broker/door_feed.py``): how a door that keeps door
    state in memory for routing (the MQTT door, with several gateways on one port) learns what
    other gateways wrote. Only an in-process processor offers it (:meth:`MessagingAPI.door_feed`)."""

    async def door_brokers(self) -> list[str]: ...

    async def door_watch(self, broker: str, gateway: str, namespaces: list[str], incarnation: str, seq: int,
                         timeout_s: float) -> dict[str, Any]: ...

    async def door_notify(self, broker: str, gateway: str, notes: list[Any]) -> None: ...


class MessagingAPI(ProcessorCalls, Protocol):
    """What a door holds: :class:`ProcessorCalls` plus the in-process hooks."""

    config: ProcessorConfig
    metrics: Metrics
    tracer: Tracer  # message traces: doors record deliveries and acks into the same buffer

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def pull_arrow(
        self, ctx: RequestContext, topic: str, queue_id: int, offset: int, max_count: int = 32,
        filter_expression: FilterExpression | None = None, wait_ms: int = 0,
    ) -> ArrowPage:
        """:meth:`pull` as an Arrow page; in process only (it reads the store's records undecoded
        when it can). Raises :class:`ArrowUnavailableError` without pyarrow and numpy."""
        ...

    async def send_packed(self, ctx: RequestContext, topic: str, body: bytes) -> tuple[SendResult, int]:
        """A batch its producer packed (``gateway/batch_codec.py``) stored as one record on a batch
        topic: the result of its first message and its message count; in process only."""
        ...

    def add_router(self, router: Router) -> None: ...

    def remove_router(self, router: Router) -> None: ...

    def set_transaction_checker(self, checker: TransactionChecker | None) -> None: ...

    def add_transaction_checker(self, checker: TransactionChecker) -> None: ...

    def remove_transaction_checker(self, checker: TransactionChecker) -> None: ...

    def authorize(self, ctx: RequestContext, action: Action, resource: Resource, name: str) -> None: ...

    def allowed(self, ctx: RequestContext, action: Action, resource: Resource, name: str) -> bool: ...

    def set_authorizer(self, authorizer: Authorizer) -> None: ...

    def door_feed(self) -> DoorFeed | None:
        """The brokers' door-state feed, or None where this processor cannot follow it (a
        remote processor over the gateway RPC: a door on it then keeps its state to itself)."""
        ...


def protocol_methods(protocol: type) -> tuple[str, ...]:
    """The public methods a protocol class declares (its own and its bases'), in definition order."""
    names: dict[str, None] = {}
    for klass in reversed(protocol.__mro__):
        if klass is object or klass is Protocol or not getattr(klass, "_is_protocol", False):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and inspect.isfunction(value):
                names[name] = None
    return tuple(names)


#: The calls remote callers get and namespaces apply to (the processor RPC serves exactly these).
CALLS: tuple[str, ...] = protocol_methods(ProcessorCalls)
