"""The internal RPC's data-path blocks and frame versioning (core_broker/remoting).

Every field of a message must survive a round trip through a block exactly as
it went in (types too: keys a tuple, extra dispatch targets DispatchTargets),
and a frame of another protocol version must be refused with a clear error.
"""

from __future__ import annotations

import asyncio

import msgpack
import pytest

from core_broker.model import (
    DispatchTarget,
    GetResult,
    GetStatus,
    Message,
    PutResult,
    PutStatus,
    StoredMessage,
)
from core_broker.pop_service import PoppedMessage
from core_broker.remoting import rows
from core_broker.remoting.client import PeerUnavailableError, RpcClient
from core_broker.remoting.codec import REQUEST, FrameDecoder, FrameError, encode
from core_broker.remoting.server import RpcServer
from core_broker.remoting.wire import pack_block


def _full_message(cls: type = Message, **extra: object) -> Message:
    return cls(
        "t", b"\x00body\xff", tag="tagA", keys=("k1", "k2"), properties={"a": "1", "ce_id": "x"},
        message_group="g", delivery_time_ms=123, born_timestamp_ms=456, born_host="10.0.0.1:5",
        protocol="mqtt", message_id="MID", queue_id=3, extra_dispatch=[DispatchTarget("lmq1", 0)],
        reconsume_times=2, flags=5, **extra,
    )


def _fields(m: Message, names: tuple[str, ...]) -> dict:
    return {n: getattr(m, n) for n in names}


def test_messages_round_trip_with_every_field_and_type() -> None:
    plain = Message("t2", b"")
    full = _full_message()
    got = rows.messages_from_block(rows.messages_to_block([full, plain]))
    assert [type(m) for m in got] == [Message, Message]
    assert _fields(got[0], rows.MESSAGE_FIELDS) == _fields(full, rows.MESSAGE_FIELDS)
    assert _fields(got[1], rows.MESSAGE_FIELDS) == _fields(plain, rows.MESSAGE_FIELDS)
    assert type(got[0].keys) is tuple and type(got[0].extra_dispatch[0]) is DispatchTarget
    assert got[0].extra_dispatch[0].topic == "lmq1" and got[1].extra_dispatch == ()
    assert got[1].tag is None and got[1].properties == {}


def test_popped_and_pulled_messages_round_trip() -> None:
    sm = _full_message(StoredMessage, queue_offset=7, commitlog_offset=99, store_size=120, store_timestamp_ms=789)
    popped = [PoppedMessage(sm, "handle-1", 2, 1000)]
    got = rows.popped_from_block(rows.popped_to_block(popped))
    assert type(got[0]) is PoppedMessage and type(got[0].message) is StoredMessage
    assert got[0][1:] == ("handle-1", 2, 1000)
    assert _fields(got[0].message, rows.STORED_FIELDS) == _fields(sm, rows.STORED_FIELDS)

    r = GetResult(GetStatus.FOUND, [sm], 8, 0, 10)
    back = rows.get_result_from_block(rows.get_result_to_block(r))
    assert back.status is GetStatus.FOUND and back[2:] == (8, 0, 10)
    assert _fields(back.messages[0], rows.STORED_FIELDS) == _fields(sm, rows.STORED_FIELDS)
    empty = rows.get_result_from_block(rows.get_result_to_block(GetResult(GetStatus.OFFSET_MOVED, [], 4, 4, 9)))
    assert empty == GetResult(GetStatus.OFFSET_MOVED, [], 4, 4, 9)


def test_put_results_round_trip() -> None:
    put = [(PutResult(PutStatus.PUT_OK, "M1", 1, 2, 3, 4, (5, 6)), None),
           (PutResult(PutStatus.FLUSH_DISK_TIMEOUT, "M2", 0, 0, 0, 0), "tid")]
    got = rows.put_results_from_block(rows.put_results_to_block(put))
    assert got == put
    assert got[0][0].status is PutStatus.PUT_OK and got[1][0].status is PutStatus.FLUSH_DISK_TIMEOUT


def test_a_value_a_block_cannot_carry_is_refused_and_the_packer_recovers() -> None:
    with pytest.raises(TypeError):
        pack_block([object()])
    assert msgpack.unpackb(pack_block([1, b"x"])) == [1, b"x"]


def test_a_frame_of_another_version_is_refused_with_a_clear_error() -> None:
    body = msgpack.packb([0, 1, "ping", [], {}])  # a v1 request
    with pytest.raises(FrameError, match="v1"):
        FrameDecoder().feed(len(body).to_bytes(4, "big") + body)
    assert FrameDecoder().feed(encode([REQUEST, 1, "ping", [], {}]))[0][2] == "ping"


def test_a_v1_peer_is_disconnected_and_a_v2_client_keeps_working() -> None:
    class Svc:
        def echo(self, block: bytes) -> bytes:
            return rows.messages_to_block(rows.messages_from_block(block))

    async def main() -> None:
        server = RpcServer(Svc(), ["echo"])
        host, port = await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection(host, port)
            body = msgpack.packb([0, 1, "echo", [], {}])
            writer.write(len(body).to_bytes(4, "big") + body)
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, nothing answered
            writer.close()
            c = RpcClient(host, port)
            msgs = [_full_message(), Message("t", b"x" * 1000)]
            got = rows.messages_from_block(await c.call("echo", rows.messages_to_block(msgs)))
            assert [_fields(m, rows.MESSAGE_FIELDS) for m in got] == [_fields(m, rows.MESSAGE_FIELDS) for m in msgs]
            with pytest.raises(Exception):  # a method that is not served: a typed error, not a hang
                await c.call("nope")
            await c.close()
        finally:
            await server.stop()

    asyncio.run(main())


def test_a_client_sees_why_a_peer_of_another_version_dropped_it() -> None:
    async def main() -> None:
        async def old_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(4)
            body = msgpack.packb([1, 1, True, None])  # a v1 response
            writer.write(len(body).to_bytes(4, "big") + body)
            await writer.drain()
            await asyncio.sleep(5)

        srv = await asyncio.start_server(old_server, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        c = RpcClient("127.0.0.1", port)
        with pytest.raises(PeerUnavailableError, match="v1"):
            await c.call("ping", rpc_timeout=10)
        await c.close()
        srv.close()

    asyncio.run(main())
