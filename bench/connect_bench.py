"""A CONNECT storm with persistent sessions over two gateways sharing one port, beside Mosquitto.

    python -m bench --only connect          # 10,000 clients (2,000 with --quick)
    python -m bench.connect_bench [N]       # prints one line per broker

Why: a fleet reconnects at once after a network blip (issue 21: at least 5,000
CONNECTs per second with persistent sessions). ``N`` clients (MQTT 3.1.1, clean
session 0, each its own client id) connect with at most 500 CONNECTs outstanding
and stay connected until the last CONNACK; reported: CONNACKs per second from the
first CONNECT to the last CONNACK, and the CPU time per CONNECT of every server
process and of the load generator. unimq runs separated, as a fleet would: one
nameserver, two brokers and two gateways sharing one MQTT port with SO_REUSEPORT
(``unimq.local_cluster.Cluster``, the documented commands); the peer is one
Mosquitto process (its sessions in memory, ``persistence false``). Three rounds
alternate between the two, the best of each is kept (the machine is shared).

The load generator must not be the limit: it is one process driving non-blocking
sockets with ``epoll`` directly (about 45 us of its CPU per connection, where an
asyncio ``create_connection`` per client cost 210 us and capped Mosquitto near
4,000/s on this machine); CONNECT packets are prebuilt, a CONNACK is recognised by
its four bytes.
"""

from __future__ import annotations

import select
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

try:
    from . import Context, Row
    from .mqtt_bench import HOST, Mosquitto, connect_pkt
    from .procs import cpu_seconds
except ImportError:  # run as a script
    from bench import Context, Row  # type: ignore[no-redef]
    from bench.mqtt_bench import HOST, Mosquitto, connect_pkt  # type: ignore[no-redef]
    from bench.procs import cpu_seconds  # type: ignore[no-redef]

NAME = "connect"
TITLE = "MQTT CONNECT storm, persistent sessions, two gateways on one port"

OUTSTANDING = 500
ROUNDS = 3
STORE = ["--set=store.commitlog_segment_size=67108864", "--set=store.cq_entries_per_file=100000"]


def storm(port: int, n: int, tag: str, timeout_s: float = 600.0) -> float:
    """CONNACKs per second for ``n`` persistent-session clients on ``port`` (raises on a refusal
    or a connection closed before its CONNACK)."""
    pkts = [connect_pkt(f"{tag}-{i}", clean=False) for i in range(n)]
    ep = select.epoll()
    waiting: dict[int, tuple[socket.socket, bytes | None]] = {}  # fd -> (socket, CONNECT not yet sent)
    done: list[socket.socket] = []
    started = 0
    t = time.perf_counter()
    deadline = t + timeout_s
    try:
        while len(done) < n:
            while started < n and len(waiting) < OUTSTANDING:
                c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                c.setblocking(False)
                c.connect_ex((HOST, port))
                waiting[c.fileno()] = (c, pkts[started])
                ep.register(c.fileno(), select.EPOLLOUT)
                started += 1
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{len(done)} of {n} CONNACKs within {timeout_s:.0f} s")
            for fd, ev in ep.poll(1.0):
                c, pkt = waiting[fd]
                if pkt is not None:
                    if ev & (select.EPOLLERR | select.EPOLLHUP):
                        raise ConnectionError(f"{tag}: connect failed: {c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)}")
                    c.send(pkt)
                    waiting[fd] = (c, None)
                    ep.modify(fd, select.EPOLLIN)
                    continue
                data = c.recv(64)
                if data[:2] != b"\x20\x02" or len(data) < 4 or data[3] != 0:
                    raise ConnectionError(f"{tag}: CONNECT refused or connection closed: {data[:8]!r}")
                ep.unregister(fd)
                del waiting[fd]
                done.append(c)
        return n / (time.perf_counter() - t)
    finally:
        ep.close()
        for c, _ in waiting.values():
            c.close()
        for c in done:
            c.close()
        time.sleep(0.5)


@dataclass
class Best:
    """The best round of one target: CONNACKs/s, and CPU microseconds per client (its CONNECT and
    its close) of the target's processes and of the load generator in that round."""

    rate: float = 0.0
    server_us: float = float("nan")
    gen_us: float = float("nan")

    def take(self, n: int, pids: list[int], fn: Callable[[], float]) -> None:
        c0, g0 = sum(cpu_seconds(p) for p in pids), time.process_time()
        rate = fn()
        if rate > self.rate:
            self.rate = rate
            self.server_us = (sum(cpu_seconds(p) for p in pids) - c0) / n * 1e6
            self.gen_us = (time.process_time() - g0) / n * 1e6


def rates(n: int, base: Path, rounds: int = ROUNDS) -> tuple[Best, Best | None]:
    """Best of ``rounds`` alternating rounds (fresh client ids each): unimq, Mosquitto (None when
    it is not installed). Both run throughout, so a burst of load from other processes hits both
    alike."""
    from unimq.local_cluster import Cluster, free_port

    (base / "unimq").mkdir()
    (base / "mosquitto").mkdir()
    port = free_port()
    c = Cluster(base / "unimq", brokers=2, gateways=2, shared_mqtt_port=port, extra_broker_args=STORE).start()
    m = Mosquitto(base / "mosquitto") if Mosquitto.available() else None
    ours_pids = [p.popen.pid for p in (*c.gateways, *c.brokers.values(), c.nameserver) if p is not None]
    try:
        ours, peer = Best(), Best()
        storm(port, 200, "warm")  # every process has served a CONNECT once
        if m is not None:
            storm(m.port, 200, "warm")
        for r in range(rounds):
            ours.take(n, ours_pids, lambda: storm(port, n, f"storm{r}"))
            if m is not None:
                peer.take(n, [m.proc.pid], lambda: storm(m.port, n, f"storm{r}"))
        return ours, (peer if m is not None else None)
    finally:
        if m is not None:
            m.stop()
        c.stop()


def run(ctx: Context) -> list[Row]:
    n = 2000 if ctx.quick else 10_000
    print(f"bench: connect: {n:,} persistent sessions, unimq (2 gateways) and Mosquitto...", file=sys.stderr)
    ours, peer = rates(n, ctx.scratch("connect"))
    peer_s = f"Mosquitto {Mosquitto.version()} {peer.rate:,.0f}/s" if peer else "—"
    cpu = f"CPU per client (CONNECT and close) in the best round: unimq {ours.server_us:,.0f} us over its 5 processes"
    if peer:
        cpu += f", Mosquitto {peer.server_us:,.0f} us; load generator {ours.gen_us:,.0f} / {peer.gen_us:,.0f} us"
    return [Row("connect", f"CONNECT storm, {n:,} clients, clean session 0, 2 gateways on one port (connects/s)",
                ours.rate, peer=peer_s, ratio=f"{ours.rate / peer.rate:.2f}x" if peer else "—",
                floor=">= 5,000 connects/s", meets=ours.rate >= 5000,
                note=f"connect: {OUTSTANDING} CONNECTs outstanding at most, best of {ROUNDS} alternating rounds; "
                     "unimq: 1 nameserver, 2 brokers, 2 gateways sharing the MQTT port (SO_REUSEPORT); "
                     "load generator: one process, epoll over non-blocking sockets; " + cpu)]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    with tempfile.TemporaryDirectory() as d:
        ours, peer = rates(n, Path(d))
        print(f"connect: {n} persistent sessions: unimq (2 gateways) {ours.rate:,.0f}/s "
              f"({ours.server_us:,.0f} us CPU per client), Mosquitto "
              + (f"{peer.rate:,.0f}/s ({peer.server_us:,.0f} us)" if peer else "not installed"), flush=True)


if __name__ == "__main__":
    main()
