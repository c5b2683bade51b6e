"""AMQP 0-9-1: the same load generator against unimq and RabbitMQ, in one run.

    python -m bench --only amqp            # both brokers, both scenarios (about 1 minute)
    python -m bench.amqp_bench [--quick]   # this section alone, printing its rows

Scenarios (each run against a fresh broker with a fresh data dir):

- **persistent**: 1 KiB persistent messages (delivery_mode 2) with publisher
  confirms to a durable queue, consumed with manual acks. unimq runs with
  ``--flush sync`` so that, as with RabbitMQ, a confirm means the message is
  on disk (group commit).
- **transient**: 100 B non-persistent messages, no confirms, to a
  non-durable queue, consumed with manual acks; unimq with ``--flush async``.

The load generator is written so it is not the bottleneck: raw sockets, the
handshake and setup with pamqp, publishes sent as prebuilt publish/header/
body frame triplets (only an 8-byte send timestamp patched into each body),
many per ``sendall``; the consumer scans frames with ``struct`` and acks
everything received in one read with one ``Basic.Ack(multiple)``. Publisher,
confirm reader and consumer are three threads of one process (socket I/O
releases the GIL); the generator's own CPU time is reported beside the
broker's. The publisher keeps at most ``CONFIRM_WINDOW`` messages
unconfirmed and at most ``INFLIGHT`` published-but-not-consumed, so latency
(publish to delivery, same clock) measures the brokers, not a backlog.

RabbitMQ (Debian's ``rabbitmq-server``) is started as a child process of
this bench on 127.0.0.1 with ephemeral AMQP and distribution ports, its own
``epmd`` on an ephemeral port, and its files in the run's scratch dir; both
are stopped by PID. If it is not installed the rows say so.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pamqp import commands as C
from pamqp import frame as pframe
from pamqp import header as pheader

try:
    from . import Context, Row
    from .procs import UnimqChild, free_port, group_cpu_seconds, stop_group
except ImportError:  # run as a script
    from bench import Context, Row  # type: ignore[no-redef]
    from bench.procs import UnimqChild, free_port, group_cpu_seconds, stop_group  # type: ignore[no-redef]

NAME = "amqp"
TITLE = "AMQP 0-9-1 door vs RabbitMQ"

REPO = Path(__file__).resolve().parent.parent
CONFIRM_WINDOW = 1000
INFLIGHT = 4000
PREFETCH = 1000
BATCH = 50  # publishes per sendall
_FRAME = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    size: int
    persistent: bool
    confirm: bool
    durable: bool
    floor: float  # unimq / RabbitMQ throughput at least this


SCENARIOS = (
    Scenario("persistent", "persistent 1 KiB, confirms, durable queue, manual ack", 1024, True, True, True, 1.0),
    Scenario("transient", "transient 100 B, no confirms, manual ack", 100, False, False, False, 0.5),
)


@dataclass
class Result:
    publish_s: float
    consume_s: float
    p50_ms: float
    p99_ms: float
    broker_cores: float
    gen_cores: float
    published: int
    consumed: int


# ------------------------------------------------------------------------------ raw client


class RawConn:
    """A minimal blocking AMQP client: pamqp for the handshake and setup, raw bytes after."""

    def __init__(self, port: int, user: str = "guest", password: str = "guest") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sock.sendall(pheader.ProtocolHeader().marshal())
        self.expect(C.Connection.Start)
        self.send(0, C.Connection.StartOk(client_properties={"product": "unimq-bench", "capabilities": {
            "publisher_confirms": True, "basic.nack": True}}, mechanism="PLAIN", response=f"\0{user}\0{password}",
            locale="en_US"))
        tune = self.expect(C.Connection.Tune)
        self.frame_max = tune.frame_max or 131072
        self.send(0, C.Connection.TuneOk(channel_max=tune.channel_max, frame_max=self.frame_max, heartbeat=0))
        self.send(0, C.Connection.Open(virtual_host="/"))
        self.expect(C.Connection.OpenOk)
        self.send(1, C.Channel.Open())
        self.expect(C.Channel.OpenOk)

    def send(self, ch: int, m: object) -> None:
        self.sock.sendall(pframe.marshal(m, ch))

    def read_frame(self) -> object:
        while True:
            if len(self.buf) >= 7:
                size = _U32.unpack_from(self.buf, 3)[0]
                if len(self.buf) >= size + 8:
                    n, _ch, f = pframe.unmarshal(self.buf)
                    self.buf = self.buf[n:]
                    return f
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("broker closed the connection")
            self.buf += data

    def expect(self, cls: type) -> object:
        while True:
            f = self.read_frame()
            if isinstance(f, cls):
                return f
            if isinstance(f, (C.Connection.Close, C.Channel.Close)):
                raise RuntimeError(f"broker closed: {f.reply_code} {f.reply_text}")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _publish_frames(queue_name: str, sc: Scenario, frame_max: int) -> tuple[bytes, bytes]:
    """(publish + header frames, body frame prefix); the body is ts(8) + padding, then 0xCE."""
    props = C.Basic.Properties(delivery_mode=2 if sc.persistent else 1, content_type="application/octet-stream")
    head = pframe.marshal(C.Basic.Publish(exchange="", routing_key=queue_name), 1) + pframe.marshal(
        pheader.ContentHeader(0, sc.size, props), 1)
    assert sc.size + 8 <= frame_max
    return head, _FRAME.pack(3, 1, sc.size)


def measure(port: int, sc: Scenario, duration: float, broker_pids: list[int], user: str = "guest",
            password: str = "guest", queue: str = "") -> Result:
    qname = queue or f"bench-{sc.key}-{os.getpid()}"
    setup = RawConn(port, user, password)
    setup.send(1, C.Queue.Declare(queue=qname, durable=sc.durable))
    setup.expect(C.Queue.DeclareOk)
    pub = RawConn(port, user, password)
    con = RawConn(port, user, password)
    if sc.confirm:
        pub.send(1, C.Confirm.Select())
        pub.expect(C.Confirm.SelectOk)
    con.send(1, C.Basic.Qos(prefetch_count=PREFETCH))
    con.expect(C.Basic.QosOk)
    con.send(1, C.Basic.Consume(queue=qname, consumer_tag="bench"))
    con.expect(C.Basic.ConsumeOk)

    head, body_prefix = _publish_frames(qname, sc, pub.frame_max)
    pad = b"x" * (sc.size - 8) + b"\xce"
    stop = threading.Event()
    cond = threading.Condition()
    state = {"published": 0, "confirmed": 0, "consumed": 0, "nacked": 0}
    lat: list[int] = []
    record = [False]
    errors: list[BaseException] = []

    def publisher() -> None:
        try:
            sock = pub.sock
            perf = time.perf_counter_ns
            pack = _U64.pack
            while not stop.is_set():
                with cond:
                    while not stop.is_set() and (
                        state["published"] - state["consumed"] + BATCH > INFLIGHT
                        or (sc.confirm and state["published"] - state["confirmed"] + BATCH > CONFIRM_WINDOW)
                    ):
                        cond.wait(0.05)
                if stop.is_set():
                    break
                ts = pack(perf())
                one = head + body_prefix + ts + pad
                sock.sendall(one * BATCH)
                with cond:
                    state["published"] += BATCH
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            if not stop.is_set():
                errors.append(e)

    def confirm_reader() -> None:
        buf = b""
        sock = pub.sock
        sock.settimeout(0.5)
        done = 0
        try:
            while not stop.is_set():
                try:
                    data = sock.recv(262144)
                except socket.timeout:
                    continue
                if not data:
                    break
                buf += data
                pos = 0
                n = len(buf)
                while n - pos >= 8:
                    ftype, _ch, size = _FRAME.unpack_from(buf, pos)
                    if n - pos < size + 8:
                        break
                    if ftype == 1:
                        cm = _U32.unpack_from(buf, pos + 7)[0]
                        if cm in (0x003C0050, 0x003C0078):  # Basic.Ack / Basic.Nack
                            tag = _U64.unpack_from(buf, pos + 11)[0]
                            multiple = buf[pos + 19] & 1
                            if multiple:
                                done = max(done, tag)
                            else:
                                done += 1
                            if cm == 0x003C0078:
                                state["nacked"] += 1
                        elif cm in (0x000A0032, 0x00140028):
                            errors.append(RuntimeError("broker closed the publisher"))
                            return
                    pos += size + 8
                buf = buf[pos:]
                with cond:
                    state["confirmed"] = done
                    cond.notify_all()
        except BaseException as e:  # noqa: BLE001
            if not stop.is_set():
                errors.append(e)

    def consumer() -> None:
        buf = b""
        sock = con.sock
        sock.settimeout(0.5)
        perf = time.perf_counter_ns
        expect_body = False
        last_tag = 0
        acked = 0
        try:
            while not stop.is_set():
                try:
                    data = sock.recv(1 << 20)
                except socket.timeout:
                    continue
                if not data:
                    break
                now = perf()
                buf += data
                pos = 0
                n = len(buf)
                got = 0
                while n - pos >= 8:
                    ftype, _ch, size = _FRAME.unpack_from(buf, pos)
                    if n - pos < size + 8:
                        break
                    if ftype == 1:
                        cm = _U32.unpack_from(buf, pos + 7)[0]
                        if cm == 0x003C003C:  # Basic.Deliver
                            ctag_len = buf[pos + 11]
                            last_tag = _U64.unpack_from(buf, pos + 12 + ctag_len)[0]
                            expect_body = True
                        elif cm in (0x000A0032, 0x00140028):
                            errors.append(RuntimeError("broker closed the consumer"))
                            return
                    elif ftype == 3 and expect_body:
                        expect_body = False
                        got += 1
                        if record[0]:
                            lat.append(now - _U64.unpack_from(buf, pos + 7)[0])
                    pos += size + 8
                buf = buf[pos:]
                if got:
                    with cond:
                        state["consumed"] += got
                        cond.notify_all()
                if last_tag > acked:
                    sock.sendall(pframe.marshal(C.Basic.Ack(delivery_tag=last_tag, multiple=True), 1))
                    acked = last_tag
        except BaseException as e:  # noqa: BLE001
            if not stop.is_set():
                errors.append(e)

    threads = [threading.Thread(target=f, daemon=True) for f in (publisher, consumer)]
    if sc.confirm:
        threads.append(threading.Thread(target=confirm_reader, daemon=True))
    for t in threads:
        t.start()
    warm = min(1.5, duration / 4)
    time.sleep(warm)
    with cond:
        p0 = state["confirmed"] if sc.confirm else state["published"]
        c0 = state["consumed"]
    b0 = group_cpu_seconds(broker_pids)
    g0 = sum(os.times()[:2])
    t0 = time.perf_counter()
    record[0] = True
    time.sleep(duration)
    record[0] = False
    t1 = time.perf_counter()
    b1 = group_cpu_seconds(broker_pids)
    g1 = sum(os.times()[:2])
    with cond:
        p1 = state["confirmed"] if sc.confirm else state["published"]
        c1 = state["consumed"]
    stop.set()
    with cond:
        cond.notify_all()
    for t in threads:
        t.join(5)
    for c in (pub, con, setup):
        c.close()
    if errors:
        raise RuntimeError(f"load generator failed: {errors[0]!r}")
    if state["nacked"]:
        raise RuntimeError(f"{state['nacked']} publishes were nacked")
    dt = t1 - t0
    lat.sort()
    p50 = lat[len(lat) // 2] / 1e6 if lat else float("nan")
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1e6 if lat else float("nan")
    return Result((p1 - p0) / dt, (c1 - c0) / dt, p50, p99, (b1 - b0) / dt, (g1 - g0) / dt, p1 - p0, c1 - c0)


# ------------------------------------------------------------------------------ brokers


def _wait_port(port: int, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            c = RawConn(port)
            c.close()
            return
        except (OSError, RuntimeError, ConnectionError):
            time.sleep(0.3)
    raise RuntimeError(f"broker not answering on {port} after {timeout}s: {log.read_text()[-2000:]}")


class RabbitMQ:
    """Debian's rabbitmq-server as a child process (own epmd, ephemeral ports, scratch dir)."""

    SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"

    @classmethod
    def available(cls) -> bool:
        return os.path.exists(cls.SERVER) and bool(glob.glob("/usr/lib/erlang/erts-*/bin/epmd"))

    @staticmethod
    def version() -> str:
        m = glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*")
        return m[0].rsplit("-", 1)[1] if m else "?"

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.epmd_port = free_port()
        self.dist_port = free_port()
        log = base / "rabbitmq.out"
        self.log = log
        (base / "enabled_plugins").write_text("[].\n")
        epmd = sorted(glob.glob("/usr/lib/erlang/erts-*/bin/epmd"))[-1]
        self.epmd = subprocess.Popen([epmd, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        env = dict(
            os.environ,
            HOME=str(base),
            ERL_EPMD_PORT=str(self.epmd_port),
            RABBITMQ_NODENAME=f"unimqbench{os.getpid()}@localhost",
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
            RABBITMQ_LOG_BASE=str(base / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(base / "rabbitmq"),
            RABBITMQ_PID_FILE=str(base / "rabbitmq.pid"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
        )
        with log.open("w") as out:
            self.proc = subprocess.Popen([self.SERVER], env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait_port(self.port, self.proc, 90, log)
        except BaseException:
            self.stop()
            raise

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid]

    def stop(self) -> None:
        for p in (self.proc, self.epmd):
            stop_group(p, 30)  # the process group we created for this child


class Unimq(UnimqChild):
    """`unimq up` as a child process on ephemeral ports (only the AMQP port matters here)."""

    def __init__(self, base: Path, flush: str) -> None:
        super().__init__(base, "amqp", flush)


# ------------------------------------------------------------------------------ section


def _measure_broker(make, sc: Scenario, duration: float) -> Result:  # type: ignore[no-untyped-def]
    b = make()
    try:
        return measure(b.port, sc, duration, b.pids)
    finally:
        b.stop()


def run(ctx: Context) -> list[Row]:
    duration = 4.0 if ctx.quick else 10.0
    rows: list[Row] = []
    have_rabbit = RabbitMQ.available()
    rversion = RabbitMQ.version() if have_rabbit else ""
    if not have_rabbit:
        ctx.notes.append("amqp: rabbitmq-server is not installed (apt-get install rabbitmq-server); "
                         "the AMQP rows have no peer figure")
    for sc in SCENARIOS:
        print(f"bench: amqp {sc.key}: RabbitMQ...", file=sys.stderr)
        peer: Result | None = None
        if have_rabbit:
            peer = _measure_broker(lambda: RabbitMQ(ctx.scratch(f"rabbitmq-{sc.key}")), sc, duration)
        print(f"bench: amqp {sc.key}: unimq...", file=sys.stderr)
        flush = "sync" if sc.persistent else "async"
        mine = _measure_broker(lambda: Unimq(ctx.scratch(f"unimq-{sc.key}"), flush), sc, duration)
        mb = sc.size / 1e6
        for what, v, pv in (("publish", mine.publish_s, peer.publish_s if peer else None),
                            ("consume", mine.consume_s, peer.consume_s if peer else None)):
            ratio = v / pv if pv else None
            rows.append(Row(
                "amqp", f"{sc.title}: {what}/s (unimq --flush {flush})", v, v * mb,
                peer=f"RabbitMQ {rversion} {pv:,.0f} msgs/s" if pv else "—",
                ratio=f"{ratio:.2f}x" if ratio is not None else "—",
                floor=f">= {sc.floor:.1f}x RabbitMQ",
                meets=(ratio >= sc.floor) if ratio is not None else None,
            ))
        rows.append(Row(
            "amqp", f"{sc.title}: latency p50 / p99", None, None,
            peer=(f"RabbitMQ {peer.p50_ms:.1f} / {peer.p99_ms:.1f} ms" if peer else "—"),
            ratio=f"unimq {mine.p50_ms:.1f} / {mine.p99_ms:.1f} ms",
            note=(f"CPU cores used: unimq {mine.broker_cores:.2f}, load generator {mine.gen_cores:.2f}"
                  + (f"; RabbitMQ {peer.broker_cores:.2f}, load generator {peer.gen_cores:.2f}" if peer else "")
                  + f"; messages in the {duration:.0f} s window: unimq {mine.consumed:,}"
                  + (f", RabbitMQ {peer.consumed:,}" if peer else "")),
        ))
    return rows


def main() -> None:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="amqp-bench-", dir=REPO))
    try:
        ctx = Context(data_dir=base, quick=args.quick)
        for r in run(ctx):
            print(f"{r.name}: {r.msgs_s or 0:,.0f} msgs/s | peer {r.peer} | {r.ratio} | floor {r.floor} | "
                  f"meets {r.meets}" + (f" | {r.note}" if r.note else ""))
        for n in ctx.notes:
            print(n)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
