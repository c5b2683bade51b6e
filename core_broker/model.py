"""The domain model every layer speaks: messages, queues, put and get results.

Protocol adapters translate their frames into these types and back; the
store persists them. Classes use ``__slots__`` and plain ``__init__`` because
a message object is built for every put on the hot path.
"""

from __future__ import annotations

import enum
from typing import Iterable, NamedTuple


class MessageType(str, enum.Enum):
    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    COMPACTED = "COMPACTED"  # a topic type: keeps, eventually, the latest message per key


class Protocol(str, enum.Enum):
    """The door a message came in by; recorded with every stored message."""

    MQTT = "mqtt"
    AMQP = "amqp"
    CLOUDEVENTS = "cloudevents"
    HTTP = "http"
    GRPC = "grpc"
    INTERNAL = "internal"


class MessageQueue(NamedTuple):
    topic: str
    queue_id: int
    broker_name: str = "broker-a"


class DispatchTarget(NamedTuple):
    """An extra (topic, queue) a stored message is indexed into (multi-dispatch)."""

    topic: str
    queue_id: int


class Message:
    """A message as a producer hands it to the store.

    ``queue_id`` is the primary queue; ``extra_dispatch`` names further queues the
    same record is indexed into (the body is stored once). ``message_id`` may be
    left empty, in which case the store derives one from the record's position.
    """

    __slots__ = (
        "topic",
        "body",
        "tag",
        "keys",
        "properties",
        "message_group",
        "delivery_time_ms",
        "born_timestamp_ms",
        "born_host",
        "protocol",
        "message_id",
        "queue_id",
        "extra_dispatch",
        "reconsume_times",
        "flags",
    )

    def __init__(
        self,
        topic: str,
        body: bytes,
        *,
        tag: str | None = None,
        keys: Iterable[str] = (),
        properties: dict[str, str] | None = None,
        message_group: str | None = None,
        delivery_time_ms: int = 0,
        born_timestamp_ms: int = 0,
        born_host: str = "",
        protocol: str = "internal",
        message_id: str = "",
        queue_id: int = 0,
        extra_dispatch: Iterable[DispatchTarget] = (),
        reconsume_times: int = 0,
        flags: int = 0,
    ) -> None:
        self.topic = topic
        self.body = body
        self.tag = tag
        self.keys = tuple(keys)
        self.properties = properties if properties is not None else {}
        self.message_group = message_group
        self.delivery_time_ms = delivery_time_ms
        self.born_timestamp_ms = born_timestamp_ms
        self.born_host = born_host
        self.protocol = protocol.value if isinstance(protocol, Protocol) else protocol
        self.message_id = message_id
        self.queue_id = queue_id
        self.extra_dispatch = tuple(extra_dispatch)
        self.reconsume_times = reconsume_times
        self.flags = flags

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(topic={self.topic!r}, id={self.message_id!r}, "
            f"tag={self.tag!r}, keys={self.keys!r}, body={len(self.body)}B)"
        )


class StoredMessage(Message):
    """A message read back from the store, with where it lives."""

    __slots__ = ("queue_offset", "commitlog_offset", "store_size", "store_timestamp_ms")

    def __init__(self, topic: str, body: bytes, **kw: object) -> None:
        self.queue_offset: int = kw.pop("queue_offset", -1)  # type: ignore[assignment]
        self.commitlog_offset: int = kw.pop("commitlog_offset", -1)  # type: ignore[assignment]
        self.store_size: int = kw.pop("store_size", 0)  # type: ignore[assignment]
        self.store_timestamp_ms: int = kw.pop("store_timestamp_ms", 0)  # type: ignore[assignment]
        super().__init__(topic, body, **kw)  # type: ignore[arg-type]

    def clone(self) -> "StoredMessage":
        c = StoredMessage.__new__(StoredMessage)
        for s in Message.__slots__ + StoredMessage.__slots__:
            setattr(c, s, getattr(self, s))
        c.properties = dict(self.properties)
        return c


class PutStatus(str, enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"


class PutResult(NamedTuple):
    status: PutStatus
    message_id: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    store_size: int
    # queue offsets assigned in each extra dispatch target, in order
    extra_offsets: tuple[int, ...] = ()


class GetStatus(str, enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"  # entries scanned, none passed the filter
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"  # queue empty or unknown
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # offset == max: caught up
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # offset > max
    OFFSET_MOVED = "OFFSET_MOVED"  # offset < min: retention removed it; restart at min_offset


class GetResult(NamedTuple):
    status: GetStatus
    messages: list[StoredMessage]
    next_offset: int
    min_offset: int
    max_offset: int


class FilterType(str, enum.Enum):
    TAG = "TAG"
    SQL92 = "SQL92"


class FilterExpression(NamedTuple):
    """A consumer's server-side filter: a tag expression or SQL92 over properties."""

    expression: str = "*"
    type: FilterType = FilterType.TAG

    @property
    def matches_all(self) -> bool:
        return self.type == FilterType.TAG and self.expression.strip() in ("", "*")
