"""Helpers of the gRPC door suite (tests/test_grpc_*.py).

The suite drives `unimq up` with the OFFICIAL RocketMQ 5 Python client
(``rocketmq-python-client``), which is synchronous and runs its own I/O thread;
raw ``grpc.aio`` stubs (from the same package) are used only where the client
has no API (pull/offset RPCs) or would refuse bad input before sending it.

Waiting: every helper that waits has a deadline and fails with what it saw so
far; nothing asserts how fast anything happened.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer

# Typed topics every server of the suite declares; the broker's clocks are fast
# (transaction checks after 2 s, three deliveries before the DLQ, short retry back-off).
CONFIG = """
[store]
commitlog_segment_size = 16777216
cq_entries_per_file = 10000
index_slots = 4096
index_entries_per_file = 16384
flush_interval_ms = 20
# the host's free space must not change an outcome (a shared CI disk may be nearly full)
disk_min_free_ratio = 0.0
disk_refuse_free_ratio = 0.0

[broker]
max_delivery_attempts = 3
retry_backoff_ms = [200]
revive_interval_ms = 50
transaction_check_immunity_ms = 2000
transaction_check_interval_ms = 1000

[[topics]]
name = "fifo_t"
queues = 4
type = "FIFO"

[[topics]]
name = "fifo_dlq_t"
queues = 2
type = "FIFO"

[[topics]]
name = "pull_t"
queues = 1

[[topics]]
name = "delay_t"
queues = 2
type = "DELAY"

[[topics]]
name = "txn_t"
queues = 2
type = "TRANSACTION"
"""


def write_config(directory: Path, extra: str = "", top: str = "") -> Path:
    """The suite's TOML config (``top`` goes before the first table, ``extra`` after)."""
    path = directory / "unimq-grpc.toml"
    path.write_text(top + "\n" + CONFIG + "\n" + extra)
    return path


def client_config(port: int, ak: str = "", sk: str = "", timeout: int = 5) -> ClientConfiguration:
    return ClientConfiguration(f"127.0.0.1:{port}", Credentials(ak, sk), request_timeout=timeout)


def message(topic: str, body: bytes, *, tag: str | None = None, keys: tuple[str, ...] = (),
            props: dict[str, str] | None = None, group: str | None = None, deliver_at_s: int | None = None) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    for k in keys:
        m.keys = k
    for k, v in (props or {}).items():
        m.add_property(k, v)
    if group:
        m.message_group = group
    if deliver_at_s:
        m.delivery_timestamp = deliver_at_s
    return m


@contextlib.contextmanager
def started(client: Any) -> Iterator[Any]:
    """Start an official client and always shut it down."""
    client.startup()
    try:
        yield client
    finally:
        client.shutdown()


def producer(port: int, topics: tuple[str, ...] = (), checker: Any = None, **kw: Any) -> Producer:
    return Producer(client_config(port, **kw), topics or None, checker=checker)


def simple_consumer(port: int, group: str, subs: dict[str, FilterExpression], await_s: int = 2, **kw: Any) -> SimpleConsumer:
    return SimpleConsumer(client_config(port, **kw), group, subs, await_duration=await_s)


def receive_until(consumer: SimpleConsumer, count: int, *, timeout: float = 30.0, invisible_s: int = 30,
                  ack: bool = True, batch: int = 32) -> list[Message]:
    """Receive (and ack) until ``count`` messages arrived; fails after ``timeout`` with what came."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"received {len(got)} of {count} messages: {[m.body for m in got]}")
        for m in consumer.receive(batch, invisible_s):
            got.append(m)
            if ack:
                consumer.ack(m)
    return got


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = predicate()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def shared_server(tmp_path_factory: Any, *extra_args: str, timeout: float = 60.0) -> Iterator[Any]:
    """One `unimq up` for a whole test module (the conftest factory is per test).

    Starting the server costs seconds, and the tests of a module use distinct
    topics and groups, so they can share one. Same command line, stdout
    contract and teardown as ``conftest.unimq_server`` (which it reuses).
    """
    import queue
    import signal
    import subprocess
    import threading

    import conftest

    data_dir = tmp_path_factory.mktemp("unimq-grpc-data")
    err_path = tmp_path_factory.mktemp("unimq-grpc-log") / "stderr.txt"
    args = [*conftest._unimq_command(), "up", "--data-dir", str(data_dir), "--host", "127.0.0.1"]
    for flag in conftest.PORT_FLAGS:
        args += [flag, "0"]
    if not conftest._config_sets_segment_size(extra_args):
        args += conftest.TEST_STORE_ARGS
    args += list(extra_args)

    with err_path.open("w") as err:
        proc = subprocess.Popen(args, cwd=conftest.REPO_ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1)
    server = conftest.UnimqProcess(proc=proc, data_dir=data_dir, stderr_path=err_path)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    server.pump = threading.Thread(target=pump, daemon=True)
    server.pump.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"unimq not ready in {timeout}s: {server.stdout_lines} {server.stderr()}") from None
            if line is None:
                raise AssertionError(f"unimq exited before ready: {server.stdout_lines} {server.stderr()}")
            server.stdout_lines.append(line)
            m = conftest.LISTEN_LINE.match(line)
            if m:
                server.ports[m["door"]] = int(m["port"])
            elif line == "unimq: ready":
                break
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        server.pump.join(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


# ------------------------------------------------------------------ raw v2 requests (grpc.aio stubs)


def raw_message(topic: str, body: bytes, *, tag: str | None = None, mtype: int = 1, namespace: str = "") -> Any:
    """A v2 Message as the official client builds it (message id left to the server's store)."""
    import uuid

    from rocketmq.grpc_protocol import definition_pb2 as pb

    m = pb.Message(topic=pb.Resource(name=topic, resource_namespace=namespace), body=body)
    m.system_properties.message_id = uuid.uuid4().hex.upper()
    m.system_properties.message_type = mtype
    m.system_properties.body_encoding = pb.Encoding.IDENTITY
    m.system_properties.born_host = "127.0.0.1"
    m.system_properties.born_timestamp.seconds = int(time.time())
    if tag:
        m.system_properties.tag = tag
    return m


def endpoints_of(port: int) -> Any:
    from rocketmq.grpc_protocol import definition_pb2 as pb

    return pb.Endpoints(scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host="127.0.0.1", port=port)])
