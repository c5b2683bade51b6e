"""The v2 protocol <-> unimq domain mapping, as pure functions (no sockets, no event loop).

Why a separate module: the gRPC framing itself is grpcio's job (HTTP/2 and
protobuf, with the stubs the official ``rocketmq-python-client`` ships), so the
door's own "codec" is this translation layer: v2 ``Message`` to
``core_broker.model.Message`` and back, ``core_broker.errors`` codes to v2
status codes, routes to ``MessageQueue`` lists, client settings. Keeping it
free of grpc servers makes it testable and reusable by the bench's raw client.

The mapping (see README, "RocketMQ 5 gRPC door"):

======================================  =====================================
v2 ``Message``                          unimq ``Message``
======================================  =====================================
topic.name (namespace-wrapped)          topic
body                                    body
system_properties.tag                   tag
system_properties.keys                  keys
system_properties.message_group         message_group
system_properties.delivery_timestamp    delivery_time_ms
system_properties.born_timestamp/host   born_timestamp_ms / born_host
system_properties.message_id            message_id (client-generated; kept)
user_properties                         properties
(the door)                              protocol = "grpc"
======================================  =====================================

Outbound messages also carry receipt_handle (the processor's, verbatim),
delivery_attempt, queue id/offset, store timestamp and a CRC32 body digest.
"""

from __future__ import annotations

import zlib
from typing import Iterable, Mapping

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb

from core_broker.model import FilterExpression, FilterType, Message, MessageType, StoredMessage
from core_broker.topic_config import PERM_READ, PERM_WRITE

Code = pb.Code
# enum values as plain ints (attribute lookups on protobuf enum wrappers are slow on the hot path)
_GZIP = pb.Encoding.GZIP
_IDENTITY = pb.Encoding.IDENTITY
_CRC32 = pb.DigestType.CRC32
_T_NORMAL, _T_FIFO, _T_DELAY, _T_TRANSACTION = (
    pb.MessageType.NORMAL, pb.MessageType.FIFO, pb.MessageType.DELAY, pb.MessageType.TRANSACTION,
)

# ------------------------------------------------------------------ status codes

#: unimq error codes (``UnimqError.code``) that have no v2 code of the same name.
_CODE_ALIASES: dict[str, int] = {
    "STORE_FULL": Code.INTERNAL_SERVER_ERROR,
    "SERVICE_UNAVAILABLE": Code.INTERNAL_SERVER_ERROR,
    # replication: retriable; RocketMQ answers HA_NOT_AVAILABLE when too few replicas are in sync
    "NOT_ENOUGH_REPLICAS": Code.HA_NOT_AVAILABLE,
    "NOT_MASTER": Code.HA_NOT_AVAILABLE,
    "QUEUE_MOVED": Code.HA_NOT_AVAILABLE,  # retriable: a static topic's logic queue is being remapped
    "CORRUPT_RECORD": Code.INTERNAL_SERVER_ERROR,
    "TOPIC_EXISTS": Code.BAD_REQUEST,
    "INTERNAL_ERROR": Code.INTERNAL_ERROR,
}
_V2_CODES = {name: value for name, value in pb.Code.items()}


def status_code_of(error: BaseException) -> int:
    """The v2 ``Code`` for an exception raised by the processor (or the door).

    A ``core_broker.errors`` code is taken by name when v2 has it
    (TOPIC_NOT_FOUND, BAD_REQUEST, MESSAGE_BODY_TOO_LARGE, ILLEGAL_FILTER_EXPRESSION,
    INVALID_RECEIPT_HANDLE, UNAUTHORIZED, FORBIDDEN, INVALID_TRANSACTION_ID,
    MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, MASTER_PERSISTENCE_TIMEOUT, ...); any other
    client error (a BadRequestError subclass) is BAD_REQUEST; the rest INTERNAL_SERVER_ERROR.
    """
    from core_broker.errors import BadRequestError

    code = getattr(error, "code", None)
    if isinstance(code, str):
        if code in _V2_CODES and _V2_CODES[code] != Code.CODE_UNSPECIFIED:
            return _V2_CODES[code]
        if code in _CODE_ALIASES:
            return _CODE_ALIASES[code]
    if isinstance(error, BadRequestError):
        return Code.BAD_REQUEST
    return Code.INTERNAL_SERVER_ERROR


def status(code: int = Code.OK, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)


OK = status()


# ------------------------------------------------------------------ namespaces


def wrap(namespace: str, name: str) -> str:
    """RocketMQ's namespace convention: resource ``name`` in namespace ``ns`` is ``ns%name``."""
    if not namespace or not name or name.startswith(namespace + "%") or name.startswith("%"):
        return name
    return f"{namespace}%{name}"


def unwrap(namespace: str, name: str) -> str:
    if namespace and name.startswith(namespace + "%"):
        return name[len(namespace) + 1 :]
    return name


def resource_name(resource: pb.Resource) -> str:
    return wrap(resource.resource_namespace, resource.name)


# ------------------------------------------------------------------ time


def timestamp_ms(ts: Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def to_timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def duration_ms(d: Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def to_duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


# ------------------------------------------------------------------ messages


class InvalidMessage(ValueError):
    """A v2 message the door refuses before it reaches the processor; ``code`` is the v2 code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def from_v2(msg: pb.Message) -> tuple[Message, bool]:
    """A v2 message as a unimq message, and whether it is a transactional (half) message.

    Raises :class:`InvalidMessage` for what v2 defines its own codes for (missing
    topic, empty body, blank tag/keys/group).
    """
    topic = resource_name(msg.topic)
    if not msg.topic.name:
        raise InvalidMessage(Code.ILLEGAL_TOPIC, "a message needs a topic")
    sp = msg.system_properties
    if not msg.body:
        raise InvalidMessage(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    body = msg.body
    if sp.body_encoding == _GZIP:
        try:
            body = zlib.decompress(body, 47)  # gzip or zlib header
        except zlib.error as e:
            raise InvalidMessage(Code.MESSAGE_CORRUPTED, f"body is not valid gzip: {e}") from None
    tag: str | None = None
    if sp.HasField("tag"):
        tag = sp.tag
        if not tag.strip() or "|" in tag:
            raise InvalidMessage(Code.ILLEGAL_MESSAGE_TAG, f"illegal tag {tag!r}")
    for k in sp.keys:
        if not k.strip():
            raise InvalidMessage(Code.ILLEGAL_MESSAGE_KEY, "a message key must not be blank")
    group = sp.message_group if sp.HasField("message_group") else None
    if group is not None and not group.strip():
        raise InvalidMessage(Code.ILLEGAL_MESSAGE_GROUP, "message group must not be blank")
    for k in msg.user_properties:
        if not k:
            raise InvalidMessage(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "a property key must not be empty")
    delivery = timestamp_ms(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else 0
    mtype = sp.message_type
    transactional = mtype == _T_TRANSACTION
    if transactional and (group or delivery):
        raise InvalidMessage(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a transactional message takes no message group or delivery time"
        )
    if mtype == _T_FIFO and not group:
        raise InvalidMessage(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a FIFO message needs a message group")
    if mtype == _T_DELAY and not delivery:
        raise InvalidMessage(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a DELAY message needs a delivery timestamp")
    m = Message(
        topic,
        body,
        tag=tag,
        keys=tuple(sp.keys),
        properties=dict(msg.user_properties),
        message_group=group,
        delivery_time_ms=delivery,
        born_timestamp_ms=timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else 0,
        born_host=sp.born_host,
        protocol="grpc",
        message_id=sp.message_id,
    )
    return m, transactional


def _message_type(m: Message) -> int:
    if m.message_group:
        return _T_FIFO
    if m.delivery_time_ms:
        return _T_DELAY
    return _T_NORMAL


def to_v2(
    m: StoredMessage,
    namespace: str = "",
    *,
    receipt_handle: str | None = None,
    delivery_attempt: int | None = None,
    invisible_ms: int | None = None,
    store_host: str = "",
    message_type: int | None = None,
    into: pb.Message | None = None,
) -> pb.Message:
    """A stored message as the v2 message a consumer (or a transaction checker) receives.

    Fields are set one by one: on the receive path this is about 3x faster than
    building the protobuf messages from keyword arguments.
    """
    out = pb.Message() if into is None else into  # ``into``: fill a response's field, no copy
    out.topic.name = unwrap(namespace, m.topic)
    if namespace:
        out.topic.resource_namespace = namespace
    body = m.body
    out.body = body
    if m.properties:
        out.user_properties.update(m.properties)
    sp = out.system_properties
    if m.tag:
        sp.tag = m.tag
    if m.keys:
        sp.keys.extend(m.keys)
    sp.message_id = m.message_id
    digest = sp.body_digest
    digest.type = _CRC32
    digest.checksum = format(zlib.crc32(body) & 0xFFFFFFFF, "08X")
    sp.body_encoding = _IDENTITY
    sp.message_type = _message_type(m) if message_type is None else message_type
    if m.born_host:
        sp.born_host = m.born_host
    if store_host:
        sp.store_host = store_host
    qid = getattr(m, "queue_id", 0)
    if qid > 0:
        sp.queue_id = qid
    if m.message_group:
        sp.message_group = m.message_group
    ts = m.born_timestamp_ms
    if ts:
        sp.born_timestamp.seconds, sp.born_timestamp.nanos = ts // 1000, (ts % 1000) * 1_000_000
    ts = getattr(m, "store_timestamp_ms", 0)
    if ts:
        sp.store_timestamp.seconds, sp.store_timestamp.nanos = ts // 1000, (ts % 1000) * 1_000_000
    ts = m.delivery_time_ms
    if ts:
        sp.delivery_timestamp.seconds, sp.delivery_timestamp.nanos = ts // 1000, (ts % 1000) * 1_000_000
    offset = getattr(m, "queue_offset", -1)
    if offset is not None and offset >= 0:
        sp.queue_offset = offset
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if delivery_attempt is not None:
        sp.delivery_attempt = delivery_attempt
    if invisible_ms is not None:
        sp.invisible_duration.seconds, sp.invisible_duration.nanos = invisible_ms // 1000, (invisible_ms % 1000) * 1_000_000
    return out


# ------------------------------------------------------------------ filters


def filter_of(expr: pb.FilterExpression) -> FilterExpression | None:
    """The unimq filter for a v2 filter expression (None: everything)."""
    if expr.type == pb.FilterType.SQL:
        return FilterExpression(expr.expression, FilterType.SQL92)
    text = expr.expression.strip()
    if not text or text == "*":
        return None
    return FilterExpression(text, FilterType.TAG)


# ------------------------------------------------------------------ routes

_V2_TYPE = {
    MessageType.NORMAL: pb.MessageType.NORMAL,
    MessageType.FIFO: pb.MessageType.FIFO,
    MessageType.DELAY: pb.MessageType.DELAY,
    MessageType.TRANSACTION: pb.MessageType.TRANSACTION,
}


def permission(perm: int) -> int:
    r, w = bool(perm & PERM_READ), bool(perm & PERM_WRITE)
    if r and w:
        return pb.Permission.READ_WRITE
    if r:
        return pb.Permission.READ
    if w:
        return pb.Permission.WRITE
    return pb.Permission.NONE


def endpoints(addresses: Iterable[tuple[str, int]]) -> pb.Endpoints:
    """v2 endpoints for ``(host, port)`` pairs; the scheme comes from the first host."""
    import ipaddress

    addrs = [pb.Address(host=h, port=p) for h, p in addresses]
    scheme = pb.AddressScheme.DOMAIN_NAME
    if addrs:
        try:
            ip = ipaddress.ip_address(addrs[0].host)
            scheme = pb.AddressScheme.IPv4 if ip.version == 4 else pb.AddressScheme.IPv6
        except ValueError:
            addrs = addrs[:1]  # a domain-name scheme allows one address only
    return pb.Endpoints(scheme=scheme, addresses=addrs)


def message_queue(
    namespace: str,
    topic: str,
    queue_id: int,
    perm: int,
    broker: str,
    eps: pb.Endpoints,
    accept: Iterable[MessageType],
) -> pb.MessageQueue:
    return pb.MessageQueue(
        topic=pb.Resource(name=unwrap(namespace, topic), resource_namespace=namespace),
        id=queue_id,
        permission=permission(perm),
        broker=pb.Broker(name=broker, id=0, endpoints=eps),
        accept_message_types=sorted({_V2_TYPE[t] for t in accept}),
    )


# ------------------------------------------------------------------ settings


def retry_policy(max_attempts: int, backoff_ms: Iterable[int]) -> pb.RetryPolicy:
    """Customized backoff (consumers): the broker's retry delays and maximum deliveries."""
    return pb.RetryPolicy(
        max_attempts=max_attempts,
        customized_backoff=pb.CustomizedBackoff(next=[to_duration(int(ms)) for ms in backoff_ms]),
    )


def producer_retry_policy(max_attempts: int = 3) -> pb.RetryPolicy:
    return pb.RetryPolicy(
        max_attempts=max_attempts,
        exponential_backoff=pb.ExponentialBackoff(initial=to_duration(10), max=to_duration(1000), multiplier=2.0),
    )


def settings_reply(
    client: pb.Settings,
    *,
    max_body_size: int,
    fifo: bool,
    long_polling_ms: int,
    max_delivery_attempts: int,
    retry_backoff_ms: Iterable[int],
    receive_batch_size: int = 32,
) -> pb.Settings:
    """The settings the server answers a client's Telemetry settings with.

    Producers need a positive ``publishing.max_body_size`` (0 makes every send
    fail client-side) and ``validate_message_type``; consumers read
    ``subscription.fifo`` (FIFO consumption), ``long_polling_timeout`` and the
    customized backoff (retry delays and the maximum delivery attempts).
    """
    out = pb.Settings()
    if client.HasField("client_type"):
        out.client_type = client.client_type
    if client.HasField("access_point"):
        out.access_point.CopyFrom(client.access_point)
    if client.HasField("request_timeout"):
        out.request_timeout.CopyFrom(client.request_timeout)
    out.user_agent.CopyFrom(client.user_agent)
    out.metric.on = False
    which = client.WhichOneof("pub_sub")
    if which == "subscription":
        sub = out.subscription
        sub.group.CopyFrom(client.subscription.group)
        sub.subscriptions.extend(client.subscription.subscriptions)
        sub.fifo = fifo
        sub.receive_batch_size = receive_batch_size
        sub.long_polling_timeout.CopyFrom(to_duration(long_polling_ms))
        out.backoff_policy.CopyFrom(retry_policy(max_delivery_attempts, retry_backoff_ms))
    else:
        pub = out.publishing
        pub.topics.extend(client.publishing.topics)
        pub.max_body_size = max_body_size
        pub.validate_message_type = True
        out.backoff_policy.CopyFrom(producer_retry_policy())
    return out


def metadata_dict(metadata: Iterable[tuple[str, str | bytes]] | None) -> Mapping[str, str]:
    """Invocation metadata as a dict of lower-case keys (the first value of each key)."""
    out: dict[str, str] = {}
    for k, v in metadata or ():
        if k not in out:
            out[k] = v.decode("latin-1") if isinstance(v, bytes) else v
    return out
