"""The grpc section: the RocketMQ 5 gRPC door of a real `unimq up`, two kinds of client.

A `unimq up` child process (default settings, async flush, every port
ephemeral, data in the run's scratch dir) serves the door. Each row is timed
in this process with ``time.perf_counter`` around the client loop only
(clients are started before the clock, shut down after it):

- **official client**: PyPI's ``rocketmq-python-client``, unchanged. ``Producer.send``
  is synchronous (one request in flight per calling thread, all threads share
  the client's single I/O event loop); ``SimpleConsumer.receive(32)`` then one
  ``ack`` per message, as an application would.
- **no-op peer**: the raw client below against a grpc.aio server (same stubs, uvloop, own
  process) whose SendMessage answers OK and stores nothing: the transport's own cost.
- **raw grpc.aio**: the same v2 requests built from the same stubs, sent from one
  asyncio loop with many calls in flight (SendMessage with one message per
  request, and a batch row with 32 per request; ReceiveMessage of 32 then one AckMessage
  carrying 32 entries). This is
  what the protocol and this server allow a Python client to reach; it is the
  peer the official rows are compared with.

Messages: 100 B bodies, one topic of 8 queues (auto-created), no tag or
properties. Receive rows drain messages sent beforehand, each row with a new
consumer group. Client and server share the machine's cores.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from . import Context, Row

NAME = "grpc"
TITLE = "RocketMQ 5 gRPC door (official client and raw grpc.aio)"
REPO = Path(__file__).resolve().parent.parent
BODY = 100
LISTEN = re.compile(r"^unimq: (?P<door>\w+) listening on \[?(?P<host>[^\]]+?)\]?:(?P<port>\d+)$")


class _Server:
    """A `unimq up` child on ephemeral ports; ``port`` is its gRPC door."""

    def __init__(self, data_dir: Path) -> None:
        cmd = [sys.executable, "-m", "unimq"]
        cmd += ["up", "--data-dir", str(data_dir / "data"), "--host", "127.0.0.1", "--log-level", "warning"]
        for flag in ("--mqtt-port", "--amqp-port", "--http-port", "--grpc-port", "--namesrv-port"):
            cmd += [flag, "0"]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.put(line.rstrip("\n"))
            lines.put(None)

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        self.port = 0
        deadline = time.monotonic() + 90
        while True:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if line is None:
                raise RuntimeError("unimq exited before it was ready")
            m = LISTEN.match(line)
            if m and m["door"] == "grpc":
                self.port = int(m["port"])
            if line == "unimq: ready":
                break

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._pump.join(10)


# A v2 server that answers SendMessage with OK and stores nothing: the same client
# against it measures what grpc.aio itself costs on this machine (the transport peer).
_NOOP_SERVER = """
import asyncio, sys, uvloop, grpc
from rocketmq.grpc_protocol import service_pb2 as spb, service_pb2_grpc as sg, definition_pb2 as pb
class Noop(sg.MessagingServiceServicer):
    async def SendMessage(self, request, context):
        m = request.messages[0]
        return spb.SendMessageResponse(status=pb.Status(code=pb.Code.OK), entries=[spb.SendResultEntry(
            status=pb.Status(code=pb.Code.OK), message_id=m.system_properties.message_id)])
async def main():
    server = grpc.aio.server()
    sg.add_MessagingServiceServicer_to_server(Noop(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(0)
uvloop.run(main())
"""


def _noop_send(count: int, inflight: int) -> float:
    proc = subprocess.Popen([sys.executable, "-c", _NOOP_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=REPO)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        return asyncio.run(_raw_send(port, "noop", count, inflight))
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


# ------------------------------------------------------------------ raw grpc.aio client


def _raw_message(topic: str, body: bytes):  # type: ignore[no-untyped-def]
    from rocketmq.grpc_protocol import definition_pb2 as pb

    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    sp = m.system_properties
    sp.message_id = uuid.uuid4().hex.upper()
    sp.message_type = pb.MessageType.NORMAL
    sp.body_encoding = pb.Encoding.IDENTITY
    sp.born_host = "127.0.0.1"
    sp.born_timestamp.seconds = int(time.time())
    return m


async def _raw_send(port: int, topic: str, count: int, inflight: int, per_request: int = 1) -> float:
    import grpc
    from rocketmq.grpc_protocol import service_pb2 as spb
    from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc

    body = os.urandom(BODY)
    requests = [
        spb.SendMessageRequest(messages=[_raw_message(topic, body) for _ in range(per_request)])
        for _ in range(count // per_request)
    ]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = sgrpc.MessagingServiceStub(ch)
        await stub.SendMessage(spb.SendMessageRequest(messages=[_raw_message(topic, body)]), timeout=10)  # warm-up
        it = iter(requests)

        async def worker() -> None:
            for req in it:
                r = await stub.SendMessage(req, timeout=30)
                if r.status.code != 20000:
                    raise RuntimeError(f"send failed: {r.status}")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        return time.perf_counter() - t0


async def _raw_receive_ack(port: int, topic: str, group: str, count: int, inflight: int) -> float:
    import grpc
    from google.protobuf.duration_pb2 import Duration
    from rocketmq.grpc_protocol import definition_pb2 as pb
    from rocketmq.grpc_protocol import service_pb2 as spb
    from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc

    req = spb.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
        batch_size=32, invisible_duration=Duration(seconds=60), long_polling_timeout=Duration(seconds=1),
    )
    got = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = sgrpc.MessagingServiceStub(ch)

        async def worker() -> None:
            nonlocal got
            while got < count:
                entries = []
                async for frame in stub.ReceiveMessage(req, timeout=10):
                    if frame.HasField("message"):
                        sp = frame.message.system_properties
                        entries.append(spb.AckMessageEntry(message_id=sp.message_id, receipt_handle=sp.receipt_handle))
                if not entries:
                    continue
                got += len(entries)
                r = await stub.AckMessage(spb.AckMessageRequest(
                    group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=entries), timeout=30)
                if r.status.code != 20000:
                    raise RuntimeError(f"ack failed: {r.status}")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        return time.perf_counter() - t0


# ------------------------------------------------------------------ official client


def _official_send(port: int, topic: str, count: int, threads: int) -> float:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    cfg = ClientConfiguration(f"127.0.0.1:{port}", Credentials(), request_timeout=10)
    p = Producer(cfg, (topic,))
    p.startup()
    body = os.urandom(BODY)

    def msg() -> Message:
        m = Message()
        m.topic = topic
        m.body = body
        return m

    try:
        p.send(msg())  # warm-up: route, channel, settings
        per = count // threads

        def loop() -> None:
            for _ in range(per):
                p.send(msg())

        workers = [threading.Thread(target=loop) for _ in range(threads)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return time.perf_counter() - t0
    finally:
        p.shutdown()


def _official_receive_ack(port: int, topic: str, group: str, count: int) -> float:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    cfg = ClientConfiguration(f"127.0.0.1:{port}", Credentials(), request_timeout=10)
    c = SimpleConsumer(cfg, group, {topic: FilterExpression()}, await_duration=1)
    c.startup()
    try:
        got = 0
        t0 = time.perf_counter()
        while got < count:
            for m in c.receive(32, 60):
                c.ack(m)
                got += 1
        return time.perf_counter() - t0
    finally:
        c.shutdown()


# ------------------------------------------------------------------ section


def run(ctx: Context) -> list[Row]:
    n_official = 1_500 if ctx.quick else 6_000
    n_raw = 4_000 if ctx.quick else 20_000
    noop_send = n_raw / _noop_send(n_raw, 64)
    server = _Server(ctx.scratch("grpc"))
    rows: list[Row] = []
    try:
        port = server.port
        raw_send_s = asyncio.run(_raw_send(port, "bench_raw", n_raw, 64))
        raw_send = n_raw / raw_send_s
        batch_send = (n_raw // 32 * 32) / asyncio.run(_raw_send(port, "bench_raw_batch", n_raw, 8, 32))
        sync1 = n_official / _official_send(port, "bench_official", n_official, 1)
        sync8 = (n_official // 8 * 8) / _official_send(port, "bench_official", n_official, 8)
        # receive rows drain what the send rows stored (each row a new group)
        raw_recv = n_raw / asyncio.run(_raw_receive_ack(port, "bench_raw", "bench-raw-group", n_raw, 8))
        off_recv = n_official / _official_receive_ack(port, "bench_official", "bench-official-group", n_official)
    finally:
        server.stop()
    mb = BODY / 1e6
    peer_send = f"raw grpc.aio {raw_send:,.0f} msgs/s"
    peer_recv = f"raw grpc.aio {raw_recv:,.0f} msgs/s"
    rows.append(Row(NAME, "raw grpc.aio SendMessage to a no-op grpc.aio server (transport peer)", noop_send,
                    noop_send * mb, note="what one grpc.aio client and server cost on this machine, storing nothing"))
    rows.append(Row(NAME, "raw grpc.aio SendMessage, 64 in flight, 1 msg/request", raw_send, raw_send * mb,
                    f"no-op server {noop_send:,.0f} msgs/s", f"{raw_send / noop_send:.0%}",
                    note="the ceiling a Python client reaches on this server: the peer of the official rows"))
    rows.append(Row(NAME, "raw grpc.aio SendMessage, 32 msgs/request, 8 in flight", batch_send, batch_send * mb,
                    note="per-call cost amortized: what the door and processor sustain"))
    rows.append(Row(NAME, "official Producer.send, 1 thread (sync)", sync1, sync1 * mb, peer_send, f"{sync1 / raw_send:.0%}"))
    rows.append(Row(NAME, "official Producer.send, 8 threads (sync)", sync8, sync8 * mb, peer_send, f"{sync8 / raw_send:.0%}"))
    rows.append(Row(NAME, "raw grpc.aio ReceiveMessage(32) + AckMessage(32 entries), 8 loops", raw_recv, raw_recv * mb))
    rows.append(Row(NAME, "official SimpleConsumer.receive(32) + ack each", off_recv, off_recv * mb, peer_recv,
                    f"{off_recv / raw_recv:.0%}"))
    return rows
