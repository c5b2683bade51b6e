"""The admin API in the separated deployment (nameserver, two brokers, a gateway as real processes):
groups and resets span brokers, the cluster page lists them, the processor RPC serves the admin
calls; a replicated cluster's groups show on the cluster page and in /metrics; and in one
process, a reset survives a restart (it is journaled)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest

from core_broker.model import Message
from gateway.api import ClusterView, GroupQueueStats
from gateway.context import RequestContext
from gateway.processor_rpc import RemoteProcessor
from unimq.local_cluster import Cluster
from conftest import REPO_ROOT, TEST_STORE_ARGS

CTX = RequestContext("test", client_id="admin-separated")


@pytest.fixture
def cluster(tmp_path: Any) -> Any:
    c = Cluster(tmp_path, brokers=2, gateways=1, lease_s=4.0, heartbeat_s=1.0, extra_broker_args=TEST_STORE_ARGS).start()
    yield c
    c.stop()


@pytest.mark.timeout(240)
def test_groups_reset_and_cluster_across_brokers(cluster: Any) -> None:
    gw = cluster.gateways[0]
    rp = RemoteProcessor(cluster.gateway_rpc())

    async def prepare() -> list[str]:
        await rp.create_topic(CTX, "orders", queues=2)
        sent = await rp.send(CTX, [Message("orders", f"m{i}".encode()) for i in range(20)])
        assert {r.broker for r in sent} == {"broker-a", "broker-b"}
        got: list[Any] = []
        while len(got) < 20:
            got += await rp.pop(CTX, "billing", "orders", 32, 30_000, wait_ms=500)
        await rp.ack_batch(CTX, "billing", "orders", [p.receipt_handle for p in got])
        # the admin calls over the processor RPC
        rows = [GroupQueueStats(*r) for r in await rp.consumer_groups(CTX)]
        mine = [r for r in rows if r.group == "billing" and r.topic == "orders"]
        assert {r.broker for r in mine} == {"broker-a", "broker-b"} and sum(r.lag for r in mine) == 0
        view = ClusterView(*await rp.cluster(CTX))
        assert sorted(b[0] for b in view.brokers) == ["broker-a", "broker-b"] and view.nameservers == [cluster.namesrv]
        return sorted(r.message_id for r in sent)

    sent_ids = asyncio.run(prepare())
    with httpx.Client(base_url=f"http://127.0.0.1:{gw.ports['http']}", timeout=20) as h:
        g = h.get("/v1/admin/groups/billing").json()
        assert g["lag"] == 0 and {q["broker"] for q in g["queues"]} == {"broker-a", "broker-b"}
        c = h.get("/v1/admin/cluster").json()
        assert [b["name"] for b in c["brokers"]] == ["broker-a", "broker-b"] and all(b["live"] for b in c["brokers"])
        assert c["nameservers"] == [cluster.namesrv]
        r = h.post("/v1/admin/groups/billing/reset", json={"topic": "orders", "offset": 0})
        assert r.status_code == 200 and sorted(q["queue_id"] for q in r.json()["queues"]) == [0, 1]  # one per broker
        assert h.get("/v1/admin/groups/billing").json()["lag"] == 20
        o = h.get("/v1/admin/overview").json()
        assert o["store"]["commitlog_bytes"] > 0 and len(o["brokers"]) == 2

    async def again() -> list[str]:
        got: list[Any] = []
        for _ in range(40):
            got += await rp.pop(CTX, "billing", "orders", 32, 30_000, wait_ms=500)
            if len(got) >= 20:
                break
        return sorted(p.message.message_id for p in got)

    assert asyncio.run(again()) == sent_ids


def test_a_reset_survives_a_restart(unimq_server: Any) -> None:
    srv = unimq_server()
    with httpx.Client(base_url=srv.url(), timeout=20) as h:
        ids = sorted(h.post("/v1/topics/t/messages", content=f"m{i}".encode()).json()["message_id"] for i in range(6))
        got = h.post("/v1/topics/t/groups/g/pop", params={"max": 32}).json()["messages"]
        h.post("/v1/topics/t/groups/g/ack", json={"receipt_handles": [m["receipt_handle"] for m in got]})
        assert h.post("/v1/admin/groups/g/reset", json={"topic": "t", "offset": 0}).status_code == 200
    assert srv.stop() == 0
    srv2 = unimq_server(data_dir=srv.data_dir)
    with httpx.Client(base_url=srv2.url(), timeout=20) as h:
        assert h.get("/v1/admin/groups/g").json()["lag"] == 6
        again = h.post("/v1/topics/t/groups/g/pop", params={"max": 32}).json()["messages"]
        assert sorted(m["message_id"] for m in again) == ids


@pytest.mark.timeout(240)
def test_replicated_groups_on_the_cluster_page_and_in_metrics(tmp_path: Any) -> None:
    """`unimq cluster up` points its gateway's admin API at the controllers: the cluster page
    shows the group's master and in-sync set, /metrics the members' replication lag."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "unimq", "cluster", "up", "--data-dir", str(tmp_path), "--groups", "1",
         "--replicas", "3", "--http-port", "0", "--grpc-port", "0", "--mqtt-port", "0", "--amqp-port", "0",
         *TEST_STORE_ARGS],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("unimq: ready"):
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert ready.wait(120), "".join(lines[-30:])
        http = int(re.search(r"unimq: http listening on 127\.0\.0\.1:(\d+)", "".join(lines)).group(1))  # type: ignore[union-attr]
        with httpx.Client(base_url=f"http://127.0.0.1:{http}", timeout=20) as h:
            deadline = time.monotonic() + 90
            while True:  # the group elects a master and its members report their offsets
                c = h.get("/v1/admin/cluster").json()
                groups = c["groups"]
                if groups and groups[0]["master"] and len(groups[0]["in_sync"]) >= 2 and \
                        all(m["offset"] is not None for m in groups[0]["members"]):
                    break
                assert time.monotonic() < deadline, c
                time.sleep(0.5)
            g = groups[0]
            assert c["controller_error"] is None and len(g["members"]) == 3
            assert [m["role"] for m in g["members"]].count("master") == 1
            assert all(m["lag"] is not None and m["lag"] >= 0 for m in g["members"])
            assert h.get("/v1/admin/overview").json()["replication"][0]["members"] == 3
            text = h.get("/metrics").text
            assert len(re.findall(r"^unimq_replication_lag_bytes\{", text, re.M)) == 3
            assert len(re.findall(r"^unimq_replication_in_sync\{.*\} 1\.0$", text, re.M)) >= 2
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
