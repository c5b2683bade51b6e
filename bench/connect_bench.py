"""A CONNECT storm with persistent sessions over two gateways sharing one port, beside Mosquitto.

    python -m bench --only connect          # 10,000 clients (2,000 with --quick)
    python -m bench.connect_bench [N]       # prints one line per broker

Why: a fleet reconnects at once after a network blip (issue 21: at least 5,000
CONNECTs per second with persistent sessions). ``N`` clients (MQTT 3.1.1, clean
session 0, each its own client id) connect with at most 500 CONNECTs outstanding
(raw sockets, one asyncio loop) and stay connected; reported: CONNACKs per second
from the first CONNECT to the last CONNACK. unimq runs separated, as a fleet
would: one nameserver, two brokers and two gateways sharing one MQTT port with
SO_REUSEPORT (``unimq.local_cluster.Cluster``, the documented commands); the peer
is one Mosquitto process (its sessions in memory, ``persistence false``). Three
rounds alternate between the two, the best of each is kept (the machine is shared).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

try:
    from . import Context, Row
    from .mqtt_bench import HOST, Mosquitto, connect_pkt
except ImportError:  # run as a script
    from bench import Context, Row  # type: ignore[no-redef]
    from bench.mqtt_bench import HOST, Mosquitto, connect_pkt  # type: ignore[no-redef]

NAME = "connect"
TITLE = "MQTT CONNECT storm, persistent sessions, two gateways on one port"

OUTSTANDING = 500
ROUNDS = 3
STORE = ["--set=store.commitlog_segment_size=67108864", "--set=store.cq_entries_per_file=100000"]


class _Dev(asyncio.Protocol):
    __slots__ = ("cid", "acked", "transport")

    def __init__(self, cid: str, acked: asyncio.Future[None]) -> None:
        self.cid = cid
        self.acked = acked
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, t: asyncio.BaseTransport) -> None:
        self.transport = t
        t.write(connect_pkt(self.cid, clean=False))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if not self.acked.done():
            if data[:1] == b"\x20" and len(data) >= 4 and data[3] == 0:
                self.acked.set_result(None)
            else:
                self.acked.set_exception(RuntimeError(f"{self.cid}: refused: {data[:8]!r}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.acked.done():
            self.acked.set_exception(ConnectionError(f"{self.cid}: closed before CONNACK"))


async def storm(port: int, n: int, tag: str) -> float:
    """CONNACKs per second for ``n`` persistent-session clients on ``port``."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(OUTSTANDING)
    devs: list[_Dev] = []

    async def one(i: int) -> None:
        async with slots:
            acked: asyncio.Future[None] = loop.create_future()
            _, d = await loop.create_connection(lambda: _Dev(f"{tag}-{i}", acked), HOST, port)
            devs.append(d)
            await acked

    t = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), 600)
    rate = n / (time.perf_counter() - t)
    for d in devs:
        d.transport.close()  # type: ignore[union-attr]
    await asyncio.sleep(0.5)
    return rate


def rates(n: int, base: Path, rounds: int = ROUNDS) -> tuple[float, float | None]:
    """Best connects/s of ``rounds`` alternating rounds (fresh client ids each): unimq, Mosquitto
    (None when it is not installed). Both run throughout, so a burst of load from other
    processes hits both alike."""
    from unimq.local_cluster import Cluster, free_port

    (base / "unimq").mkdir()
    (base / "mosquitto").mkdir()
    port = free_port()
    c = Cluster(base / "unimq", brokers=2, gateways=2, shared_mqtt_port=port, extra_broker_args=STORE).start()
    m = Mosquitto(base / "mosquitto") if Mosquitto.available() else None
    try:
        ours, peer = 0.0, 0.0
        asyncio.run(storm(port, 200, "warm"))  # every process has served a CONNECT once
        if m is not None:
            asyncio.run(storm(m.port, 200, "warm"))
        for r in range(rounds):
            ours = max(ours, asyncio.run(storm(port, n, f"storm{r}")))
            if m is not None:
                peer = max(peer, asyncio.run(storm(m.port, n, f"storm{r}")))
        return ours, (peer if m is not None else None)
    finally:
        if m is not None:
            m.stop()
        c.stop()


def run(ctx: Context) -> list[Row]:
    n = 2000 if ctx.quick else 10_000
    print(f"bench: connect: {n:,} persistent sessions, unimq (2 gateways) and Mosquitto...", file=sys.stderr)
    ours, peer = rates(n, ctx.scratch("connect"))
    peer_s = f"Mosquitto {Mosquitto.version()} {peer:,.0f}/s" if peer else "—"
    return [Row("connect", f"CONNECT storm, {n:,} clients, clean session 0, 2 gateways on one port (connects/s)",
                ours, peer=peer_s, ratio=f"{ours / peer:.2f}x" if peer else "—", floor=">= 5,000 connects/s",
                meets=ours >= 5000,
                note=f"connect: {OUTSTANDING} CONNECTs outstanding at most, best of {ROUNDS} alternating rounds; "
                     "unimq: 1 nameserver, 2 brokers, 2 gateways sharing the MQTT port (SO_REUSEPORT)")]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    with tempfile.TemporaryDirectory() as d:
        ours, peer = rates(n, Path(d))
        print(f"connect: {n} persistent sessions: unimq (2 gateways) {ours:,.0f}/s, Mosquitto "
              + (f"{peer:,.0f}/s" if peer else "not installed"), flush=True)


if __name__ == "__main__":
    main()
