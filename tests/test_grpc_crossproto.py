"""One model, many protocols: what the official client sends is what the processor stores.

Here the gRPC door runs in-process (the same GrpcDoor `unimq up` starts) over a
processor the test holds, so the messages can be read back through the
processor's other paths (query by id, pop of another group, pull) -- the
paths the MQTT, AMQP and HTTP doors use -- and a message stored by another
door reaches the official gRPC consumer with its properties intact.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import AsyncIterator

import pytest
from rocketmq import FilterExpression

from core_broker.config import BrokerConfig, StoreConfig
from core_broker.model import Message
from gateway.context import RequestContext
from gateway.deployment import merged_processor
from gateway.grpc import GrpcDoor
from gateway.processor import ProcessorConfig
from gateway.door import ServerState
from unimq.settings import UnimqSettings
from grpc_helpers import message, producer, receive_until, simple_consumer, started

pytestmark = pytest.mark.timeout(90)
CTX = RequestContext(protocol="mqtt", client_id="other-door")


@pytest.fixture
async def door(tmp_path: Path) -> AsyncIterator[tuple[object, int]]:
    settings = UnimqSettings(
        host="127.0.0.1",
        grpc_port=0,
        store=StoreConfig(data_dir=tmp_path / "data", commitlog_segment_size=8 << 20, index_slots=4096,
                          index_entries_per_file=16384, cq_entries_per_file=10000,
                          disk_min_free_ratio=0.0, disk_refuse_free_ratio=0.0),
        broker=BrokerConfig(revive_interval_ms=50),
    )
    processor = merged_processor(settings.store, settings.broker, ProcessorConfig())
    await processor.start()
    state = ServerState(settings=settings, processor=processor)
    d = GrpcDoor(state)
    _, port = await d.start()
    processor._grpc_door = d  # type: ignore[attr-defined]  # for tests that tune the door
    try:
        yield processor, port
    finally:
        await d.stop()
        await processor.stop()


async def test_grpc_message_read_through_the_processor(door) -> None:
    processor, port = door

    def send() -> str:
        with started(producer(port, ("xp_t",))) as p:
            m = message("xp_t", b"\x00binary\xffbody", tag="TagX", keys=("order-1", "user-7"),
                        props={"region": "eu", "temp": "31", "ünï": "cødé"}, group=None)
            return p.send(m).message_id

    mid = await asyncio.to_thread(send)
    stored = await processor.query_message_by_id(CTX, mid)
    assert stored is not None
    assert (stored.topic, stored.body, stored.tag, set(stored.keys)) == ("xp_t", b"\x00binary\xffbody", "TagX", {"order-1", "user-7"})
    assert stored.properties == {"region": "eu", "temp": "31", "ünï": "cødé"}
    assert stored.protocol == "grpc" and stored.message_id == mid and stored.born_timestamp_ms > 0

    popped = await processor.pop(CTX, "another-door-group", "xp_t", 8, 30_000, wait_ms=1000)
    assert [p.message.message_id for p in popped] == [mid]
    assert popped[0].message.properties == stored.properties
    by_key = await processor.query_messages_by_key(CTX, "xp_t", "user-7")
    assert [m.message_id for m in by_key] == [mid]


async def test_fifo_message_group_survives(door) -> None:
    processor, port = door
    await processor.create_topic(CTX, "xp_fifo", queues=2, message_type="FIFO")

    def send() -> str:
        with started(producer(port, ("xp_fifo",))) as p:
            return p.send(message("xp_fifo", b"ordered", group="grp-1")).message_id

    mid = await asyncio.to_thread(send)
    stored = await processor.query_message_by_id(CTX, mid)
    assert stored.message_group == "grp-1" and stored.protocol == "grpc"


async def test_message_from_another_door_reaches_the_official_consumer(door) -> None:
    processor, port = door
    await processor.create_topic(CTX, "xp_in", queues=2)
    [r] = await processor.send(
        CTX, [Message("xp_in", b"from mqtt", tag="T1", keys=("k",), properties={"mqtt_topic": "a/b/c", "qos": "1"},
                      protocol="mqtt")]
    )

    def receive() -> list:
        with started(simple_consumer(port, "g-xp", {"xp_in": FilterExpression()}, await_s=1)) as c:
            return receive_until(c, 1)

    [m] = await asyncio.to_thread(receive)
    assert m.message_id == r.message_id and m.body == b"from mqtt" and m.tag == "T1" and m.keys == {"k"}
    assert m.properties == {"mqtt_topic": "a/b/c", "qos": "1"} and not m.corrupted


async def test_push_style_receive_is_renewed_until_acked_with_the_original_handle(door) -> None:
    """auto_renew: the door keeps the message hidden past its invisible time and maps the client's
    (original) receipt handle to the newest one when the client finally acks."""
    import grpc
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as spb
    from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc
    from google.protobuf.duration_pb2 import Duration

    processor, port = door
    renewer = processor._grpc_door.service.renewer  # type: ignore[attr-defined]
    renewer.invisible_ms, renewer.renew_ahead_ms, renewer.interval_s = 2000, 1500, 0.1
    await processor.create_topic(CTX, "rn_t", queues=1)
    await processor.send(CTX, [Message("rn_t", b"slow listener")])
    md = (("x-mq-client-id", "renew-client"),)
    mq = pb.MessageQueue(topic=pb.Resource(name="rn_t"), id=-1)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = sgrpc.MessagingServiceStub(ch)
        push_like = spb.ReceiveMessageRequest(group=pb.Resource(name="g-rn"), message_queue=mq, batch_size=8,
                                              auto_renew=True, long_polling_timeout=Duration(seconds=2))
        frames = [f async for f in stub.ReceiveMessage(push_like, metadata=md, timeout=10)]
        [msg] = [f.message for f in frames if f.HasField("message")]
        await asyncio.sleep(5)  # well past the 2 s invisible time
        other = spb.ReceiveMessageRequest(group=pb.Resource(name="g-rn"), message_queue=mq, batch_size=8,
                                          invisible_duration=Duration(seconds=30))
        again = [f async for f in stub.ReceiveMessage(other, metadata=md, timeout=10)]
        assert [f.status.code for f in again] == [pb.Code.MESSAGE_NOT_FOUND]  # still hidden: renewed
        ack = await stub.AckMessage(spb.AckMessageRequest(
            group=pb.Resource(name="g-rn"), topic=pb.Resource(name="rn_t"),
            entries=[spb.AckMessageEntry(message_id=msg.system_properties.message_id,
                                         receipt_handle=msg.system_properties.receipt_handle)]),
            metadata=md, timeout=10)
        assert ack.status.code == pb.Code.OK
    assert renewer.held == {}
