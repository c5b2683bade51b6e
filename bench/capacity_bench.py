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

The clients are ``bench.device_swarm``'s (epoll over non-blocking sockets, devices retry as
devices do).
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

try:
    from . import Context, Row
    from .device_swarm import CONNACK, SUBACK, Swarm, Wave
    from .mqtt_bench import Mosquitto
    from .procs import rss_mib
except ImportError:  # run as a script
    from bench import Context, Row  # type: ignore[no-redef]
    from bench.device_swarm import CONNACK, SUBACK, Swarm, Wave  # type: ignore[no-redef]
    from bench.mqtt_bench import Mosquitto  # type: ignore[no-redef]
    from bench.procs import rss_mib  # type: ignore[no-redef]

NAME = "capacity"
TITLE = "MQTT idle clients: the most one Mosquitto process holds, and the same number on one unimq gateway"

STORE = ["--set=store.commitlog_segment_size=67108864", "--set=store.cq_entries_per_file=100000"]
IDLE = Wave("cap", clean=True, topic="cap/{i}", wait=frozenset({CONNACK, SUBACK}), hold=True)


@dataclass
class Held:
    """One target's figures: clients held, RSS (MiB) of the measured process before and after,
    and of all the target's processes summed before and after."""

    clients: int
    why: str  # the devices given up, and tries again
    rss0: float
    rss: float
    total0: float
    total: float

    @property
    def kib_per_client(self) -> float:
        return (self.total - self.total0) * 1024 / max(1, self.clients)


def mosquitto(base: Path, n: int) -> Held:
    m = Mosquitto(base)
    try:
        r0 = rss_mib(m.proc.pid)
        swarm = Swarm(m.port, n)
        try:
            w = swarm.wave(IDLE)
            time.sleep(2)
            r = rss_mib(m.proc.pid)
        finally:
            swarm.stop()
        return Held(w.done, w.why(), r0, r, r0, r)
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
        swarm = Swarm(port, n)
        try:
            w = swarm.wave(IDLE)
            time.sleep(3)  # the gateway settles (subscriptions registered)
            r, t = rss_mib(gw), sum(rss_mib(p) for p in pids)
        finally:
            swarm.stop()
        return Held(w.done, w.why(), r0, r, t0, t)
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
             f"(not held: {ours.why}; the gateway's own open files, listeners, broker connections and epoll, "
             "count against the same 20,000-file limit); per client: growth of the RSS summed over every process")
    held = f"Mosquitto held {mos.clients:,}" if mos else "no Mosquitto"
    return [Row("capacity", f"RSS with {ours.clients:,} idle clients ({held}: its most), "
                            "1 QoS 1 subscription each, one unimq gateway (KiB per client)",
                peer=peer, ratio=f"unimq {ours.rss:,.0f} MiB ({ours.kib_per_client:.1f} KiB per client)",
                floor="< 10 KiB per idle client over all unimq processes",
                meets=ours.kib_per_client < 10, note=note)]


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
