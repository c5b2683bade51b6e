"""The most idle MQTT clients one Mosquitto process holds here, and the same number on one unimq gateway.

    python -m bench --only capacity          # up to 20,000 clients (4,000 with --quick)
    python -m bench.capacity_bench [N]       # prints one line

Why: issue 21 compares memory per idle device at the scale one process can reach on this
machine. A process may hold at most 20,000 open files here (hard limit), so one Mosquitto
process tops out near 19,900 clients. The clients (clean session, keepalive 0, one QoS 1
subscription each to a topic of their own) come from two client processes on their own
source addresses (127.0.0.2, 127.0.0.3), so neither the client's file limit nor loopback's
ephemeral ports are the limit. Mosquitto is filled first, until it stops answering; its count
is then connected to one unimq gateway (separated deployment: a nameserver, one broker, one
gateway, as a fleet runs it). Reported: RSS of the Mosquitto process and of the unimq gateway
with every client connected, and the growth per client of Mosquitto and of all unimq
processes summed (issue 21's floor: under 10 KiB per idle client).

The client is epoll over non-blocking sockets in each process (as ``connect_bench``): an
asyncio connection per client costs four times the client CPU and 5 KiB of the client's RSS.
"""

from __future__ import annotations

import multiprocessing as mp
import select
import socket
import sys
import tempfile
from collections import deque
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

try:
    from . import Context, Row
    from .mqtt_bench import HOST, Mosquitto, connect_pkt, subscribe_pkt
    from .procs import rss_mib
except ImportError:  # run as a script
    from bench import Context, Row  # type: ignore[no-redef]
    from bench.mqtt_bench import HOST, Mosquitto, connect_pkt, subscribe_pkt  # type: ignore[no-redef]
    from bench.procs import rss_mib  # type: ignore[no-redef]

NAME = "capacity"
TITLE = "MQTT idle clients: the most one Mosquitto process holds, and the same number on one unimq gateway"

OUTSTANDING = 400  # handshakes in flight per client process
HANDSHAKE_S = 15.0  # a client with no CONNACK + SUBACK by then tries again
ATTEMPTS = 3
PER_WORKER = 10_000
STORE = ["--set=store.commitlog_segment_size=67108864", "--set=store.cq_entries_per_file=100000"]


@dataclass
class _Handshake:
    sock: socket.socket
    client: int
    attempt: int
    out: bytes  # CONNECT + SUBSCRIBE, until sent
    t: float
    got: bytes = b""


def _hold(port: int, src: str, first: int, n: int, conn: Connection) -> None:
    """One client process: ``n`` clients from ``src``; reports how many completed CONNECT and
    SUBSCRIBE, keeps them open until told to stop. A client that failed tries again, up to
    ``ATTEMPTS`` times in all, as a device would; a server at its file limit refuses every try."""
    ep = select.epoll()
    waiting: dict[int, _Handshake] = {}
    held: list[socket.socket] = []
    todo = deque((i, 1) for i in range(first, first + n))  # (client, attempt)
    reasons: dict[str, int] = {}  # why clients were given up, after their last attempt
    retried = 0

    def drop(fd: int, why: str) -> None:
        nonlocal retried
        ep.unregister(fd)
        h = waiting.pop(fd)
        h.sock.close()
        if h.attempt < ATTEMPTS:
            todo.append((h.client, h.attempt + 1))
            retried += 1
        else:
            reasons[why] = reasons.get(why, 0) + 1

    try:
        while todo or waiting:
            while todo and len(waiting) < OUTSTANDING:
                i, attempt = todo.popleft()
                c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                c.setblocking(False)
                c.bind((src, 0))
                c.connect_ex((HOST, port))
                ep.register(c.fileno(), select.EPOLLOUT)
                cid = f"cap-{i}"
                waiting[c.fileno()] = _Handshake(c, i, attempt, connect_pkt(cid, clean=True, keepalive=0)
                                                 + subscribe_pkt(f"cap/{cid}", 1, 1), time.monotonic())
            for fd, ev in ep.poll(0.5):
                h = waiting[fd]
                if h.out:  # connected (or failed to): send CONNECT and SUBSCRIBE at once
                    if ev & (select.EPOLLERR | select.EPOLLHUP):
                        drop(fd, "connect failed")
                        continue
                    h.sock.send(h.out)
                    h.out = b""
                    ep.modify(fd, select.EPOLLIN)
                    continue
                try:
                    data = h.sock.recv(64)
                except OSError:
                    data = b""
                h.got += data
                if not data or (len(h.got) >= 4 and (h.got[:2] != b"\x20\x02" or h.got[3] != 0)):
                    drop(fd, "closed" if not data else "refused")
                elif len(h.got) >= 9:  # CONNACK (4 bytes) and SUBACK (5 bytes)
                    if h.got[4] == 0x90 and h.got[8] != 0x80:
                        ep.unregister(fd)
                        held.append(waiting.pop(fd).sock)
                    else:
                        drop(fd, "subscription refused")
            now = time.monotonic()
            for fd in [fd for fd, h in waiting.items() if now - h.t > HANDSHAKE_S]:
                drop(fd, "not answered")
        conn.send(("held", len(held), retried, reasons))
        conn.recv()  # stop
    except Exception as e:  # the parent says which client process failed, and why
        conn.send(("error", f"{src}: {e!r}"))
    finally:
        ep.close()
        for c in held:
            c.close()
        for h in waiting.values():
            h.sock.close()


def connect_many(port: int, n: int) -> tuple[int, int, dict[str, int], list[Connection],
                                                   list[mp.process.BaseProcess]]:
    """``n`` clients over ceil(n / 10,000) client processes; (held, tries again, why the others
    failed, pipes, processes).
    The caller tells each pipe "stop" once it has measured."""
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for k, first in enumerate(range(0, n, PER_WORKER)):
        a, b = ctx.Pipe()
        w = ctx.Process(target=_hold, args=(port, f"127.0.0.{2 + k}", first, min(PER_WORKER, n - first), b))
        w.start()
        pipes.append(a)
        procs.append(w)
    held = retried = 0
    failed: dict[str, int] = {}
    for a in pipes:
        if not a.poll(900):
            raise TimeoutError("a client process did not answer in 900 s")
        r = a.recv()
        if r[0] == "error":
            raise RuntimeError(f"client process failed: {r[1]}")
        held += r[1]
        retried += r[2]
        for why, k in r[3].items():
            failed[why] = failed.get(why, 0) + k
    return held, retried, failed, pipes, procs


def _release(pipes: list[Connection], procs: list[mp.process.BaseProcess]) -> None:
    for a in pipes:
        try:
            a.send("stop")
        except OSError:
            pass
    for w in procs:
        w.join(30)
        if w.is_alive():
            w.kill()


@dataclass
class Held:
    """One target's figures: clients held, RSS (MiB) of the measured process before and after,
    and of all the target's processes summed before and after."""

    clients: int
    retried: int
    failed: dict[str, int]
    rss0: float
    rss: float
    total0: float
    total: float

    @property
    def why(self) -> str:
        gave_up = ", ".join(f"{k:,} {why}" for why, k in self.failed.items()) or "none given up"
        return f"{gave_up}; {self.retried:,} tries again"

    @property
    def kib_per_client(self) -> float:
        return (self.total - self.total0) * 1024 / max(1, self.clients)


def mosquitto(base: Path, n: int) -> Held:
    m = Mosquitto(base)
    try:
        r0 = rss_mib(m.proc.pid)
        held, retried, failed, pipes, procs = connect_many(m.port, n)
        try:
            time.sleep(2)
            r = rss_mib(m.proc.pid)
        finally:
            _release(pipes, procs)
        return Held(held, retried, failed, r0, r, r0, r)
    finally:
        m.stop()


def unimq_gateway(base: Path, n: int) -> Held:
    from unimq.local_cluster import Cluster, free_port

    port = free_port()
    c = Cluster(base, brokers=1, gateways=1, shared_mqtt_port=port, extra_broker_args=STORE).start()
    try:
        gw = c.gateways[0].popen.pid  # type: ignore[union-attr]
        pids = [p.popen.pid for p in (*c.gateways, *c.brokers.values(), c.nameserver) if p is not None]
        r0, t0 = rss_mib(gw), sum(rss_mib(p) for p in pids)
        held, retried, failed, pipes, procs = connect_many(port, n)
        try:
            time.sleep(3)  # the gateway settles (subscriptions registered)
            r, t = rss_mib(gw), sum(rss_mib(p) for p in pids)
        finally:
            _release(pipes, procs)
        return Held(held, retried, failed, r0, r, t0, t)
    finally:
        c.stop()


def measure(base: Path, n: int) -> tuple[Held | None, Held]:
    """Mosquitto filled with up to ``n`` clients (None when not installed), then one unimq gateway
    with as many as Mosquitto held (``n`` without Mosquitto)."""
    (base / "mosquitto").mkdir()
    (base / "unimq").mkdir()
    mos = mosquitto(base / "mosquitto", n) if Mosquitto.available() else None
    target = mos.clients if mos is not None else n
    return mos, unimq_gateway(base / "unimq", target)


def run(ctx: Context) -> list[Row]:
    n = 4_000 if ctx.quick else 20_000
    print(f"bench: capacity: up to {n:,} idle clients on Mosquitto, then as many on one unimq gateway...",
          file=sys.stderr)
    mos, ours = measure(ctx.scratch("capacity"), n)
    peer = (f"Mosquitto {Mosquitto.version()} {mos.rss:,.0f} MiB ({mos.kib_per_client:.1f} KiB per client)"
            if mos else "—")
    note = (f"capacity: Mosquitto held {mos.clients:,} of {n:,} clients (the others: {mos.why}; its "
            "20,000-file limit); " if mos else "capacity: Mosquitto not installed; ")
    note += (f"unimq: 1 nameserver, 1 broker, 1 gateway; the gateway {ours.rss0:,.0f} -> {ours.rss:,.0f} MiB, all three "
             f"processes {ours.total0:,.0f} -> {ours.total:,.0f} MiB for {ours.clients:,} clients "
             f"(not held: {ours.why}); per client: growth of the RSS summed over every process")
    return [Row("capacity", f"RSS with {ours.clients:,} idle clients (the most one Mosquitto held), "
                            "1 QoS 1 subscription each, one unimq gateway (KiB per client)",
                peer=peer, ratio=f"unimq {ours.rss:,.0f} MiB ({ours.kib_per_client:.1f} KiB per client)",
                floor="< 10 KiB per idle client over all unimq processes",
                meets=ours.kib_per_client < 10 and (mos is None or ours.clients >= mos.clients), note=note)]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    with tempfile.TemporaryDirectory() as d:
        mos, ours = measure(Path(d), n)
    if mos:
        print(f"capacity: Mosquitto held {mos.clients:,} ({mos.why}): RSS {mos.rss0:,.0f} -> {mos.rss:,.0f} MiB "
              f"({mos.kib_per_client:.1f} KiB per client)")
    print(f"capacity: unimq gateway held {ours.clients:,} ({ours.why}): gateway RSS {ours.rss0:,.0f} -> "
          f"{ours.rss:,.0f} MiB; all processes {ours.total0:,.0f} -> {ours.total:,.0f} MiB "
          f"({ours.kib_per_client:.1f} KiB per client)", flush=True)


if __name__ == "__main__":
    main()
