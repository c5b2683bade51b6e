"""Unit tests of gateway.grpc.service.MessagingService over a real in-process processor.

Why: every unary answer must carry a v2 ``Status`` with the code of the
processor's error (module docstring), and routes must advertise the address the
client used. The servicer runs in a grpc.aio server on 127.0.0.1 port 0 over
the merged (one-process) processor, driven with raw v2 stubs.
"""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc

from gateway.context import RequestContext
from gateway.grpc.service import MessagingService
from processor_fixtures import MergedDeployment

pytestmark = pytest.mark.timeout(30)
Code = pb.Code
CTX = RequestContext(protocol="grpc", client_id="test")


@pytest.fixture
async def stub(tmp_path: Path) -> AsyncIterator[sgrpc.MessagingServiceStub]:
    d = MergedDeployment(tmp_path / "p", {})
    p = await d.start()
    await p.start()
    await p.create_topic(CTX, "orders", queues=2)
    server = grpc.aio.server()
    sgrpc.add_MessagingServiceServicer_to_server(MessagingService(p), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield sgrpc.MessagingServiceStub(ch)
    finally:
        await ch.close()
        await server.stop(None)
        await d.stop()


def _res(name: str) -> pb.Resource:
    return pb.Resource(name=name)


async def test_query_route_advertises_requested_endpoints(stub: sgrpc.MessagingServiceStub) -> None:
    eps = pb.Endpoints(addresses=[pb.Address(host="10.1.2.3", port=9999)])
    r = await stub.QueryRoute(spb.QueryRouteRequest(topic=_res("orders"), endpoints=eps), timeout=10)
    assert r.status.code == Code.OK
    assert sorted(q.id for q in r.message_queues) == [0, 1]
    for q in r.message_queues:
        assert q.topic.name == "orders"
        assert q.broker.endpoints.addresses[0].host == "10.1.2.3"
        assert q.broker.endpoints.addresses[0].port == 9999


async def test_query_route_of_unknown_topic_creates_it_with_auto_creation(stub: sgrpc.MessagingServiceStub) -> None:
    r = await stub.QueryRoute(spb.QueryRouteRequest(topic=_res("fresh")), timeout=10)
    assert r.status.code == Code.OK  # the proxy is the nameserver: the route query creates the topic
    assert r.message_queues and all(q.topic.name == "fresh" for q in r.message_queues)
    assert r.message_queues[0].broker.endpoints.addresses[0].port == 8081  # the door's default address


async def test_missing_names_are_statuses_not_rpc_errors(stub: sgrpc.MessagingServiceStub) -> None:
    r = await stub.QueryRoute(spb.QueryRouteRequest(topic=_res("")), timeout=10)
    assert r.status.code == Code.ILLEGAL_TOPIC
    assert not r.message_queues
    req = spb.ReceiveMessageRequest(group=_res(""), message_queue=pb.MessageQueue(topic=_res("orders"), id=-1))
    frames = [f async for f in stub.ReceiveMessage(req, timeout=10)]
    assert len(frames) == 1 and frames[0].status.code == Code.ILLEGAL_CONSUMER_GROUP


async def test_empty_send_is_bad_request(stub: sgrpc.MessagingServiceStub) -> None:
    r = await stub.SendMessage(spb.SendMessageRequest(), timeout=10)
    assert r.status.code == Code.BAD_REQUEST


async def test_send_receive_ack_round_trip(stub: sgrpc.MessagingServiceStub) -> None:
    m = pb.Message(topic=_res("orders"), body=b"hello")
    m.system_properties.tag = "TagA"
    m.system_properties.keys.extend(["k1"])
    m.system_properties.message_id = "01ABC"
    m.system_properties.body_encoding = pb.Encoding.IDENTITY
    m.system_properties.message_type = pb.MessageType.NORMAL
    sent = await stub.SendMessage(spb.SendMessageRequest(messages=[m]), timeout=10)
    assert sent.status.code == Code.OK, sent.status.message
    assert len(sent.entries) == 1 and sent.entries[0].status.code == Code.OK
    req = spb.ReceiveMessageRequest(
        group=_res("g"), message_queue=pb.MessageQueue(topic=_res("orders"), id=-1), batch_size=16,
        invisible_duration=Duration(seconds=30), long_polling_timeout=Duration(seconds=5),
    )
    frames = [f async for f in stub.ReceiveMessage(req, timeout=15)]
    assert frames[0].status.code == Code.OK
    msgs = [f.message for f in frames if f.HasField("message")]
    assert len(msgs) == 1
    got = msgs[0]
    assert got.body == b"hello" and got.system_properties.tag == "TagA"
    assert list(got.system_properties.keys) == ["k1"]
    assert got.system_properties.message_id == sent.entries[0].message_id
    handle = got.system_properties.receipt_handle
    assert handle
    ack = await stub.AckMessage(spb.AckMessageRequest(
        group=_res("g"), topic=_res("orders"),
        entries=[spb.AckMessageEntry(message_id=got.system_properties.message_id, receipt_handle=handle)],
    ), timeout=10)
    assert ack.status.code == Code.OK
    # acked: nothing left to receive
    req.long_polling_timeout.CopyFrom(Duration(seconds=0))
    again = [f async for f in stub.ReceiveMessage(req, timeout=15)]
    assert again[0].status.code == Code.MESSAGE_NOT_FOUND


@pytest.mark.parametrize(
    ("batch", "invisible_s", "code"),
    [(1025, 30, Code.BAD_REQUEST), (16, 0, Code.ILLEGAL_INVISIBLE_TIME)],
)
async def test_receive_rejects_bad_parameters(stub: sgrpc.MessagingServiceStub, batch: int, invisible_s: int,
                                              code: int) -> None:
    req = spb.ReceiveMessageRequest(
        group=_res("g"), message_queue=pb.MessageQueue(topic=_res("orders"), id=-1), batch_size=batch,
        invisible_duration=Duration(seconds=invisible_s),
    )
    frames = [f async for f in stub.ReceiveMessage(req, timeout=10)]
    assert len(frames) == 1 and frames[0].status.code == code


async def test_receive_from_unknown_topic(stub: sgrpc.MessagingServiceStub) -> None:
    req = spb.ReceiveMessageRequest(group=_res("g"), message_queue=pb.MessageQueue(topic=_res("nope"), id=-1))
    frames = [f async for f in stub.ReceiveMessage(req, timeout=10)]
    assert frames[0].status.code == Code.TOPIC_NOT_FOUND


async def test_ack_errors_per_entry(stub: sgrpc.MessagingServiceStub) -> None:
    empty = await stub.AckMessage(spb.AckMessageRequest(group=_res("g"), topic=_res("orders")), timeout=10)
    assert empty.status.code == Code.BAD_REQUEST
    one = await stub.AckMessage(spb.AckMessageRequest(
        group=_res("g"), topic=_res("orders"), entries=[spb.AckMessageEntry(message_id="m", receipt_handle="")],
    ), timeout=10)
    assert one.status.code == Code.INVALID_RECEIPT_HANDLE
    two = await stub.AckMessage(spb.AckMessageRequest(
        group=_res("g"), topic=_res("orders"),
        entries=[spb.AckMessageEntry(message_id="a", receipt_handle=""),
                 spb.AckMessageEntry(message_id="b", receipt_handle="garbage")],
    ), timeout=10)
    assert two.status.code == Code.MULTIPLE_RESULTS
    assert all(e.status.code != Code.OK for e in two.entries)
