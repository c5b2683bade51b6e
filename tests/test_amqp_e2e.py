"""The AMQP door end to end: real pika and aio-pika clients against a real `unimq up`.

Why one server per module: every test uses its own queue and exchange names,
so they can share one `unimq up` (started like conftest's ``unimq_server``:
a subprocess on ephemeral ports, data in a temp dir, stopped by PID), which
keeps this suite fast. The restart and Celery tests, which need their own
server, live in their own files.

The tutorials are RabbitMQ's six classic ones (hello world, work queues,
publish/subscribe, routing, topics, RPC), written as their pika/aio-pika
code is, with assertions added.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import aio_pika
import pika
import pika.exceptions
import pytest
from pamqp import commands as C
from pamqp import frame as pframe
from pamqp import header as pheader

REPO = Path(__file__).resolve().parent.parent
LISTEN = re.compile(r"^unimq: (?P<door>\w+) listening on \[?(?P<host>[^\]]+?)\]?:(?P<port>\d+)$")

pytestmark = pytest.mark.timeout(60)


class Server:
    def __init__(self, proc: subprocess.Popen[str], ports: dict[str, int], stderr: Path) -> None:
        self.proc = proc
        self.ports = ports
        self.stderr = stderr

    @property
    def amqp_port(self) -> int:
        return self.ports["amqp"]


def start_unimq(data_dir: Path, log_dir: Path, *extra: str, timeout: float = 60.0) -> Server:
    """`unimq up` on ephemeral ports, like conftest's fixture; returns once it printed ready."""
    cmd = [sys.executable, "-m", "unimq"]
    cfg = log_dir / "unimq.toml"  # small commitlog segments: these tests store little
    cfg.write_text("[store]\ncommitlog_segment_size = 67108864\n"
                   "disk_refuse_free_ratio = 0.0\ndisk_min_free_ratio = 0.0\n")
    cmd += ["up", "--data-dir", str(data_dir), "--host", "127.0.0.1", "--config", str(cfg)]
    for flag in ("--mqtt-port", "--amqp-port", "--http-port", "--grpc-port", "--namesrv-port"):
        cmd += [flag, "0"]
    cmd += list(extra)
    stderr = log_dir / "stderr.txt"
    with stderr.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                text=True, bufsize=1, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    ports: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"unimq not ready in {timeout}s: {stderr.read_text()}")
        if line is None:
            raise AssertionError(f"unimq exited: {stderr.read_text()}")
        m = LISTEN.match(line)
        if m:
            ports[m["door"]] = int(m["port"])
        elif line == "unimq: ready":
            return Server(proc, ports, stderr)


def stop_unimq(server: Server) -> int:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
    try:
        return server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(timeout=10)
        raise


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_unimq(tmp_path_factory.mktemp("amqp-data"), tmp_path_factory.mktemp("amqp-log"))
    yield s
    code = stop_unimq(s)
    assert code == 0, s.stderr.read_text()
    err = s.stderr.read_text()
    assert "Traceback" not in err, err


def params(server: Server, **kw: object) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", server.amqp_port, **kw)  # type: ignore[arg-type]


@pytest.fixture
def conn(server: Server) -> Iterator[pika.BlockingConnection]:
    c = pika.BlockingConnection(params(server))
    yield c
    if c.is_open:
        c.close()


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def consume_n(ch: pika.adapters.blocking_connection.BlockingChannel, q: str, n: int, ack: bool = True,
              timeout: float = 10.0) -> list[tuple[object, object, bytes]]:
    out = []
    for method, props, body in ch.consume(q, inactivity_timeout=timeout):
        if method is None:
            break
        out.append((method, props, body))
        if ack:
            ch.basic_ack(method.delivery_tag)
        if len(out) == n:
            break
    ch.cancel()
    return out


# ----------------------------------------------------------------------------- the six tutorials (pika)


def test_hello_world(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("hello")
    ch.queue_declare(queue=q)
    ch.basic_publish(exchange="", routing_key=q, body=b"Hello World!")
    got = consume_n(ch, q, 1)
    assert [b for _, _, b in got] == [b"Hello World!"]
    assert got[0][0].routing_key == q and got[0][0].exchange == ""
    assert got[0][0].redelivered is False


def test_work_queues_prefetch_one_fair_dispatch(server: Server) -> None:
    """Tutorial 2: durable queue, persistent messages, prefetch 1, two workers share the load fairly."""
    q = uniq("task_queue")
    pub = pika.BlockingConnection(params(server))
    pch = pub.channel()
    pch.queue_declare(queue=q, durable=True)
    for i in range(10):
        pch.basic_publish("", q, f"task {i}".encode(), pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent))
    pub.close()

    received: dict[str, list[bytes]] = {"a": [], "b": []}
    held: dict[str, int] = {"a": 0, "b": 0}
    max_held: dict[str, int] = {"a": 0, "b": 0}
    lock = threading.Lock()
    done = threading.Event()

    def worker(name: str, delay: float) -> None:
        c = pika.BlockingConnection(params(server))
        ch = c.channel()
        ch.queue_declare(queue=q, durable=True)
        ch.basic_qos(prefetch_count=1)

        def cb(ch_, method, props, body):  # type: ignore[no-untyped-def]
            with lock:
                held[name] += 1
                max_held[name] = max(max_held[name], held[name])
                received[name].append(body)
            time.sleep(delay)
            with lock:
                held[name] -= 1
            ch_.basic_ack(delivery_tag=method.delivery_tag)
            with lock:
                if len(received["a"]) + len(received["b"]) >= 10:
                    done.set()

        ch.basic_consume(queue=q, on_message_callback=cb)
        while not done.is_set():
            c.process_data_events(time_limit=0.1)
        c.close()

    ta = threading.Thread(target=worker, args=("a", 0.0))
    tb = threading.Thread(target=worker, args=("b", 0.3))
    ta.start()
    tb.start()
    ta.join(30)
    tb.join(30)
    assert done.is_set()
    allm = sorted(received["a"] + received["b"])
    assert allm == sorted(f"task {i}".encode() for i in range(10))  # each exactly once
    assert max_held == {"a": 1, "b": 1}  # prefetch 1: never two unacked at once
    assert len(received["a"]) > len(received["b"])  # the fast worker took more (fair dispatch)


def test_publish_subscribe_fanout_exclusive_server_named(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ex = uniq("logs")
    ch.exchange_declare(exchange=ex, exchange_type="fanout")
    qs = []
    for _ in range(2):
        r = ch.queue_declare(queue="", exclusive=True)
        assert r.method.queue.startswith("amq.gen-")
        ch.queue_bind(exchange=ex, queue=r.method.queue)
        qs.append(r.method.queue)
    ch.basic_publish(exchange=ex, routing_key="", body=b"info: hello")
    for q in qs:
        assert [b for _, _, b in consume_n(ch, q, 1)] == [b"info: hello"]
    # exclusive queues: another connection may not use them
    other = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", conn._impl.params.port))
    och = other.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        och.basic_consume(qs[0], lambda *a: None)
    assert ei.value.reply_code == 405
    other.close()
    # and they go away with their connection
    conn.close()
    c2 = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", conn._impl.params.port))
    ch2 = c2.channel()
    deadline = time.monotonic() + 5
    while True:
        try:
            ch2.queue_declare(qs[0], passive=True)
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 404
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    c2.close()


def test_routing_direct(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ex = uniq("direct_logs")
    ch.exchange_declare(exchange=ex, exchange_type="direct")
    errors = ch.queue_declare("", exclusive=True).method.queue
    everything = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(errors, ex, routing_key="error")
    for sev in ("info", "warning", "error"):
        ch.queue_bind(everything, ex, routing_key=sev)
    for sev in ("info", "warning", "error", "debug"):
        ch.basic_publish(ex, sev, f"{sev} msg".encode())
    assert [b for _, _, b in consume_n(ch, errors, 1)] == [b"error msg"]
    got = consume_n(ch, everything, 3)
    assert sorted(b for _, _, b in got) == [b"error msg", b"info msg", b"warning msg"]
    assert {m.routing_key for m, _, _ in got} == {"info", "warning", "error"}
    assert ch.queue_declare(errors, passive=True).method.message_count == 0


def test_topics(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ex = uniq("topic_logs")
    ch.exchange_declare(exchange=ex, exchange_type="topic")
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q1, ex, "*.orange.*")
    ch.queue_bind(q2, ex, "*.*.rabbit")
    ch.queue_bind(q2, ex, "lazy.#")
    keys = ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox", "lazy.brown.fox",
            "lazy.pink.rabbit", "quick.brown.fox", "orange", "quick.orange.male.rabbit", "lazy.orange.male.rabbit",
            "lazy"]
    for k in keys:
        ch.basic_publish(ex, k, k.encode())
    assert sorted(b.decode() for _, _, b in consume_n(ch, q1, 3)) == sorted(
        ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox"])
    assert sorted(b.decode() for _, _, b in consume_n(ch, q2, 6)) == sorted(
        ["quick.orange.rabbit", "lazy.orange.elephant", "lazy.brown.fox", "lazy.pink.rabbit",
         "lazy.orange.male.rabbit", "lazy"])


def test_rpc_reply_to_correlation_id(server: Server) -> None:
    rpc_queue = uniq("rpc_queue")
    ready = threading.Event()
    stop = threading.Event()

    def fib(n: int) -> int:
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    def rpc_server() -> None:
        c = pika.BlockingConnection(params(server))
        ch = c.channel()
        ch.queue_declare(queue=rpc_queue)
        ch.basic_qos(prefetch_count=1)

        def on_request(ch_, method, props, body):  # type: ignore[no-untyped-def]
            response = fib(int(body))
            ch_.basic_publish(exchange="", routing_key=props.reply_to,
                              properties=pika.BasicProperties(correlation_id=props.correlation_id),
                              body=str(response).encode())
            ch_.basic_ack(delivery_tag=method.delivery_tag)

        ch.basic_consume(queue=rpc_queue, on_message_callback=on_request)
        ready.set()
        while not stop.is_set():
            c.process_data_events(time_limit=0.1)
        c.close()

    t = threading.Thread(target=rpc_server)
    t.start()
    assert ready.wait(10)
    try:
        c = pika.BlockingConnection(params(server))
        ch = c.channel()
        callback_queue = ch.queue_declare(queue="", exclusive=True).method.queue
        responses: dict[str, bytes] = {}

        def on_response(ch_, method, props, body):  # type: ignore[no-untyped-def]
            responses[props.correlation_id] = body

        ch.basic_consume(queue=callback_queue, on_message_callback=on_response, auto_ack=True)
        for n in (10, 20):
            corr_id = str(uuid.uuid4())
            ch.basic_publish(exchange="", routing_key=rpc_queue,
                             properties=pika.BasicProperties(reply_to=callback_queue, correlation_id=corr_id),
                             body=str(n).encode())
            deadline = time.monotonic() + 10
            while corr_id not in responses and time.monotonic() < deadline:
                c.process_data_events(time_limit=0.1)
            assert int(responses[corr_id]) == fib(n)
        c.close()
    finally:
        stop.set()
        t.join(10)


# ----------------------------------------------------------------------------- basic semantics


def test_properties_and_headers_round_trip(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("props")
    ch.queue_declare(q)
    headers = {"s": "text", "i": 42, "neg": -7, "big": 2**40, "t": True, "nested": {"k": "v", "n": 1},
               "arr": [1, "two", False], "none": None}
    props = pika.BasicProperties(content_type="application/json", content_encoding="utf-8", headers=headers,
                                 delivery_mode=2, priority=5, correlation_id="corr", reply_to="rq",
                                 expiration="60000", message_id="mid-1", timestamp=1700000000, type="kind",
                                 user_id="guest", app_id="app", cluster_id="")
    ch.basic_publish("", q, b'{"x": 1}', props)
    m, p, body = consume_n(ch, q, 1)[0]
    assert body == b'{"x": 1}'
    for attr in ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                 "expiration", "message_id", "timestamp", "type", "user_id", "app_id"):
        assert getattr(p, attr) == getattr(props, attr), attr
    assert p.headers == headers


def test_large_message_split_over_frames(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("large")
    ch.queue_declare(q)
    body = os.urandom(1_000_000)
    ch.basic_publish("", q, body)
    assert consume_n(ch, q, 1)[0][2] == body


def test_publisher_confirms(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    q = uniq("confirms")
    ch.queue_declare(q, durable=True)
    for i in range(50):
        ch.basic_publish("", q, str(i).encode(), pika.BasicProperties(delivery_mode=2))  # raises unless acked
    assert ch.queue_declare(q, passive=True).method.message_count == 50
    # mandatory + unroutable: returned, then confirmed
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", uniq("nowhere"), b"x", mandatory=True)


def test_basic_get_and_get_empty(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("get")
    ch.queue_declare(q)
    assert ch.basic_get(q) == (None, None, None)
    for i in range(3):
        ch.basic_publish("", q, f"m{i}".encode())
    m, _p, body = ch.basic_get(q)
    assert body == b"m0" and m.message_count == 2
    ch.basic_ack(m.delivery_tag)
    m, _p, body = ch.basic_get(q, auto_ack=True)
    assert body == b"m1" and m.message_count == 1
    assert ch.queue_declare(q, passive=True).method.message_count == 1


def test_mandatory_return(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda c, method, props, body: returned.append((method.reply_code, method.routing_key,
                                                                             body)))
    ex = uniq("mand")
    ch.exchange_declare(ex, "direct")
    ch.basic_publish(ex, "no-binding", b"lost", mandatory=True)
    ch.basic_publish(ex, "no-binding", b"dropped quietly")  # not mandatory: no return
    deadline = time.monotonic() + 5
    while not returned and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    conn.process_data_events(time_limit=0.3)
    assert returned == [(312, "no-binding", b"lost")]


def test_reject_and_nack_with_and_without_requeue(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("rej")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    m, _, body = ch.basic_get(q)
    assert body == b"a" and not m.redelivered
    ch.basic_reject(m.delivery_tag, requeue=True)
    got: dict[bytes, object] = {}
    deadline = time.monotonic() + 5
    while len(got) < 2:
        assert time.monotonic() < deadline
        m, _, body = ch.basic_get(q)
        if m is None:
            time.sleep(0.05)
            continue
        got[body] = m
    assert got[b"a"].redelivered and not got[b"b"].redelivered
    # nack multiple with requeue: both come back
    ch.basic_nack(max(g.delivery_tag for g in got.values()), multiple=True, requeue=True)
    again: dict[bytes, object] = {}
    deadline = time.monotonic() + 5
    while len(again) < 2:
        assert time.monotonic() < deadline
        m, _, body = ch.basic_get(q)
        if m is None:
            time.sleep(0.05)
            continue
        again[body] = m
    # without requeue (and no DLX): gone
    ch.basic_nack(again[b"a"].delivery_tag, requeue=False)
    ch.basic_reject(again[b"b"].delivery_tag, requeue=False)
    assert ch.basic_get(q) == (None, None, None)
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_redelivered_flag_after_requeue(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("redeliver")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"x")
    m, _, _ = ch.basic_get(q)
    assert m.redelivered is False
    ch.basic_nack(m.delivery_tag, requeue=True)
    deadline = time.monotonic() + 5
    while True:
        m, _, body = ch.basic_get(q)
        if m is not None:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert body == b"x" and m.redelivered is True
    ch.basic_ack(m.delivery_tag)


@pytest.mark.parametrize("durable", [False, True])
def test_requeued_message_keeps_its_position(conn: pika.BlockingConnection, durable: bool) -> None:
    """Like RabbitMQ: a requeued message goes back where it was, ahead of newer ones."""
    ch = conn.channel()
    q = uniq("order")
    ch.queue_declare(q, durable=durable)
    for i in range(5):
        ch.basic_publish("", q, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2 if durable else 1))
    held = [ch.basic_get(q) for _ in range(3)]
    assert [b for _, _, b in held] == [b"m0", b"m1", b"m2"]
    ch.basic_nack(held[1][0].delivery_tag, requeue=True)  # m1 first, then m0: order is by position
    ch.basic_reject(held[0][0].delivery_tag, requeue=True)
    ch.basic_publish("", q, b"m5")
    got = []
    deadline = time.monotonic() + 5
    while len(got) < 5:
        assert time.monotonic() < deadline
        m, _, body = ch.basic_get(q, auto_ack=True)
        if m is None:
            time.sleep(0.05)
            continue
        got.append((body, m.redelivered))
    assert got == [(b"m0", True), (b"m1", True), (b"m3", False), (b"m4", False), (b"m5", False)]
    ch.basic_ack(held[2][0].delivery_tag)
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_priority_queue_delivers_highest_first(conn: pika.BlockingConnection) -> None:
    """x-max-priority: higher priorities first, FIFO within one; above the maximum counts as it."""
    ch = conn.channel()
    q = uniq("prio")
    ch.queue_declare(q, arguments={"x-max-priority": 5})
    for body, prio in ((b"low", 1), (b"mid-a", 3), (b"none", None), (b"top", 9), (b"mid-b", 3), (b"max", 5)):
        ch.basic_publish("", q, body, pika.BasicProperties(priority=prio))
    m, _, first = ch.basic_get(q)
    assert first == b"top"
    ch.basic_nack(m.delivery_tag, requeue=True)  # back to the front of its level
    got = []
    while True:
        m, props, body = ch.basic_get(q, auto_ack=True)
        if m is None:
            break
        got.append(body)
    assert got == [b"top", b"max", b"mid-a", b"mid-b", b"low", b"none"]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        conn.channel().queue_declare(uniq("prio-bad"), arguments={"x-max-priority": 256})
    assert ei.value.reply_code == 406


def test_unacked_requeued_when_channel_closes(server: Server) -> None:
    c = pika.BlockingConnection(params(server))
    ch = c.channel()
    q = uniq("unacked")
    ch.queue_declare(q)
    for i in range(3):
        ch.basic_publish("", q, f"m{i}".encode())
    got = consume_n(ch, q, 3, ack=False)
    assert len(got) == 3
    c.close()  # nothing acked: all three come back
    c2 = pika.BlockingConnection(params(server))
    ch2 = c2.channel()
    again = consume_n(ch2, q, 3)
    assert sorted(b for _, _, b in again) == [b"m0", b"m1", b"m2"]
    assert all(m.redelivered for m, _, _ in again)
    c2.close()


def test_multiple_ack_and_recover(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("multi")
    ch.queue_declare(q)
    for i in range(5):
        ch.basic_publish("", q, f"m{i}".encode())
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(5)]
    ch.basic_ack(tags[2], multiple=True)  # acks 3
    ch.basic_recover(requeue=True)  # the other 2 come back
    deadline = time.monotonic() + 5
    seen = []
    while len(seen) < 2 and time.monotonic() < deadline:
        m, _, body = ch.basic_get(q, auto_ack=True)
        if m is None:
            time.sleep(0.05)
            continue
        seen.append(body)
    assert sorted(seen) == [b"m3", b"m4"]


def test_qos_prefetch_limits_unacked(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("qos")
    ch.queue_declare(q)
    for i in range(10):
        ch.basic_publish("", q, b"x")
    ch.basic_qos(prefetch_count=3)
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(m.delivery_tag))
    conn.process_data_events(time_limit=1.0)
    assert len(got) == 3  # window full, nothing more until an ack
    ch.basic_ack(got[-1], multiple=True)
    conn.process_data_events(time_limit=1.0)
    assert len(got) == 6


def test_qos_global_shared_by_consumers(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q1, q2 = uniq("g1"), uniq("g2")
    for q in (q1, q2):
        ch.queue_declare(q)
        for _ in range(5):
            ch.basic_publish("", q, b"x")
    ch.basic_qos(prefetch_count=4, global_qos=True)
    got = []
    ch.basic_consume(q1, lambda c, m, p, b: got.append(m.delivery_tag))
    ch.basic_consume(q2, lambda c, m, p, b: got.append(m.delivery_tag))
    conn.process_data_events(time_limit=1.0)
    assert len(got) == 4


def test_unknown_delivery_tag_closes_channel_406(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ch.basic_ack(999)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare(uniq("x"))
    assert ei.value.reply_code == 406
    assert conn.is_open
    assert conn.channel().is_open


def test_channel_errors_404_403_406(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare(uniq("missing"), passive=True)
    assert ei.value.reply_code == 404
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.exchange_declare("amq.custom", "direct")
    assert ei.value.reply_code == 403
    ch = conn.channel()
    q = uniq("ineq")
    ch.queue_declare(q, durable=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare(q, durable=False)
    assert ei.value.reply_code == 406
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.basic_publish(uniq("no-such-exchange"), "k", b"x")
        ch.queue_declare(uniq("after"))
    assert ei.value.reply_code == 404
    ch = conn.channel()
    ex = uniq("ineq-ex")
    ch.exchange_declare(ex, "direct")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.exchange_declare(ex, "fanout")
    assert ei.value.reply_code == 406
    assert conn.is_open


def test_unknown_exchange_type_closes_connection_503(server: Server) -> None:
    c = pika.BlockingConnection(params(server))
    ch = c.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as ei:
        ch.exchange_declare(uniq("x"), "x-nonsense")
    assert ei.value.reply_code == 503


def test_queue_purge_and_delete_if_empty_if_unused(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("purge")
    ch.queue_declare(q)
    for _ in range(5):
        ch.basic_publish("", q, b"x")
    assert ch.queue_purge(q).method.message_count == 5
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.basic_publish("", q, b"y")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_delete(q, if_empty=True)
    assert ei.value.reply_code == 406
    ch = conn.channel()
    ch.basic_consume(q, lambda *a: None)
    ch2 = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch2.queue_delete(q, if_unused=True)
    assert ei.value.reply_code == 406
    ch3 = conn.channel()
    assert ch3.queue_delete(q).method.message_count == 0  # the one message went to the consumer


def test_consumer_cancelled_when_queue_deleted(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("cancel")
    ch.queue_declare(q)
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda *a: None)
    other = conn.channel()
    other.queue_delete(q)
    deadline = time.monotonic() + 5
    while not cancelled and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert cancelled == [tag]


def test_exclusive_consumer_and_duplicate_tag(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("excl")
    ch.queue_declare(q)
    ch.basic_consume(q, lambda *a: None, exclusive=True)
    ch2 = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch2.basic_consume(q, lambda *a: None)
    assert ei.value.reply_code == 403


def test_auto_delete_queue_goes_with_last_consumer(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("autodel")
    ch.queue_declare(q, auto_delete=True)
    tag = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(tag)
    deadline = time.monotonic() + 5
    while True:
        c2 = conn.channel()
        try:
            c2.queue_declare(q, passive=True)
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 404
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)


# ----------------------------------------------------------------------------- DLX, TTL, max-length, headers, e2e


def _wait_get(ch, q: str, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m, p, b = ch.basic_get(q, auto_ack=True)
        if m is not None:
            return m, p, b
        time.sleep(0.05)
    raise AssertionError(f"nothing arrived in {q}")


def test_dead_letter_on_reject_with_x_death(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    dlx, dlq, q = uniq("dlx"), uniq("dlq"), uniq("work")
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx)
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": dlx})
    ch.basic_publish("", q, b"poison", pika.BasicProperties(headers={"orig": "yes"}))
    m, _, _ = ch.basic_get(q)
    ch.basic_reject(m.delivery_tag, requeue=False)
    m, p, body = _wait_get(ch, dlq)
    assert body == b"poison"
    assert p.headers["orig"] == "yes"
    death = p.headers["x-death"][0]
    assert death["reason"] == "rejected" and death["queue"] == q and death["count"] == 1
    assert death["routing-keys"] == [q] and death["exchange"] == ""
    assert p.headers["x-first-death-reason"] == "rejected"
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_queue_ttl_expires_into_dlx_with_routing_key(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    dlx, dlq, q = uniq("ttl-dlx"), uniq("ttl-dlq"), uniq("ttl")
    ch.exchange_declare(dlx, "direct")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx, routing_key="expired")
    ch.queue_declare(q, arguments={"x-message-ttl": 200, "x-dead-letter-exchange": dlx,
                                   "x-dead-letter-routing-key": "expired"})
    ch.basic_publish("", q, b"old")
    m, p, body = _wait_get(ch, dlq)
    assert body == b"old" and m.routing_key == "expired"
    assert p.headers["x-death"][0]["reason"] == "expired"
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_per_message_expiration(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("msg-ttl")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="100"))
    ch.basic_publish("", q, b"long", pika.BasicProperties(expiration="600000"))
    time.sleep(0.4)
    m, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"long"
    assert ch.basic_get(q) == (None, None, None)


def _deleted_soon(conn: pika.BlockingConnection, q: str, within_s: float = 20.0) -> bool:
    """Whether ``q`` is deleted within ``within_s``; looks every 0.5 s (a passive declare is a
    use that restarts x-expires, so it must come less often than the queue's x-expires)."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        time.sleep(0.5)
        ch = conn.channel()
        try:
            ch.queue_declare(q, passive=True)
        except pika.exceptions.ChannelClosedByBroker as e:
            return e.reply_code == 404
        ch.close()
    return False


def test_x_expires_deletes_an_unused_queue_and_a_consumed_one_once_its_consumer_left(
    conn: pika.BlockingConnection,
) -> None:
    ch = conn.channel()
    idle, used = uniq("expires-idle"), uniq("expires-used")
    ch.queue_declare(idle, arguments={"x-expires": 200})
    ch.queue_declare(used, arguments={"x-expires": 200})
    tag = ch.basic_consume(used, lambda *_: None)
    assert _deleted_soon(conn, idle)
    assert conn.channel().queue_declare(used, passive=True).method.consumer_count == 1  # in use: kept
    ch.basic_cancel(tag)
    assert _deleted_soon(conn, used)


def test_max_length_drop_head_dead_letters(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    dlq = uniq("maxlen-dlq")
    q = uniq("maxlen")
    ch.queue_declare(dlq)
    ch.queue_declare(q, arguments={"x-max-length": 2, "x-dead-letter-exchange": "",
                                   "x-dead-letter-routing-key": dlq})
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", q, f"m{i}".encode())
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    assert [ch.basic_get(q, auto_ack=True)[2] for _ in range(2)] == [b"m3", b"m4"]
    dead = [ch.basic_get(dlq, auto_ack=True) for _ in range(3)]
    assert [b for _, _, b in dead] == [b"m0", b"m1", b"m2"]
    assert all(p.headers["x-death"][0]["reason"] == "maxlen" for _, p, _ in dead)


def test_max_length_reject_publish_nacks(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("reject-pub")
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"1")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"2")
    assert ch.queue_declare(q, passive=True).method.message_count == 1


def test_headers_exchange_all_and_any(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ex = uniq("hdrs")
    ch.exchange_declare(ex, "headers")
    q_all = ch.queue_declare("", exclusive=True).method.queue
    q_any = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q_all, ex, arguments={"x-match": "all", "format": "pdf", "type": "report"})
    ch.queue_bind(q_any, ex, arguments={"x-match": "any", "format": "pdf", "type": "log"})
    ch.basic_publish(ex, "", b"1", pika.BasicProperties(headers={"format": "pdf", "type": "report"}))
    ch.basic_publish(ex, "", b"2", pika.BasicProperties(headers={"format": "zip", "type": "log"}))
    ch.basic_publish(ex, "", b"3", pika.BasicProperties(headers={"format": "zip", "type": "report"}))
    assert sorted(b for _, _, b in consume_n(ch, q_all, 1)) == [b"1"]
    assert sorted(b for _, _, b in consume_n(ch, q_any, 2)) == [b"1", b"2"]


def test_exchange_to_exchange_binding(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    src, dst = uniq("e2e-src"), uniq("e2e-dst")
    ch.exchange_declare(src, "topic")
    ch.exchange_declare(dst, "fanout")
    ch.exchange_bind(destination=dst, source=src, routing_key="orders.*")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, dst)
    ch.basic_publish(src, "orders.new", b"yes")
    ch.basic_publish(src, "users.new", b"no")
    assert [b for _, _, b in consume_n(ch, q, 1)] == [b"yes"]
    ch.exchange_unbind(destination=dst, source=src, routing_key="orders.*")
    ch.basic_publish(src, "orders.new", b"after unbind")
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_alternate_exchange(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    ae, ex = uniq("ae"), uniq("with-ae")
    ch.exchange_declare(ae, "fanout")
    ch.exchange_declare(ex, "direct", arguments={"alternate-exchange": ae})
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, ae)
    ch.basic_publish(ex, "unroutable", b"via ae")
    assert [b for _, _, b in consume_n(ch, q, 1)] == [b"via ae"]


def test_tx_commit_and_rollback(conn: pika.BlockingConnection) -> None:
    ch = conn.channel()
    q = uniq("tx")
    ch.queue_declare(q)
    ch.tx_select()
    ch.basic_publish("", q, b"rolled back")
    ch.tx_rollback()
    ch.basic_publish("", q, b"committed")
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.tx_commit()
    assert ch.queue_declare(q, passive=True).method.message_count == 1
    m, _, body = ch.basic_get(q)
    assert body == b"committed"
    ch.basic_ack(m.delivery_tag)
    ch.tx_rollback()  # the ack is rolled back: still unacked
    ch.basic_ack(m.delivery_tag)
    ch.tx_commit()
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_amq_topic_is_the_mqtt_stream(server: Server, conn: pika.BlockingConnection) -> None:
    """amq.topic a.b.c is stored in unified topic `a` with mqtt_topic a/b/c (readable over HTTP/gRPC)."""
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    root = uniq("sensors")
    ch.queue_bind(q, "amq.topic", f"{root}.#")
    ch.basic_publish("amq.topic", f"{root}.room1.temp", b"21.5",
                     pika.BasicProperties(headers={"unit": "C"}, message_id="mid-42"))
    assert [b for _, _, b in consume_n(ch, q, 1)] == [b"21.5"]
    # the same stored message, read over the HTTP door by a consumer group of the unified topic `root`,
    # with a SQL92 filter on an AMQP header
    import json
    import urllib.parse
    import urllib.request

    sql = urllib.parse.quote("unit = 'C'")
    url = f"http://127.0.0.1:{server.ports['http']}/v1/topics/{root}/groups/http-reader/pop?max=10&wait_s=2&sql={sql}"
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10) as r:
        msgs = json.loads(r.read())["messages"]
    assert len(msgs) == 1
    m = msgs[0]
    assert m["topic"] == root and m["protocol"] == "amqp" and m["keys"] == ["mid-42"]
    assert m["properties"]["mqtt_topic"] == f"{root}/room1/temp"
    assert m["properties"]["amqp_exchange"] == "amq.topic"
    assert m["tag"] == f"{root}.room1.temp"  # the routing key
    assert m["properties"]["unit"] == "C" and m["properties"]["amqp_message_id"] == "mid-42"


# ----------------------------------------------------------------------------- aio-pika


def test_aio_pika_tutorials(server: Server) -> None:
    async def main() -> None:
        url = f"amqp://guest:guest@127.0.0.1:{server.amqp_port}/"
        connection = await aio_pika.connect_robust(url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            await channel.set_qos(prefetch_count=10)
            # hello world
            q = await channel.declare_queue(uniq("aio-hello"), auto_delete=True)
            await channel.default_exchange.publish(aio_pika.Message(body=b"Hello"), routing_key=q.name)
            msg = await q.get(timeout=5)
            assert msg.body == b"Hello"
            await msg.ack()
            # topic routing with an iterator consumer and headers
            ex = await channel.declare_exchange(uniq("aio-topic"), aio_pika.ExchangeType.TOPIC)
            tq = await channel.declare_queue(exclusive=True)
            await tq.bind(ex, routing_key="kern.*")
            for key in ("kern.critical", "user.info", "kern.info"):
                await ex.publish(aio_pika.Message(body=key.encode(), headers={"k": key},
                                                  delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=key)
            got = []
            async with tq.iterator() as it:
                async for message in it:
                    async with message.process():
                        got.append((message.body, message.headers["k"], message.routing_key))
                    if len(got) == 2:
                        break
            assert sorted(got) == [(b"kern.critical", "kern.critical", "kern.critical"),
                                   (b"kern.info", "kern.info", "kern.info")]
            # RPC pattern with reply_to / correlation_id
            rpc = await channel.declare_queue(uniq("aio-rpc"), auto_delete=True)

            async def on_call(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                async with message.process():
                    await channel.default_exchange.publish(
                        aio_pika.Message(body=message.body[::-1], correlation_id=message.correlation_id),
                        routing_key=message.reply_to)

            await rpc.consume(on_call)
            callback = await channel.declare_queue(exclusive=True)
            fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

            async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                if message.correlation_id == "c-1" and not fut.done():
                    fut.set_result(message.body)
                await message.ack()

            await callback.consume(on_reply)
            await channel.default_exchange.publish(
                aio_pika.Message(body=b"abc", reply_to=callback.name, correlation_id="c-1"), routing_key=rpc.name)
            assert await asyncio.wait_for(fut, 10) == b"cba"
            # reject without requeue goes to the DLX
            dlx = await channel.declare_exchange(uniq("aio-dlx"), aio_pika.ExchangeType.FANOUT)
            dlq = await channel.declare_queue(exclusive=True)
            await dlq.bind(dlx)
            wq = await channel.declare_queue(uniq("aio-work"), auto_delete=True,
                                             arguments={"x-dead-letter-exchange": dlx.name})
            await channel.default_exchange.publish(aio_pika.Message(body=b"bad"), routing_key=wq.name)
            m = await wq.get(timeout=5)
            await m.reject(requeue=False)
            for _ in range(100):
                dm = await dlq.get(fail=False)
                if dm is not None:
                    break
                await asyncio.sleep(0.05)
            assert dm is not None and dm.body == b"bad"
            assert dm.headers["x-death"][0]["reason"] == "rejected"
            await dm.ack()

    asyncio.run(asyncio.wait_for(main(), 40))


# ----------------------------------------------------------------------------- handshake and bad input (raw sockets)


def _raw_connect(port: int, vhost: str = "/", user: str = "guest", password: str = "guest",
                 frame_max: int = 131072) -> socket.socket:
    """A hand-driven client: pamqp frames for the handshake, then the test writes raw bytes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(pheader.ProtocolHeader().marshal())
    _read_method(s)  # Start
    s.sendall(pframe.marshal(C.Connection.StartOk(client_properties={"capabilities": {}}, mechanism="PLAIN",
                                                  response=f"\0{user}\0{password}", locale="en_US"), 0))
    tune = _read_method(s)
    assert isinstance(tune, C.Connection.Tune), tune
    s.sendall(pframe.marshal(C.Connection.TuneOk(channel_max=tune.channel_max, frame_max=frame_max, heartbeat=0), 0))
    s.sendall(pframe.marshal(C.Connection.Open(virtual_host=vhost), 0))
    assert isinstance(_read_method(s), C.Connection.OpenOk)
    return s


def _read_frames(s: socket.socket, want: int = 1, timeout: float = 5.0) -> list[tuple[int, object]]:
    buf = b""
    out: list[tuple[int, object]] = []
    s.settimeout(timeout)
    while len(out) < want:
        while True:
            if len(buf) >= 7:
                size = struct.unpack(">I", buf[3:7])[0]
                if len(buf) >= size + 8:
                    break
            chunk = s.recv(65536)
            if not chunk:
                return out
            buf += chunk
        n, ch, f = pframe.unmarshal(buf)
        buf = buf[n:]
        if not isinstance(f, pframe.heartbeat.Heartbeat):
            out.append((ch, f))
    return out


def _read_method(s: socket.socket) -> object:
    return _read_frames(s, 1)[0][1]


def _expect_connection_close(s: socket.socket, code: int) -> None:
    f = _read_method(s)
    assert isinstance(f, C.Connection.Close), f
    assert f.reply_code == code, (f.reply_code, f.reply_text)
    s.sendall(pframe.marshal(C.Connection.CloseOk(), 0))
    s.settimeout(5)
    try:
        while s.recv(65536):
            pass
    except (ConnectionResetError, socket.timeout):
        pass
    s.close()


def _still_serving(server: Server) -> None:
    c = pika.BlockingConnection(params(server))
    ch = c.channel()
    q = uniq("alive")
    ch.queue_declare(q, exclusive=True)
    ch.basic_publish("", q, b"ok")
    assert ch.basic_get(q, auto_ack=True)[2] == b"ok"
    c.close()


def test_bad_login_refused_403(server: Server) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(params(server, credentials=pika.PlainCredentials("guest", "wrong")))
    _still_serving(server)


def test_amqplain_login(server: Server) -> None:
    s = socket.create_connection(("127.0.0.1", server.amqp_port), timeout=5)
    s.sendall(pheader.ProtocolHeader().marshal())
    start = _read_method(s)
    assert "AMQPLAIN" in start.mechanisms
    table = {"LOGIN": "guest", "PASSWORD": "guest"}
    from pamqp import encode

    resp = encode.field_table(table)[4:]
    s.sendall(pframe.marshal(C.Connection.StartOk(client_properties={}, mechanism="AMQPLAIN",
                                                  response=resp.decode("latin-1")), 0))
    # pamqp re-encodes the str as UTF-8; the table above is ASCII, so the bytes are the same
    assert isinstance(_read_method(s), C.Connection.Tune)
    s.close()


def test_unknown_vhost_530(server: Server) -> None:
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as ei:
        pika.BlockingConnection(params(server, virtual_host="nope"))
    assert "530" in str(ei.value)


def test_wrong_protocol_header_gets_ours_back(server: Server) -> None:
    s = socket.create_connection(("127.0.0.1", server.amqp_port), timeout=5)
    s.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert s.recv(8) == b"AMQP\x00\x00\x09\x01"
    s.close()
    _still_serving(server)


def test_bad_frame_end_byte_501(server: Server) -> None:
    s = _raw_connect(server.amqp_port)
    data = bytearray(pframe.marshal(C.Channel.Open(), 1))
    data[-1] = 0x00
    s.sendall(bytes(data))
    _expect_connection_close(s, 501)
    _still_serving(server)


def test_unknown_class_method_540(server: Server) -> None:
    s = _raw_connect(server.amqp_port)
    payload = struct.pack(">HH", 99, 99)
    s.sendall(struct.pack(">BHI", 1, 0, len(payload)) + payload + b"\xce")
    _expect_connection_close(s, 540)
    _still_serving(server)


def test_frame_over_frame_max_501(server: Server) -> None:
    s = _raw_connect(server.amqp_port, frame_max=4096)
    s.sendall(pframe.marshal(C.Channel.Open(), 1))
    assert isinstance(_read_method(s), C.Channel.OpenOk)
    body = b"x" * 5000
    s.sendall(pframe.marshal(C.Basic.Publish(exchange="", routing_key="q"), 1)
              + pframe.marshal(pheader.ContentHeader(0, len(body), C.Basic.Properties()), 1)
              + struct.pack(">BHI", 3, 1, len(body)) + body + b"\xce")
    _expect_connection_close(s, 501)
    _still_serving(server)


def test_method_on_closed_channel_504(server: Server) -> None:
    s = _raw_connect(server.amqp_port)
    s.sendall(pframe.marshal(C.Queue.Declare(queue="q-on-closed"), 7))
    _expect_connection_close(s, 504)
    _still_serving(server)


def test_content_without_publish_505(server: Server) -> None:
    s = _raw_connect(server.amqp_port)
    s.sendall(pframe.marshal(C.Channel.Open(), 1))
    assert isinstance(_read_method(s), C.Channel.OpenOk)
    s.sendall(struct.pack(">BHI", 3, 1, 3) + b"abc" + b"\xce")
    _expect_connection_close(s, 505)
    _still_serving(server)


def test_truncated_method_arguments_502(server: Server) -> None:
    s = _raw_connect(server.amqp_port)
    payload = struct.pack(">HH", 50, 10) + b"\x00"  # Queue.Declare cut short
    s.sendall(struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce")
    f = _read_method(s)
    assert isinstance(f, C.Connection.Close) and f.reply_code in (502, 504)
    s.close()
    _still_serving(server)


def test_abrupt_disconnects_leave_server_serving(server: Server) -> None:
    for cut in (3, 8, 20, 60):
        s = socket.create_connection(("127.0.0.1", server.amqp_port), timeout=5)
        data = pheader.ProtocolHeader().marshal() + pframe.marshal(
            C.Connection.StartOk(client_properties={}, mechanism="PLAIN", response="\0guest\0guest"), 0)
        s.sendall(data[:cut])
        s.close()
    _still_serving(server)
