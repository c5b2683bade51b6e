"""Replicated broker groups as real processes on 127.0.0.1 (issue 16).

One controller (`unimq controller`, a single Raft node), one nameserver, a group of three
brokers (`unimq broker --group g`, two acknowledging: --min-insync-replicas 2, sync flush,
small segments so the log rolls), and a gateway with its HTTP door. Messages are posted over
HTTP (a 2xx is the acknowledgement), the master is killed with SIGKILL, and what was
acknowledged is read back through the gateway from the new master.
"""

from __future__ import annotations

import asyncio
import base64
import filecmp
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from nameserver.controller_client import ControllerClient, GroupState
from tests.test_controller_raft import _free_ports
from unimq.local_cluster import Proc, start_proc

SEGMENT = 256 * 1024
BROKER_SETS = ["--set", f"store.commitlog_segment_size={SEGMENT}", "--set", "store.cq_entries_per_file=4096",
               "--set", "store.index_slots=4096", "--set", "store.index_entries_per_file=16384"]


class Group:
    def __init__(self, root: Path) -> None:
        self.root = root
        raft, ctl = _free_ports(2)
        self.ctl_port = ctl
        self.controller = start_proc("controller", [
            "controller", "--controller-port", str(ctl), "--data-dir", str(root / "ctl"),
            "--raft-addr", f"127.0.0.1:{raft}", "--peers", f"127.0.0.1:{raft}", "--secret", "s3",
            "--lease-ms", "2000"])
        self.nameserver = start_proc("nameserver", ["nameserver", "--port", "0"])
        self.namesrv = f"127.0.0.1:{self.nameserver.ports['namesrv']}"
        self.brokers: dict[str, Proc] = {}
        for b in ("b1", "b2", "b3"):
            self.start_broker(b)
        self.gateway = start_proc("gateway", ["gateway", "--namesrv", self.namesrv, "--rpc-port", "0", "--http-port",
                                              "0", "--mqtt-port", "0", "--amqp-port", "0", "--grpc-port", "0",
                                              "--mqtt-ws-port", "-1"])
        self.http = f"http://127.0.0.1:{self.gateway.ports['http']}"

    def start_broker(self, b: str, *extra: str) -> Proc:
        p = start_proc(b, ["broker", "--data-dir", str(self.root / b), "--port", "0", "--namesrv", self.namesrv,
                           "--group", "g", "--broker-id", b, "--controller-addr", f"127.0.0.1:{self.ctl_port}",
                           "--min-insync-replicas", "2", "--flush", "sync", "--heartbeat-s", "1",
                           "--set", "replica_lag_max_ms=1500", *BROKER_SETS, *extra])
        self.brokers[b] = p
        return p

    def stop(self) -> None:
        for p in [self.gateway, *self.brokers.values(), self.nameserver, self.controller]:
            p.stop()

    async def state(self) -> GroupState:
        c = ControllerClient([("127.0.0.1", self.ctl_port)], timeout_s=2.0)
        await c.start()
        try:
            return await c.group_state("g")
        finally:
            await c.stop()

    async def wait_offsets_equal(self, timeout: float = 30.0) -> None:
        """Until every member reported the same log end to the controller."""
        c = ControllerClient([("127.0.0.1", self.ctl_port)], timeout_s=2.0)
        await c.start()
        try:
            deadline = time.monotonic() + timeout
            offsets: object = None
            while time.monotonic() < deadline:
                offsets = (await c.cluster_report())["g"].get("offsets", {})
                vals = set(offsets.values()) if isinstance(offsets, dict) else set()
                if len(offsets) == 3 and len(vals) == 1 and None not in vals:
                    return
                await asyncio.sleep(0.2)
            raise AssertionError(f"members' log ends differ: {offsets}")
        finally:
            await c.stop()

    async def wait_state(self, pred: Any, what: str, timeout: float = 30.0) -> GroupState:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                st = await self.state()
                last = st
                if pred(st):
                    return st
            except Exception as e:  # noqa: BLE001 - the controller starting, a group not known yet
                last = e
            await asyncio.sleep(0.2)
        logs = "\n".join(f"--- {b} (exit {p.popen.poll()}):\n{p.tail()}" for b, p in self.brokers.items())
        raise AssertionError(f"{what}: {last}\n{logs}")


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 30.0) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = r.read()
            return r.status, json.loads(data) if data else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def post(g: Group, topic: str, body: bytes) -> int:
    return http("POST", f"{g.http}/v1/topics/{topic}/messages", body)[0]


def read_all(g: Group, topic: str) -> list[bytes]:
    """Every message of every queue of ``topic``, through the gateway."""
    status, desc = http("GET", f"{g.http}/v1/topics/{topic}")
    assert status == 200, desc
    out: list[bytes] = []
    for q in desc["queues"]:
        off = q["min_offset"]
        while off < q["max_offset"]:
            status, page = http("GET", f"{g.http}/v1/topics/{topic}/queues/{q['queue_id']}/messages?offset={off}&max=256")
            assert status == 200, page
            msgs = page["messages"]
            if not msgs:
                break
            out += [base64.b64decode(m["body_base64"]) for m in msgs]
            off = page["next_offset"]
    return out


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    g = Group(tmp_path)
    try:
        asyncio.run(g.wait_state(lambda s: s.master_id is not None and len(s.in_sync) == 3, "all three in sync"))
        yield g
    finally:
        g.stop()


def _segments(d: Path) -> list[Path]:
    return sorted((d / "commitlog").iterdir())


@pytest.mark.timeout(180)
def test_replicas_hold_the_masters_log_byte_for_byte(group: Group) -> None:
    g = group
    for i in range(1200):  # ~1.3 MB of records: several segment rolls
        assert post(g, "rep", f"message {i:05d} ".encode() * 60) == 200
    st = asyncio.run(g.state())
    master = st.master_id
    # min_insync 2: one replica may trail the acknowledgements; wait until both hold the master's end
    asyncio.run(g.wait_offsets_equal())
    g.stop()  # clean stops: every member's log flushed
    logs = {b: _segments(g.root / b) for b in ("b1", "b2", "b3")}
    names = {b: [p.name for p in v] for b, v in logs.items()}
    assert names["b1"] == names["b2"] == names["b3"], names
    assert len(names["b1"]) >= 5
    for b in ("b1", "b2", "b3"):
        if b == master:
            continue
        for a, c in zip(logs[master], logs[b]):
            assert filecmp.cmp(a, c, shallow=False), f"{c} differs from the master's {a}"


@pytest.mark.timeout(240)
def test_failover_keeps_every_acknowledged_message_and_the_topic(group: Group) -> None:
    g = group
    status, _ = http("POST", f"{g.http}/v1/topics", json.dumps({"name": "kept", "queues": 4}).encode(),
                     {"content-type": "application/json"})
    assert status in (200, 201), status
    acked = []
    for i in range(300):
        body = f"m-{i}".encode()
        if post(g, "kept", body) == 200:
            acked.append(body)
    assert len(acked) == 300
    st = asyncio.run(g.state())
    old = st.master_id
    assert old is not None
    g.brokers[old].kill9()
    new = asyncio.run(g.wait_state(lambda s: s.master_id not in (None, old), "a new master", 30))
    assert new.master_epoch > st.master_epoch
    # the gateway retries a send that failed on the old master against the new one
    status, err = http("POST", f"{g.http}/v1/topics/kept/messages", b"after")
    assert status == 200, (status, err)
    got = read_all(g, "kept")
    missing = [b for b in acked if b not in got]
    assert not missing, f"{len(missing)} acknowledged messages missing after failover, e.g. {missing[:3]}"
    assert len([b for b in got if b.startswith(b"m-")]) == len(set(b for b in got if b.startswith(b"m-")))
    # the old master comes back as a replica, cuts what it must, and catches up
    g.start_broker(old)
    asyncio.run(g.wait_state(lambda s: old in s.in_sync and len(s.in_sync) == 3, "the old master back in sync", 40))


@pytest.mark.timeout(240)
def test_puts_refused_while_too_few_replicas_are_in_sync(group: Group) -> None:
    g = group
    st = asyncio.run(g.state())
    replicas = [b for b in ("b1", "b2", "b3") if b != st.master_id]
    for b in replicas:
        g.brokers[b].kill9()
    asyncio.run(g.wait_state(lambda s: s.in_sync == frozenset({st.master_id}), "replicas out of the in-sync set", 30))
    status, err = http("POST", f"{g.http}/v1/topics/lonely/messages", b"x")
    assert status == 503 and err["error"] == "NOT_ENOUGH_REPLICAS", (status, err)
    g.start_broker(replicas[0])
    asyncio.run(g.wait_state(lambda s: len(s.in_sync) == 2, "a replica back in sync", 40))
    deadline = time.monotonic() + 20
    while post(g, "lonely", b"y") != 200:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert b"x" not in read_all(g, "lonely")
