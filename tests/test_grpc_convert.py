"""The gRPC door's pure parts: message mapping, status codes, signatures, sessions (no sockets)."""

from __future__ import annotations

import zlib

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.util import Signature

from core_broker.errors import (
    BadRequestError,
    IllegalFilterExpressionError,
    MessageTooLargeError,
    StoreFullError,
    TopicNotFoundError,
)
from core_broker.model import FilterType, MessageType, StoredMessage
from core_broker.receipt import InvalidReceiptHandleError
from gateway.auth import UnauthorizedError
from gateway.grpc import convert as cv
from gateway.grpc.sessions import SessionRegistry
from gateway.grpc.signature import verify
from gateway.processor import MessageTypeMismatchError

Code = pb.Code


def v2(topic: str = "t", body: bytes = b"b", **sp: object) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    for k, v in sp.items():
        if k == "keys":
            m.system_properties.keys.extend(v)  # type: ignore[arg-type]
        else:
            setattr(m.system_properties, k, v)
    return m


def test_round_trip_of_every_mapped_field() -> None:
    src = v2("orders", b"\x00\xffbody", tag="TagA", keys=["k1", "k2"], message_group="g1",
             message_id="01ABC", born_host="10.0.0.1", message_type=pb.MessageType.FIFO)
    src.system_properties.born_timestamp.seconds = 1_700_000_000
    src.user_properties["region"] = "eu"
    m, transactional = cv.from_v2(src)
    assert not transactional
    assert (m.topic, m.body, m.tag, m.keys, m.message_group, m.message_id, m.born_host, m.protocol) == (
        "orders", b"\x00\xffbody", "TagA", ("k1", "k2"), "g1", "01ABC", "10.0.0.1", "grpc")
    assert m.born_timestamp_ms == 1_700_000_000_000 and m.properties == {"region": "eu"}

    stored = StoredMessage(m.topic, m.body, tag=m.tag, keys=m.keys, properties=m.properties, message_group=m.message_group,
                           born_timestamp_ms=m.born_timestamp_ms, born_host=m.born_host, message_id=m.message_id,
                           queue_id=3, queue_offset=42, store_timestamp_ms=1_700_000_001_500)
    out = cv.to_v2(stored, receipt_handle="rh", delivery_attempt=2, invisible_ms=30_000)
    sp = out.system_properties
    assert (out.topic.name, out.body, sp.tag, list(sp.keys), sp.message_group, sp.message_id) == (
        "orders", b"\x00\xffbody", "TagA", ["k1", "k2"], "g1", "01ABC")
    assert (sp.receipt_handle, sp.delivery_attempt, sp.queue_id, sp.queue_offset) == ("rh", 2, 3, 42)
    assert sp.message_type == pb.MessageType.FIFO and dict(out.user_properties) == {"region": "eu"}
    assert sp.body_digest.type == pb.DigestType.CRC32
    assert sp.body_digest.checksum == format(zlib.crc32(b"\x00\xffbody"), "08X")  # what the client checks
    assert cv.timestamp_ms(sp.store_timestamp) == 1_700_000_001_500 and sp.invisible_duration.seconds == 30


def test_delay_transaction_gzip_and_namespace() -> None:
    d = v2(message_type=pb.MessageType.DELAY)
    d.system_properties.delivery_timestamp.seconds = 1_800_000_000
    m, _ = cv.from_v2(d)
    assert m.delivery_time_ms == 1_800_000_000_000
    _, transactional = cv.from_v2(v2(message_type=pb.MessageType.TRANSACTION))
    assert transactional
    g = v2(body=zlib.compress(b"squeezed"), body_encoding=pb.Encoding.GZIP)
    assert cv.from_v2(g)[0].body == b"squeezed"
    ns = pb.Message(topic=pb.Resource(name="orders", resource_namespace="tenant"), body=b"x")
    assert cv.from_v2(ns)[0].topic == "tenant%orders"
    assert cv.unwrap("tenant", "tenant%orders") == "orders" and cv.wrap("", "orders") == "orders"


@pytest.mark.parametrize(
    "msg, code",
    [
        (v2(topic=""), Code.ILLEGAL_TOPIC),
        (v2(body=b""), Code.MESSAGE_BODY_EMPTY),
        (v2(tag="a|b"), Code.ILLEGAL_MESSAGE_TAG),
        (v2(keys=[" "]), Code.ILLEGAL_MESSAGE_KEY),
        (v2(message_group=" "), Code.ILLEGAL_MESSAGE_GROUP),
        (v2(message_type=pb.MessageType.FIFO), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (v2(message_type=pb.MessageType.TRANSACTION, message_group="g"), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (v2(body=b"not gzip", body_encoding=pb.Encoding.GZIP), Code.MESSAGE_CORRUPTED),
    ],
)
def test_invalid_messages_get_their_v2_code(msg: pb.Message, code: int) -> None:
    with pytest.raises(cv.InvalidMessage) as e:
        cv.from_v2(msg)
    assert e.value.code == code


@pytest.mark.parametrize(
    "error, code",
    [
        (TopicNotFoundError("x"), Code.TOPIC_NOT_FOUND),
        (BadRequestError("x"), Code.BAD_REQUEST),
        (MessageTooLargeError("x"), Code.MESSAGE_BODY_TOO_LARGE),
        (IllegalFilterExpressionError("x"), Code.ILLEGAL_FILTER_EXPRESSION),
        (InvalidReceiptHandleError("x"), Code.INVALID_RECEIPT_HANDLE),
        (UnauthorizedError("x"), Code.UNAUTHORIZED),
        (MessageTypeMismatchError("x"), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (StoreFullError("x"), Code.INTERNAL_SERVER_ERROR),
        (RuntimeError("bug"), Code.INTERNAL_SERVER_ERROR),
    ],
)
def test_status_codes(error: BaseException, code: int) -> None:
    assert cv.status_code_of(error) == code


def test_filters_routes_and_settings() -> None:
    assert cv.filter_of(pb.FilterExpression(type=pb.FilterType.TAG, expression="*")) is None
    tag = cv.filter_of(pb.FilterExpression(type=pb.FilterType.TAG, expression="A || B"))
    assert tag is not None and tag.type == FilterType.TAG and tag.expression == "A || B"
    sql = cv.filter_of(pb.FilterExpression(type=pb.FilterType.SQL, expression="a > 1"))
    assert sql is not None and sql.type == FilterType.SQL92
    eps = cv.endpoints([("127.0.0.1", 8081)])
    assert eps.scheme == pb.AddressScheme.IPv4
    assert cv.endpoints([("localhost", 1), ("other", 2)]).scheme == pb.AddressScheme.DOMAIN_NAME
    q = cv.message_queue("", "t", 0, 0x6, "broker-a", eps, {MessageType.FIFO, MessageType.NORMAL})
    assert q.permission == pb.Permission.READ_WRITE and list(q.accept_message_types) == [1, 2] and q.broker.id == 0

    producer = pb.Settings(client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="t")]))
    reply = cv.settings_reply(producer, max_body_size=4 << 20, fifo=False, long_polling_ms=20_000,
                              max_delivery_attempts=16, retry_backoff_ms=(1000, 5000))
    assert reply.publishing.max_body_size == 4 << 20 and reply.publishing.validate_message_type
    consumer = pb.Settings(client_type=pb.ClientType.PUSH_CONSUMER,
                           subscription=pb.Subscription(group=pb.Resource(name="g")))
    reply = cv.settings_reply(consumer, max_body_size=1, fifo=True, long_polling_ms=20_000,
                              max_delivery_attempts=3, retry_backoff_ms=(1000, 5000))
    sub = reply.subscription
    assert sub.fifo and sub.long_polling_timeout.seconds == 20 and sub.group.name == "g"
    assert reply.backoff_policy.max_attempts == 3
    assert [d.seconds for d in reply.backoff_policy.customized_backoff.next] == [1, 5]


def test_signature_verification_matches_the_official_client() -> None:
    creds = {"ak": "secret"}
    good = cv.metadata_dict(Signature.metadata(ClientConfiguration("127.0.0.1:1", Credentials("ak", "secret")), "cid"))
    assert verify(good, creds) == "ak"
    assert verify(good, {}) is None  # auth off: anyone
    for ak, sk in (("ak", "wrong"), ("nobody", "secret")):
        bad = cv.metadata_dict(Signature.metadata(ClientConfiguration("127.0.0.1:1", Credentials(ak, sk)), "cid"))
        with pytest.raises(UnauthorizedError):
            verify(bad, creds)
    with pytest.raises(UnauthorizedError):
        verify({}, creds)
    with pytest.raises(UnauthorizedError):
        verify({"authorization": "Basic abc"}, creds)


def test_sessions_find_live_producers_of_a_topic() -> None:
    import asyncio

    reg = SessionRegistry()
    s = reg.get("c1")
    s.apply_settings(pb.Settings(client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="t")])))
    assert reg.producers_of("t") == []  # no stream open yet
    q: asyncio.Queue = asyncio.Queue()
    s.outboxes.append(q)
    assert reg.producers_of("t") == [s] and reg.producers_of("other") == []
    reg.published("c1", "", "other")
    assert reg.producers_of("other") == [s]
    assert s.push(spb.TelemetryCommand()) and q.qsize() == 1
    s.outboxes.clear()
    reg.remove("c1")
    assert reg.sessions == {}
