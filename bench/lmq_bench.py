"""Light message queues: the first message to each of N new QoS 1 subscriptions.

    python -m bench --only lmq             # rows for 1,000 and 10,000 (1,000 with --quick)
    python -m bench.lmq_bench [N ...]      # default 1000 10000; prints one line per N

Why: every QoS 1 subscription has its own light message queue (``%LMQ%...``);
what creating one costs shows as the time for the first message to each new
subscription (issue 21: 25 ms each when an LMQ was a full topic). ``N``
subscriptions, each on its own topic, are spread over clients of 500
subscriptions each (raw sockets, one asyncio loop); one publisher then sends
one QoS 1 message to each topic; reported: seconds from the first PUBLISH to
the last delivery, then the same for a second message to the same topics.
A fresh `unimq up` (default flush) serves each N.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

try:
    from . import Context, Row
    from .mqtt_bench import HOST, connect_pkt, publish_pkt, scan_packets, subscribe_pkt
    from .procs import UnimqChild, cpu_seconds, rss_mib, stop_group
except ImportError:  # run as a script
    from bench import Context, Row  # type: ignore[no-redef]
    from bench.mqtt_bench import HOST, connect_pkt, publish_pkt, scan_packets, subscribe_pkt  # type: ignore[no-redef]
    from bench.procs import UnimqChild, cpu_seconds, rss_mib, stop_group  # type: ignore[no-redef]

NAME = "lmq"
TITLE = "Light message queues: first message to new QoS 1 subscriptions"

PER_CLIENT = 500


class _Sub(asyncio.Protocol):
    """One connection: CONNACK, ``n`` SUBACKs, then counts (and PUBACKs) deliveries."""

    def __init__(self, cid: str, topics: list[str]) -> None:
        self.cid, self.topics = cid, topics
        self.buf = b""
        self.subacks = 0
        self.delivered = 0
        self.ready = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, t: asyncio.BaseTransport) -> None:
        self.transport = t  # type: ignore[assignment]
        out = [connect_pkt(self.cid)]
        out += [subscribe_pkt(tp, 1, i + 1) for i, tp in enumerate(self.topics)]
        t.write(b"".join(out))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        acks = []
        packets, i = scan_packets(buf)
        for b0, j, _ in packets:
            kind = b0 >> 4
            if kind == 9:
                self.subacks += 1
                if self.subacks == len(self.topics) and not self.ready.done():
                    self.ready.set_result(None)
            elif kind == 3:
                self.delivered += 1
                if b0 & 6:
                    p = j + 2 + ((buf[j] << 8) | buf[j + 1])
                    acks.append(b"\x40\x02" + buf[p : p + 2])
        self.buf = buf[i:]
        if acks:
            self.transport.write(b"".join(acks))  # type: ignore[union-attr]


class _Pub(asyncio.Protocol):
    def __init__(self, cid: str = "lmq-bench-pub") -> None:
        self.cid = cid  # one per publisher: the same id twice would take the other's session over
        self.rx = 0
        self.ready = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, t: asyncio.BaseTransport) -> None:
        self.transport = t  # type: ignore[assignment]
        t.write(connect_pkt(self.cid))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.rx += len(data)
        if not self.ready.done() and self.rx >= 4:
            self.rx -= 4
            self.ready.set_result(None)


async def first_messages(port: int, n: int, timeout: float = 600.0) -> tuple[float, float, float]:
    """(seconds to subscribe, seconds to deliver a first message to each, and a second)."""
    loop = asyncio.get_running_loop()
    topics = [f"dev/{i}/cmd" for i in range(n)]
    t0 = time.perf_counter()
    subs: list[_Sub] = []
    for k in range(0, n, PER_CLIENT):
        _, p = await loop.create_connection(lambda k=k: _Sub(f"lmq-bench-{k}", topics[k : k + PER_CLIENT]), HOST, port)
        subs.append(p)
    await asyncio.wait_for(asyncio.gather(*(s.ready for s in subs)), timeout)
    t_sub = time.perf_counter() - t0
    _, pub = await loop.create_connection(_Pub, HOST, port)
    await asyncio.wait_for(pub.ready, 30)

    async def round_(expect: int) -> float:
        t = time.perf_counter()
        for i, tp in enumerate(topics):
            pub.transport.write(publish_pkt(tp, b"x" * 16, 1, (i % 65535) + 1))  # type: ignore[union-attr]
            if i % 200 == 199:
                await asyncio.sleep(0)
        deadline = t + timeout
        while sum(s.delivered for s in subs) < expect:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{sum(s.delivered for s in subs)} of {expect} delivered")
            await asyncio.sleep(0.01)
        return time.perf_counter() - t

    first = await round_(n)
    second = await round_(2 * n)
    for s in [*subs, pub]:
        s.transport.close()  # type: ignore[union-attr]
    return t_sub, first, second


def measure(n: int, base: Path | None = None) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as d:
        child = UnimqChild(base or Path(d), "mqtt", flush="async")
        try:
            return asyncio.run(first_messages(child.port, n))
        finally:
            stop_group(child.proc)


# ------------------------------------------------------------------ the fleet: one client per device

PER_WORKER = 15_000  # connections per client process (20,000 open files at most per process)
PER_GATEWAY = 12_500  # connections per gateway on average (SO_REUSEPORT spreads them unevenly)
OUTSTANDING = 200  # CONNECTs + SUBSCRIBEs in flight per client process
RETRIES = 5  # reconnects of a device whose connection closed before its SUBACK (counted)
FIRST_TIMEOUT = float(__import__("os").environ.get("LMQ_FIRST_TIMEOUT", "300"))  # seconds a client process waits for its devices' first messages


class _Dev(asyncio.Protocol):
    """One device: CONNECT, SUBSCRIBE its own topic at QoS 1, then counts (and PUBACKs) deliveries."""

    __slots__ = ("cid", "topic", "buf", "ready", "delivered", "transport", "done")

    def __init__(self, cid: str, topic: str, ready: asyncio.Future[None], done: list[int]) -> None:
        self.topic, self.ready, self.done = topic, ready, done
        self.buf = b""
        self.delivered = 0
        self.transport: asyncio.Transport | None = None
        self.cid = cid

    def connection_made(self, t: asyncio.BaseTransport) -> None:
        self.transport = t  # type: ignore[assignment]
        t.write(connect_pkt(self.cid, clean=False) + subscribe_pkt(self.topic, 1, 1))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        packets, i = scan_packets(buf)
        for b0, j, _ in packets:
            kind = b0 >> 4
            if kind == 9 and not self.ready.done():
                self.ready.set_result(None)
            elif kind == 3:
                self.delivered += 1
                if self.delivered == 1:
                    self.done[0] += 1
                if b0 & 6:
                    p = j + 2 + ((buf[j] << 8) | buf[j + 1])
                    self.transport.write(b"\x40\x02" + buf[p : p + 2])  # type: ignore[union-attr]
        self.buf = buf[i:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"{self.cid}: closed before SUBACK"))


async def _worker_main(port: int, src: str, first: int, n: int, conn) -> None:  # type: ignore[no-untyped-def]
    """One client process: ``n`` devices from ``src``; answers the parent over ``conn``."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(OUTSTANDING)
    done = [0]
    devs: list[_Dev] = []

    retries = [0]

    async def one(i: int) -> None:
        for attempt in range(RETRIES + 1):  # as a device would: reconnect after a refused/closed CONNECT
            async with slots:
                ready = loop.create_future()
                try:
                    _, d = await loop.create_connection(lambda: _Dev(f"fleet-{i}", f"fleet/{i}/cmd", ready, done),
                                                        HOST, port, local_addr=(src, 0))
                    await ready
                    devs.append(d)
                    return
                except OSError:  # ConnectionError included
                    if attempt == RETRIES:
                        raise
                    retries[0] += 1
            await asyncio.sleep(0.5 * (attempt + 1))

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(first, first + n))), 1800)
    conn.send(("subscribed", retries[0]))
    await loop.run_in_executor(None, conn.recv)  # go
    _, pub = await loop.create_connection(lambda: _Pub(f"fleet-pub-{first}"), HOST, port, local_addr=(src, 0))
    await asyncio.wait_for(pub.ready, 60)
    t0 = time.monotonic()
    for k, i in enumerate(range(first, first + n)):
        pub.transport.write(publish_pkt(f"fleet/{i}/cmd", b"x" * 16, 1, (k % 65535) + 1))  # type: ignore[union-attr]
        if k % 200 == 199:
            await asyncio.sleep(0)
    while done[0] < n and time.monotonic() - t0 < FIRST_TIMEOUT:
        await asyncio.sleep(0.01)
    conn.send(("delivered", done[0], t0, time.monotonic()))
    await loop.run_in_executor(None, conn.recv)  # stop
    for d in [*devs, pub]:
        d.transport.close()  # type: ignore[union-attr]


def _worker(port: int, src: str, first: int, n: int, conn) -> None:  # type: ignore[no-untyped-def]
    try:
        asyncio.run(_worker_main(port, src, first, n, conn))
    except Exception as e:  # the parent says which client process failed, and why
        conn.send(("error", f"{src}: {e!r}"))


def _answer(a) -> tuple:  # type: ignore[no-untyped-def]
    if not a.poll(1200):
        raise TimeoutError("a client process did not answer in time")
    r = a.recv()
    if r[0] == "error":
        raise RuntimeError(f"client process failed: {r[1]}")
    return r


def fleet(n: int, base: Path, gateways: int | None = None) -> dict[str, float]:
    """``n`` devices, each its own connection and QoS 1 subscription, over several gateways on one
    port and several client processes on their own source addresses; the first message to each."""
    import multiprocessing as mp

    from unimq.local_cluster import Cluster, free_port

    g = gateways or max(1, -(-n // PER_GATEWAY))
    port = free_port()
    store = ["--set=store.commitlog_segment_size=268435456", "--flush", "async"]
    c = Cluster(base, brokers=2, gateways=g, shared_mqtt_port=port, extra_broker_args=store).start()
    procs, pipes = [], []
    try:
        pids = [p.popen.pid for p in [*c.gateways, *c.brokers.values(), c.nameserver]]  # type: ignore[union-attr]
        roles = {"gateways": pids[:g], "brokers": pids[g:-1], "nameserver": pids[-1:]}
        rss0 = sum(rss_mib(p) for p in pids)
        by_role0 = {k: sum(rss_mib(p) for p in v) for k, v in roles.items()}
        file0 = sum(_rss_file_mib(p) for p in roles["brokers"])
        ctx = mp.get_context("spawn")
        t0 = time.monotonic()
        for k, first in enumerate(range(0, n, PER_WORKER)):
            a, b = ctx.Pipe()
            w = ctx.Process(target=_worker, args=(port, f"127.0.0.{2 + k}", first, min(PER_WORKER, n - first), b))
            w.start()
            procs.append(w)
            pipes.append(a)
        retried = sum(_answer(a)[1] for a in pipes)
        t_sub = time.monotonic() - t0
        time.sleep(2)  # let the gateways settle (sessions written, LMQs known)
        rss = sum(rss_mib(p) for p in pids)
        # where the growth is (the gateways: sessions, connections, routing copies; the brokers:
        # the stored session records and LMQs), per device
        growth = {f"kib_{k}": (sum(rss_mib(p) for p in v) - by_role0[k]) * 1024 / n for k, v in roles.items()}
        growth["kib_brokers_file"] = (sum(_rss_file_mib(p) for p in roles["brokers"]) - file0) * 1024 / n
        cpu0 = sum(cpu_seconds(p) for p in pids)
        for a in pipes:
            a.send("go")
        res = [_answer(a) for a in pipes]
        cpu = sum(cpu_seconds(p) for p in pids) - cpu0
        time.sleep(2)  # the acknowledged floors are committed after the PUBACKs (0.2 s flushes)
        tail = sum(cpu_seconds(p) for p in pids) - cpu0 - cpu
        got = sum(r[1] for r in res)
        first_s = max(r[3] for r in res) - min(r[2] for r in res)
        for a in pipes:
            a.send("stop")
        return {"n": n, "gateways": g, "workers": len(procs), "subscribe_s": t_sub, "first_s": first_s,
                "delivered": got, "rss_mib": rss, "rss0_mib": rss0, "cpu_s": cpu, "cpu_tail_s": tail,
                "retried": retried, **growth}
    finally:
        for w in procs:
            w.join(60)
            if w.is_alive():
                w.kill()
        c.stop()


def _rss_file_mib(pid: int) -> float:
    """The part of a process's RSS that is mapped files (a broker's commitlog pages), MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssFile:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _fleet_row(r: dict[str, float]) -> Row:
    n = int(r["n"])
    return Row("lmq", f"first message to each of {n:,} devices (own connection, own QoS 1 topic), "
                      f"{int(r['gateways'])} gateways on one port: {r['first_s']:.2f} s",
               n / r["first_s"], floor=">= 10,000/s (100,000 in < 10 s)", meets=n / r["first_s"] >= 10_000,
               note=f"lmq fleet {n:,}: {int(r['workers'])} client processes (127.0.0.2...), connecting and "
                    f"subscribing took {r['subscribe_s']:.1f} s ({int(r['retried']):,} devices reconnected after "
                    f"their connection closed before SUBACK); {int(r['delivered']):,} first messages delivered; "
                    f"unimq (nameserver, 2 brokers, {int(r['gateways'])} gateways): RSS {r['rss_mib']:,.0f} MiB "
                    f"with every device connected ({r['rss0_mib']:,.0f} MiB before: "
                    f"{(r['rss_mib'] - r['rss0_mib']) * 1024 / n:.1f} KiB per device, of which gateways "
                    f"{r.get('kib_gateways', 0):.1f}, brokers {r.get('kib_brokers', 0):.1f} (mapped commitlog pages {r.get('kib_brokers_file', 0):.1f})), CPU {r['cpu_s']:.1f} s "
                    f"for the first messages ({r['cpu_s'] / n * 1e6:,.0f} us each), {r['cpu_tail_s']:.1f} s "
                    "in the 2 s after (offset commits)")


def run(ctx: Context) -> list[Row]:
    rows = []
    for n in (1000,) if ctx.quick else (1000, 10_000, 100_000):
        print(f"bench: lmq: {n:,} subscriptions...", file=sys.stderr)
        sub, first, second = measure(n, ctx.scratch(f"lmq-{n}"))
        # issue 21: first messages to 100,000 new subscriptions in under 10 s
        rows.append(Row("lmq", f"first message to each of {n:,} new QoS 1 subscriptions: {first:.2f} s",
                        n / first, floor=">= 10,000/s (100,000 in < 10 s)", meets=n / first >= 10_000,
                        note=f"lmq {n:,}: {PER_CLIENT} subscriptions per connection, one `unimq up`; subscribing "
                             f"took {sub:.2f} s; a second message to each {second:.2f} s"))
    n = 10_000 if ctx.quick else 100_000
    print(f"bench: lmq: fleet of {n:,} devices...", file=sys.stderr)
    try:
        rows.append(_fleet_row(fleet(n, ctx.scratch(f"lmq-fleet-{n}"))))
    except (RuntimeError, TimeoutError, OSError) as e:  # recorded as such: the other rows stand
        rows.append(Row("lmq", f"first message to each of {n:,} devices over several gateways: did not complete",
                        floor=">= 10,000/s (100,000 in < 10 s)", meets=False, note=f"lmq fleet {n:,}: {e}"))
    return rows


def copy_bytes(n: int) -> float:
    """Bytes one routing copy costs a gateway (tracemalloc, in-process): ``n`` records of sessions
    another gateway holds, each online with one QoS 1 subscription as a fleet device has, fed to a
    gateway's fleet as its door-state feed brings them (adapters/mqtt/fleet.py)."""
    import gc
    import json
    import tracemalloc

    from adapters.mqtt.broker import MQTTBroker, MQTTConfig
    from adapters.mqtt.session_store import KV_SESSIONS
    from core_broker.config import StoreConfig
    from gateway.deployment import merged_processor

    def record(i: int) -> bytes:
        return json.dumps({"v": 4, "e": 3600, "n": 1, "d": 0, "s": [[f"fleet/{i}/cmd", 1, 0, 0, 0, 0,
                           f"%LMQ%mqtt/fleet-{i}/1"]], "q": [], "r": [], "l": {}, "u": None,
                           "o": "0123456789abcdef", "g": 1, "h": 0}, separators=(",", ":")).encode()

    async def go(data: Path) -> float:
        p = merged_processor(StoreConfig(data_dir=data, disk_min_free_ratio=0.0, disk_refuse_free_ratio=0.0))
        b = MQTTBroker(p, MQTTConfig())
        take = b.fleet._take
        take({"gateways": ["0123456789abcdef"], "kv": {}, "notes": [], "inc": "i", "seq": 0})
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for first in range(0, n, 1000):
            items = {f"fleet-{i}": (1, record(i)) for i in range(first, min(first + 1000, n))}
            take({"gateways": [], "kv": {KV_SESSIONS: items}, "notes": [], "inc": "i", "seq": first})
            del items
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        return used / n

    with tempfile.TemporaryDirectory() as d:
        return asyncio.run(go(Path(d)))


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--copies"]:
        n = int(args[1]) if len(args) > 1 else 20_000
        print(f"lmq: routing copies: {copy_bytes(n):,.0f} bytes per copy of a session with one QoS 1 "
              f"subscription ({n:,} copies, tracemalloc)", flush=True)
        return
    if args[:1] == ["--fleet"]:
        n = int(args[1]) if len(args) > 1 else 100_000
        g = int(args[2]) if len(args) > 2 else None
        with tempfile.TemporaryDirectory() as d:
            r = fleet(n, Path(d), g)
        print(_fleet_row(r).name, "|", _fleet_row(r).note, flush=True)
        return
    for n in [int(a) for a in args] or [1000, 10000]:
        sub, first, second = measure(n)
        print(f"lmq: {n} QoS 1 subscriptions: subscribe {sub:.2f} s, first message to each {first:.2f} s, "
              f"second {second:.2f} s", flush=True)


if __name__ == "__main__":
    main()
