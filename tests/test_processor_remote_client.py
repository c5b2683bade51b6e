"""The remote broker client implements the whole BrokerClient protocol, for real.

A nameserver and two brokers served over RPC in this process (real sockets on
free ports, real stores in temp directories), a ``MessagingProcessor`` over a
``RemoteBrokerClient``: the calls the client once lacked (consumer lag and store
figures, summed over the brokers; hosting an LMQ queue on a broker) answer, and
the capabilities it declares absent give the declared answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import pytest

from core_broker.broker_server import BrokerServer
from core_broker.config import BrokerConfig
from gateway.context import RequestContext
from gateway.processor import MessagingProcessor
from gateway.remote_broker_client import RemoteBrokerClient
from nameserver.server import NameServer

from processor_fixtures import broker_config, msg, processor_config, store_config

CTX = RequestContext(protocol="test", client_id="remote-client-suite")


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[MessagingProcessor, RemoteBrokerClient, list[BrokerServer]]]:
    ns = NameServer(lease_s=30.0)
    ns_addr = await ns.start("127.0.0.1", 0)
    brokers = []
    for name in ("broker-a", "broker-b"):
        bc: BrokerConfig = broker_config(broker_name=name)
        b = BrokerServer(store_config(tmp_path / name), bc, [ns_addr], heartbeat_s=30.0)
        await b.start("127.0.0.1", 0)
        brokers.append(b)
    client = RemoteBrokerClient([ns_addr])
    p = MessagingProcessor(client, processor_config(store_config(tmp_path / "gw")))
    await p.start()
    try:
        yield p, client, brokers
    finally:
        await p.stop()
        for b in brokers:
            await b.stop()
        await ns.stop()


async def test_lag_and_store_figures_are_summed_over_the_brokers(cluster) -> None:
    p, _, brokers = cluster
    await p.create_topic(CTX, "t", queues=4)  # two queues on each broker
    await p.send(CTX, [msg("t", str(i)) for i in range(40)])
    popped = await p.pop(CTX, "g", "t", 32, 30_000)
    for m in popped:
        await p.ack(CTX, "g", "t", m.receipt_handle)
    each = [b.controller.consumer_lag() for b in brokers]
    assert all(rows for rows in each), "both brokers hold part of the topic"
    lag = await p.consumer_lag(CTX)
    assert lag == [("g", "t", sum(n for rows in each for g, t, n in rows if (g, t) == ("g", "t")))]
    assert lag[0][2] == 40 - len(popped)
    stats = await p.store_stats(CTX)
    assert stats["commitlog_bytes"] == sum(b.controller.store_stats()["commitlog_bytes"] for b in brokers) > 0
    assert len(stats["flush_counts"]) == len(brokers[0].controller.store_stats()["flush_counts"])


async def test_an_lmq_is_hosted_on_the_broker_named(cluster) -> None:
    p, client, brokers = cluster
    await p.host_lmq(CTX, "%LMQ%sub-1", "broker-b")
    assert brokers[1].controller.get_topic("%LMQ%sub-1") is not None
    assert brokers[0].controller.get_topic("%LMQ%sub-1") is None
    await p.host_lmq(CTX, "%LMQ%sub-1", "broker-b")  # again: nothing changes, no error


async def test_declared_absent_capabilities_answer_as_declared(cluster) -> None:
    p, client, _ = cluster
    await p.send(CTX, [msg("t2", b"x")])
    assert client.reads_raw is False
    assert client.route_nowait("t2") is None  # routes always come through route()
    assert await p.pull_raw(CTX, "t2", 0, 0, 10) is None  # the reader falls back to pull
    route = await p.query_route(CTX, "t2")
    got = [m.body for q in route.queues for m in (await p.pull(CTX, "t2", q.queue_id, 0)).messages]
    assert got == [b"x"]
