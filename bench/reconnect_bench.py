"""A fleet reconnecting after its gateways restart: queued messages delivered, live traffic not stalled.

    python -m bench --only reconnect          # 100,000 devices (5,000 with --quick)
    python -m bench.reconnect_bench [N]       # prints the figures

Why: issue 21 asks that a reconnect of 100,000 persistent sessions after a restart delivers
their queued messages without stalling live traffic. ``N`` devices (MQTT 3.1.1, clean session
0, each subscribed at QoS 1 to its own command topic) connect, subscribe and go away; one QoS 1
command is published to each while they are away (all acknowledged); every gateway is then
restarted (SIGTERM, started again on the same shared port: unimq separated, one nameserver, two
brokers, a gateway per 12,500 devices, as a fleet runs it). A live pair (one publisher at 1,000
QoS 1 messages a second, one subscriber) runs on the new gateways for a few seconds, then all
``N`` devices reconnect at once; each is done when its queued command arrives (PUBACKed).
Reported: seconds from the first reconnect to the last queued command delivered, and the live
pair's latency (p50 / p99 / max) before and during the storm.

Devices are ``bench.device_swarm``'s (epoll, 10,000 per client process, own source addresses).
"""

from __future__ import annotations

import socket
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    from . import Context, Row
    from .device_swarm import CONNACK, PUBLISH, SUBACK, Swarm, Wave
    from .mqtt_bench import HOST, connect_pkt, publish_pkt, scan_packets, subscribe_pkt
except ImportError:  # run as a script
    from bench import Context, Row  # type: ignore[no-redef]
    from bench.device_swarm import CONNACK, PUBLISH, SUBACK, Swarm, Wave  # type: ignore[no-redef]
    from bench.mqtt_bench import HOST, connect_pkt, publish_pkt, scan_packets, subscribe_pkt  # type: ignore[no-redef]

NAME = "reconnect"
TITLE = "MQTT fleet reconnect after a gateway restart: queued messages and live traffic"

PER_GATEWAY = 12_500
LIVE_RATE = 1000  # live QoS 1 messages a second
STORE = ["--set=store.commitlog_segment_size=268435456", "--flush", "async"]
SUBSCRIBE = Wave("rc", clean=False, topic="rc/{i}/cmd", wait=frozenset({CONNACK, SUBACK}), hold=False)
RECONNECT = Wave("rc", clean=False, topic=None, wait=frozenset({CONNACK, PUBLISH}), hold=True)


def _connect(port: int, cid: str, clean: bool = True) -> socket.socket:
    s = socket.create_connection((HOST, port), timeout=30)
    s.sendall(connect_pkt(cid, clean=clean, keepalive=0))
    if s.recv(4)[:2] != b"\x20\x02":
        raise ConnectionError(f"{cid}: no CONNACK")
    return s


def publish_each(port: int, n: int) -> None:
    """One QoS 1 command to each device's topic, every one acknowledged."""
    s = _connect(port, "rc-commands")
    try:
        window, sent, acked = 1000, 0, 0
        buf = b""
        while acked < n:
            burst = []
            while sent < n and sent - acked < window:
                burst.append(publish_pkt(f"rc/{sent}/cmd", b"command", 1, sent % 65535 + 1))
                sent += 1
            if burst:
                s.sendall(b"".join(burst))
            buf += s.recv(65536)
            packets, k = scan_packets(buf)
            buf = buf[k:]
            acked += sum(1 for b0, _, _ in packets if b0 >> 4 == 4)
    finally:
        s.close()


@dataclass
class Live:
    """A publisher at ``LIVE_RATE`` QoS 1 messages a second and a subscriber on one topic; each
    message carries its send time, the subscriber records (receive time, latency)."""

    port: int
    samples: list[tuple[float, float]] = field(default_factory=list)
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        # a persistent session: the pair may land on different gateways, and messages reach a
        # subscriber at another gateway through its session's queue (README, several gateways)
        self.sub = _connect(self.port, "rc-live-sub", clean=False)
        self.sub.sendall(subscribe_pkt("rc/live", 1, 1))
        self.pub = _connect(self.port, "rc-live-pub")
        time.sleep(0.5)  # the SUBACK
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._publish, self._receive, self._drain)]
        for t in self.threads:
            t.start()

    def _publish(self) -> None:
        t0 = time.monotonic()
        while not self.stop.is_set():
            due = t0 + self.sent / LIVE_RATE
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            self.pub.sendall(publish_pkt("rc/live", struct.pack(">d", time.monotonic()), 1, self.sent % 65535 + 1))
            self.sent += 1

    def _drain(self) -> None:  # the publisher's PUBACKs
        self.pub.settimeout(0.5)
        while not self.stop.is_set():
            try:
                if not self.pub.recv(65536):
                    return
            except socket.timeout:
                continue

    def _receive(self) -> None:
        self.sub.settimeout(0.5)
        buf = b""
        while not self.stop.is_set():
            try:
                data = self.sub.recv(65536)
            except socket.timeout:
                continue
            if not data:
                return
            now = time.monotonic()
            buf += data
            packets, k = scan_packets(buf)
            acks = []
            for b0, j, end in packets:
                if b0 >> 4 == 3:
                    p = j + 2 + ((buf[j] << 8) | buf[j + 1])
                    acks.append(b"\x40\x02" + buf[p: p + 2])
                    self.samples.append((now, now - struct.unpack(">d", buf[p + 2: end])[0]))
            buf = buf[k:]
            if acks:
                self.sub.sendall(b"".join(acks))

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)
        self.pub.close()
        self.sub.close()

    def latency_ms(self, t0: float, t1: float) -> tuple[float, float, float, int]:
        """p50, p99, max (ms) and count of the live messages received between t0 and t1."""
        lat = sorted(x for t, x in self.samples if t0 <= t < t1)
        if not lat:
            return float("nan"), float("nan"), float("nan"), 0
        return (lat[len(lat) // 2] * 1e3, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3, lat[-1] * 1e3,
                len(lat))


@dataclass
class Result:
    n: int
    gateways: int
    subscribe_s: float
    storm_s: float
    delivered: int
    why: str
    before: tuple[float, float, float, int]
    during: tuple[float, float, float, int]
    live_sent: int
    live_got: int


def measure(base: Path, n: int) -> Result:
    from unimq.local_cluster import Cluster, free_port

    g = max(2, -(-n // PER_GATEWAY))
    port = free_port()
    c = Cluster(base, brokers=2, gateways=g, shared_mqtt_port=port, extra_broker_args=STORE).start()
    swarm = Swarm(port, n)
    live: Live | None = None
    try:
        t = time.monotonic()
        sub = swarm.wave(SUBSCRIBE)
        subscribe_s = time.monotonic() - t
        if sub.done < n:
            raise RuntimeError(f"only {sub.done:,} of {n:,} devices subscribed ({sub.why()})")
        publish_each(port, n)
        c.restart_gateways()
        live = Live(port)
        live.start()
        time.sleep(3)
        t_storm = time.monotonic()
        w = swarm.wave(RECONNECT)
        t_end = time.monotonic()
        time.sleep(1)
        live.close()
        before = live.latency_ms(t_storm - 2.5, t_storm)
        during = live.latency_ms(t_storm, t_end)
        return Result(n, g, subscribe_s, w.last - t_storm, w.done, w.why(), before, during, live.sent,
                      len(live.samples))
    finally:
        if live is not None and not live.stop.is_set():
            live.close()
        swarm.stop()
        c.stop()


def _fmt(lat: tuple[float, float, float, int]) -> str:
    return f"{lat[0]:.1f} / {lat[1]:.1f} / {lat[2]:.1f} ms ({lat[3]:,} messages)"


def rows_of(r: Result) -> list[Row]:
    note = (f"reconnect {r.n:,}: unimq 1 nameserver, 2 brokers, {r.gateways} gateways on one port; subscribing took "
            f"{r.subscribe_s:.1f} s; devices not done: {r.why}; live pair at {LIVE_RATE:,} QoS 1 msgs/s, p50 / p99 / "
            f"max before the storm {_fmt(r.before)}, during it {_fmt(r.during)}; live sent {r.live_sent:,}, "
            f"received {r.live_got:,}")
    ok = r.delivered == r.n
    return [
        Row("reconnect", f"{r.n:,} persistent sessions reconnect after a gateway restart: queued QoS 1 message "
                         f"to each delivered in {r.storm_s:.1f} s", r.delivered / r.storm_s if r.storm_s > 0 else None,
            floor="every queued message delivered", meets=ok, note=note),
        Row("reconnect", "live QoS 1 latency during that storm: p50 / p99 / max (ms)",
            peer=f"before the storm {r.before[0]:.1f} / {r.before[1]:.1f} / {r.before[2]:.1f}",
            ratio=f"{r.during[0]:.1f} / {r.during[1]:.1f} / {r.during[2]:.1f}",
            floor="no stall: live messages keep arriving (max < 2 s)",
            meets=r.during[3] > 0 and r.during[2] < 2000),
    ]


def run(ctx: Context) -> list[Row]:
    n = 5_000 if ctx.quick else 100_000
    print(f"bench: reconnect: {n:,} persistent sessions...", file=sys.stderr)
    try:
        return rows_of(measure(ctx.scratch("reconnect"), n))
    except (RuntimeError, TimeoutError, OSError) as e:  # recorded as such
        return [Row("reconnect", f"{n:,} persistent sessions reconnect after a gateway restart: did not complete",
                    floor="every queued message delivered", meets=False, note=f"reconnect {n:,}: {e}")]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with tempfile.TemporaryDirectory() as d:
        r = measure(Path(d), n)
    for row in rows_of(r):
        print(row.name, "|", row.ratio, "|", row.meets)
    print(rows_of(r)[0].note, flush=True)


if __name__ == "__main__":
    main()
