"""Replicated broker groups (issue 16): what two acknowledging copies cost, and how long a failover takes.

Rows, all in one run, every broker with ``--flush sync`` and default replication settings:

- send throughput of 1 KiB messages into one unreplicated broker, a group of 2 with both
  acknowledging (``--min-insync-replicas 2``) and a group of 3 with 2 acknowledging. The
  client is the gateway's own broker client (``RemoteBrokerClient``, routes from the
  nameserver) in this process, with 64 sends of one message each in flight (what a gateway
  under load does), for a fixed count. Floor: replicated groups >= 0.5x the unreplicated broker.
- failover time over 10 kills of a group of 3 (2 acknowledging): from the master's SIGKILL
  to the first acknowledged send on the new master, while a sender retries every 50 ms (the
  gateway's own retry is part of the figure). Median and maximum; floors < 5 s and < 10 s.
  Between kills the killed broker is restarted and the group waits for three in sync (not timed).

Processes: `unimq controller` (one Raft node), `unimq nameserver`, `unimq broker` per member,
all started the documented way (unimq.local_cluster.start_proc) on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
from pathlib import Path

from . import Context, Row

NAME = "replication"
TITLE = "Replicated broker groups (sync flush, 1 KiB sends)"
BODY = b"r" * 1024
CONCURRENCY = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Setup:
    def __init__(self, root: Path, members: int, min_insync: int) -> None:
        from unimq.local_cluster import start_proc

        self.root = root
        self.members = members
        self.procs = []
        self.ctl_port = 0
        if members:
            raft, self.ctl_port = _free_port(), _free_port()
            self.procs.append(start_proc("controller", [
                "controller", "--controller-port", str(self.ctl_port), "--data-dir", str(root / "ctl"),
                "--raft-addr", f"127.0.0.1:{raft}", "--peers", f"127.0.0.1:{raft}", "--secret", "bench"]))
        ns = start_proc("nameserver", ["nameserver", "--port", "0"])
        self.procs.append(ns)
        self.namesrv = ("127.0.0.1", ns.ports["namesrv"])
        self.min_insync = min_insync
        self.brokers: dict[str, object] = {}
        if members == 0:
            self.brokers["solo"] = start_proc("solo", self._broker_args("solo", group=False))
            self.name = "solo"
        else:
            for i in range(members):
                b = f"m{i + 1}"
                self.brokers[b] = start_proc(b, self._broker_args(b, group=True))
            self.name = "g"

    def _broker_args(self, b: str, group: bool) -> list[str]:
        args = ["broker", "--data-dir", str(self.root / b), "--port", "0", "--flush", "sync",
                "--namesrv", f"{self.namesrv[0]}:{self.namesrv[1]}", "--heartbeat-s", "1"]
        if group:
            args += ["--group", "g", "--broker-id", b, "--controller-addr", f"127.0.0.1:{self.ctl_port}",
                     "--min-insync-replicas", str(self.min_insync)]
        else:
            args += ["--name", b]
        return args

    def restart(self, b: str) -> None:
        from unimq.local_cluster import start_proc

        self.brokers[b] = start_proc(b, self._broker_args(b, group=True))

    async def state(self):  # type: ignore[no-untyped-def]
        from nameserver.controller_client import ControllerClient

        c = ControllerClient([("127.0.0.1", self.ctl_port)], timeout_s=2.0)
        await c.start()
        try:
            return await c.group_state("g")
        finally:
            await c.stop()

    async def wait_in_sync(self, n: int, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                st = await self.state()
                if st.master_id is not None and len(st.in_sync) >= n:
                    return st.master_id
            except Exception:  # noqa: BLE001 - controller starting, group unknown yet
                pass
            await asyncio.sleep(0.2)
        raise RuntimeError(f"group never had {n} members in sync")

    def stop(self) -> None:
        for p in [*self.brokers.values(), *reversed(self.procs)]:
            p.stop()  # type: ignore[attr-defined]


async def _client(setup: _Setup):  # type: ignore[no-untyped-def]
    from gateway.remote_broker_client import RemoteBrokerClient

    c = RemoteBrokerClient([setup.namesrv])
    await c.start()
    deadline = time.monotonic() + 30
    while True:
        try:
            brokers = {b["name"] for b in await c.list_brokers(refresh=True)}
            if setup.name in brokers:
                return c
        except Exception:  # noqa: BLE001
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{setup.name} never registered")
        await asyncio.sleep(0.2)


async def _throughput(setup: _Setup, n: int) -> float:
    from core_broker.model import Message

    if setup.members:
        await setup.wait_in_sync(setup.members)
    c = await _client(setup)
    try:
        left = n + 2000  # the first 2,000 warm up connections and segments
        sent = 0
        t0 = 0.0

        async def worker() -> None:
            nonlocal left, sent, t0
            while left > 0:
                left -= 1
                await c.send(setup.name, [Message("rb", BODY, queue_id=left & 7)], False, "")
                sent += 1
                if sent == 2000:
                    t0 = time.perf_counter()

        await asyncio.gather(*[worker() for _ in range(CONCURRENCY)])
        return (sent - 2000) / (time.perf_counter() - t0)
    finally:
        await c.stop()


async def _failovers(setup: _Setup, kills: int) -> list[float]:
    from core_broker.model import Message

    c = await _client(setup)
    times: list[float] = []
    try:
        for _ in range(kills):
            master = await setup.wait_in_sync(3)
            await c.send(setup.name, [Message("rf", BODY)], False, "")
            proc = setup.brokers[master]
            t0 = time.perf_counter()
            proc.kill9()  # type: ignore[attr-defined]
            while True:
                try:
                    await c.send(setup.name, [Message("rf", BODY)], False, "")
                    break
                except Exception:  # noqa: BLE001 - refused while the group elects; the sender retries
                    await asyncio.sleep(0.05)
            times.append(time.perf_counter() - t0)
            setup.restart(master)
    finally:
        await c.stop()
    return times


def run(ctx: Context) -> list[Row]:
    n = 8_000 if ctx.quick else 30_000
    kills = 3 if ctx.quick else 10
    rates: dict[str, float] = {}
    for label, members, min_insync in (("unreplicated", 0, 1), ("group of 2, 2 acking", 2, 2),
                                        ("group of 3, 2 acking", 3, 2)):
        setup = _Setup(ctx.scratch(label.replace(" ", "_").replace(",", "")), members, min_insync)
        try:
            rates[label] = asyncio.run(_throughput(setup, n))
        finally:
            setup.stop()
    setup = _Setup(ctx.scratch("failover"), 3, 2)
    try:
        times = asyncio.run(_failovers(setup, kills))
    finally:
        setup.stop()
    base = rates["unreplicated"]
    rows = [Row(NAME, f"send 1 KiB, {CONCURRENCY} in flight, unreplicated broker", base, base * 1024 / 1e6)]
    for label in ("group of 2, 2 acking", "group of 3, 2 acking"):
        r = rates[label]
        rows.append(Row(NAME, f"send 1 KiB, {CONCURRENCY} in flight, {label}", r, r * 1024 / 1e6,
                        f"unreplicated {base:,.0f}/s", f"{r / base:.2f}x", ">= 0.5x unreplicated", r / base >= 0.5))
    med, worst = statistics.median(times), max(times)
    detail = ", ".join(f"{t:.2f}" for t in times)
    rows.append(Row(NAME, f"failover, master SIGKILL -> first acked send (median of {len(times)})", None, None,
                    "—", f"{med:.2f} s", "< 5 s", med < 5.0, note=f"failover times (s): {detail}"))
    rows.append(Row(NAME, f"failover, master SIGKILL -> first acked send (max of {len(times)})", None, None,
                    "—", f"{worst:.2f} s", "< 10 s", worst < 10.0))
    return rows
