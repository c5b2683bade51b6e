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
    from .procs import UnimqChild, stop_group
except ImportError:  # run as a script
    from bench import Context, Row  # type: ignore[no-redef]
    from bench.mqtt_bench import HOST, connect_pkt, publish_pkt, scan_packets, subscribe_pkt  # type: ignore[no-redef]
    from bench.procs import UnimqChild, stop_group  # type: ignore[no-redef]

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
    def __init__(self) -> None:
        self.rx = 0
        self.ready = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, t: asyncio.BaseTransport) -> None:
        self.transport = t  # type: ignore[assignment]
        t.write(connect_pkt("lmq-bench-pub"))  # type: ignore[attr-defined]

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


def run(ctx: Context) -> list[Row]:
    rows = []
    for n in (1000,) if ctx.quick else (1000, 10_000):
        print(f"bench: lmq: {n:,} subscriptions...", file=sys.stderr)
        sub, first, second = measure(n, ctx.scratch(f"lmq-{n}"))
        # issue 21: first messages to 100,000 new subscriptions in under 10 s
        rows.append(Row("lmq", f"first message to each of {n:,} new QoS 1 subscriptions: {first:.2f} s",
                        n / first, floor=">= 10,000/s (100,000 in < 10 s)", meets=n / first >= 10_000,
                        note=f"lmq {n:,}: subscribing took {sub:.2f} s; a second message to each {second:.2f} s"))
    return rows


def main() -> None:
    for n in [int(a) for a in sys.argv[1:]] or [1000, 10000]:
        sub, first, second = measure(n)
        print(f"lmq: {n} QoS 1 subscriptions: subscribe {sub:.2f} s, first message to each {first:.2f} s, "
              f"second {second:.2f} s", flush=True)


if __name__ == "__main__":
    main()
