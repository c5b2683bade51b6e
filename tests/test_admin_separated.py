"""The admin API in the separated deployment (nameserver, two brokers, a gateway as real processes):
groups and resets span brokers, the cluster page lists them, the processor RPC serves the admin
calls; and in one process, a reset survives a restart (it is journaled)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from core_broker.model import Message
from gateway.api import ClusterView, GroupQueueStats
from gateway.context import RequestContext
from gateway.processor_rpc import RemoteProcessor
from unimq.local_cluster import Cluster
from conftest import TEST_STORE_ARGS

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
