"""Many MQTT devices from a few client processes: epoll over non-blocking sockets.

Why: the fleet benchmarks (``capacity``, ``reconnect``) need tens of thousands of devices, and
the client must not be the limit: an asyncio connection per device costs four times the client
CPU, one process may hold at most 20,000 open files here, and loopback's ephemeral ports run out
near 28,000 per source address. So devices are spread over processes of at most 10,000 each,
each on its own source address (127.0.0.2, 127.0.0.3, ...), each driving its sockets with epoll.

A device sends one prebuilt burst when its connection is up (CONNECT, and SUBSCRIBE when it
subscribes), PUBACKs every QoS 1 PUBLISH it receives, and is *done* once it has seen every packet
kind it waits for (CONNACK and SUBACK, or CONNACK and a first PUBLISH). A device that is refused,
closed or not answered within ``HANDSHAKE_S`` tries again, up to ``ATTEMPTS`` times in all, as a
device would. Done devices are kept connected (``hold``) or closed at once.
"""

from __future__ import annotations

import multiprocessing as mp
import select
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

try:
    from .mqtt_bench import HOST, connect_pkt, scan_packets, subscribe_pkt
except ImportError:  # run as a script
    from bench.mqtt_bench import HOST, connect_pkt, scan_packets, subscribe_pkt  # type: ignore[no-redef]

OUTSTANDING = 400  # handshakes in flight per client process
HANDSHAKE_S = 15.0  # a device not done by then tries again
ATTEMPTS = 3
PER_PROCESS = 10_000

CONNACK, PUBLISH, SUBACK = 2, 3, 9


@dataclass(frozen=True)
class Wave:
    """What every device of one wave does: ``prefix``-``i`` is its client id, ``topic`` (with
    ``{i}``) the topic it subscribes to at QoS 1 (None: no SUBSCRIBE), ``wait`` the packet kinds
    that make it done, ``hold`` whether it stays connected once done."""

    prefix: str
    clean: bool
    topic: str | None
    wait: frozenset[int]
    hold: bool

    def hello(self, i: int) -> bytes:
        cid = f"{self.prefix}-{i}"
        out = connect_pkt(cid, clean=self.clean, keepalive=0)
        if self.topic is not None:
            out += subscribe_pkt(self.topic.format(i=i), 1, 1)
        return out


@dataclass
class _Dev:
    sock: socket.socket
    i: int
    attempt: int
    t: float
    out: bytes  # the burst, until sent
    buf: bytes = b""
    seen: set[int] = field(default_factory=set)


@dataclass
class WaveResult:
    """``done`` devices (their done times, monotonic, in ``times``), given up by reason, tries again."""

    done: int = 0
    retried: int = 0
    gave_up: dict[str, int] = field(default_factory=dict)
    first: float = 0.0
    last: float = 0.0

    def add(self, other: "WaveResult") -> None:
        self.first = min(self.first, other.first) if self.done else other.first
        self.last = max(self.last, other.last)
        self.done += other.done
        self.retried += other.retried
        for why, k in other.gave_up.items():
            self.gave_up[why] = self.gave_up.get(why, 0) + k

    def why(self) -> str:
        gave_up = ", ".join(f"{k:,} {why}" for why, k in self.gave_up.items()) or "none given up"
        return f"{gave_up}; {self.retried:,} tries again"


def run_wave(port: int, src: str, ids: range, wave: Wave, held: list[socket.socket]) -> WaveResult:
    """Drive every device of ``ids`` through ``wave``; done devices that hold are added to ``held``."""
    ep = select.epoll()
    live: dict[int, _Dev] = {}
    todo = deque((i, 1) for i in ids)
    res = WaveResult()

    def drop(fd: int, why: str) -> None:
        ep.unregister(fd)
        d = live.pop(fd)
        d.sock.close()
        if d.attempt < ATTEMPTS:
            todo.append((d.i, d.attempt + 1))
            res.retried += 1
        else:
            res.gave_up[why] = res.gave_up.get(why, 0) + 1

    try:
        while todo or live:
            while todo and len(live) < OUTSTANDING:
                i, attempt = todo.popleft()
                c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                c.setblocking(False)
                c.bind((src, 0))
                c.connect_ex((HOST, port))
                ep.register(c.fileno(), select.EPOLLOUT)
                live[c.fileno()] = _Dev(c, i, attempt, time.monotonic(), wave.hello(i))
            for fd, ev in ep.poll(0.5):
                d = live[fd]
                if d.out:  # connected (or failed to): the burst goes at once
                    if ev & (select.EPOLLERR | select.EPOLLHUP):
                        drop(fd, "connect failed")
                        continue
                    d.sock.send(d.out)
                    d.out = b""
                    ep.modify(fd, select.EPOLLIN)
                    continue
                try:
                    data = d.sock.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    drop(fd, "closed")
                    continue
                buf = d.buf + data
                packets, k = scan_packets(buf)
                d.buf = buf[k:]
                acks = []
                refused = False
                for b0, j, end in packets:
                    kind = b0 >> 4
                    d.seen.add(kind)
                    if kind == CONNACK and buf[j + 1] != 0:
                        refused = True
                    elif kind == SUBACK and buf[end - 1] == 0x80:
                        refused = True
                    elif kind == PUBLISH and b0 & 6:
                        p = j + 2 + ((buf[j] << 8) | buf[j + 1])
                        acks.append(b"\x40\x02" + buf[p: p + 2])
                if acks:
                    d.sock.send(b"".join(acks))
                if refused:
                    drop(fd, "refused")
                elif wave.wait <= d.seen:
                    ep.unregister(fd)
                    del live[fd]
                    now = time.monotonic()
                    res.first = now if not res.done else res.first
                    res.last = now
                    res.done += 1
                    if wave.hold:
                        held.append(d.sock)
                    else:
                        d.sock.close()
            now = time.monotonic()
            for fd in [fd for fd, d in live.items() if now - d.t > HANDSHAKE_S]:
                drop(fd, "not answered")
        return res
    finally:
        ep.close()
        for d in live.values():
            d.sock.close()


def _serve(port: int, src: str, ids: range, conn: Connection) -> None:
    """A client process: runs each wave it is sent, answers its result; "close" closes held
    devices; None ends it."""
    held: list[socket.socket] = []
    try:
        while (cmd := conn.recv()) is not None:
            if cmd == "close":
                for c in held:
                    c.close()
                held.clear()
                conn.send(("closed",))
            else:
                conn.send(("wave", run_wave(port, src, ids, cmd, held)))
    except Exception as e:  # the parent says which client process failed, and why
        conn.send(("error", f"{src}: {e!r}"))
    finally:
        for c in held:
            c.close()


class Swarm:
    """``n`` devices over ceil(n / 10,000) client processes on 127.0.0.2, 127.0.0.3, ..."""

    def __init__(self, port: int, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.pipes: list[Connection] = []
        self.procs: list[mp.process.BaseProcess] = []
        for k, first in enumerate(range(0, n, PER_PROCESS)):
            a, b = ctx.Pipe()
            ids = range(first, min(n, first + PER_PROCESS))
            w = ctx.Process(target=_serve, args=(port, f"127.0.0.{2 + k}", ids, b), daemon=True)
            w.start()
            self.pipes.append(a)
            self.procs.append(w)

    def _answers(self, timeout_s: float) -> list[tuple]:
        out = []
        for a in self.pipes:
            if not a.poll(timeout_s):
                raise TimeoutError(f"a client process did not answer in {timeout_s:.0f} s")
            r = a.recv()
            if r[0] == "error":
                raise RuntimeError(f"client process failed: {r[1]}")
            out.append(r)
        return out

    def wave(self, wave: Wave, timeout_s: float = 900.0) -> WaveResult:
        """Every device through ``wave`` at once (all processes in parallel)."""
        for a in self.pipes:
            a.send(wave)
        total = WaveResult()
        for r in self._answers(timeout_s):
            total.add(r[1])
        return total

    def close_held(self) -> None:
        for a in self.pipes:
            a.send("close")
        self._answers(60)

    def stop(self) -> None:
        for a in self.pipes:
            try:
                a.send(None)
            except OSError:
                pass
        for w in self.procs:
            w.join(30)
            if w.is_alive():
                w.kill()
