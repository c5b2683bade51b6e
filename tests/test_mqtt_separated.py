"""The MQTT door in the separated deployment: a subscription's LMQ has a lane per broker.

Why this test: each message's LMQ entries are written by whichever broker stored
it, so a persistent session's messages are spread over every broker. When the
session reads them back from the store (offline and reconnecting; online but
behind, past ``mqtt_mem_queue_bytes``) the door must read every broker's part,
or acknowledged QoS 1 messages are never delivered. Real processes: one
nameserver, two brokers, one gateway with the MQTT door; paho as the client.
"""

from __future__ import annotations

import asyncio
from typing import Iterator

import pytest

from gateway.context import RequestContext
from unimq.local_cluster import Cluster, write_toml
from conftest import TEST_STORE_ARGS
from gateway.processor_rpc import RemoteProcessor
from mqtt_fixtures import Paho

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

CTX = RequestContext("test", client_id="mqtt-separated-tests")
N = 40
TOPICS = [f"sep{i}/x" for i in range(8)]  # eight first levels: eight store topics, spread over the brokers


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("mqtt-sep")
    # nothing kept in memory for a session that is behind, and a small window: the door
    # reads back from the store, which is what must see every broker's lane
    gw = write_toml(root / "gateway.toml", {"mqtt_mem_queue_bytes": 1, "mqtt_max_inflight": 4}, {})
    c = Cluster(root, brokers=2, gateways=1, lease_s=4.0, heartbeat_s=1.0, gateway_toml=gw,
                extra_broker_args=TEST_STORE_ARGS).start()
    yield c
    c.stop()


def _mqtt_port(c: Cluster) -> int:
    return c.gateways[0].ports["mqtt"]


def _lane_ends(c: Cluster, lmq: str) -> dict[str, int]:
    """Entries of ``lmq`` per broker, read through the gateway's processor."""

    async def main() -> dict[str, int]:
        rp = RemoteProcessor(c.gateway_rpc())
        try:
            out = {}
            for b in c.brokers:
                await rp.host_lmq(CTX, lmq, b)
                out[b] = await rp.query_offset(CTX, lmq, 0, "end", broker=b)
            return out
        finally:
            await rp.stop()

    return asyncio.run(main())


def _publish(port: int, tag: str) -> list[bytes]:
    pub = Paho(port, f"sep-pub-{tag}")
    sent = []
    for i in range(N):
        body = f"{tag}-{i}".encode()
        pub.publish(TOPICS[i % len(TOPICS)], body, qos=1)
        sent.append(body)
    pub.disconnect()
    return sent


def _check(sub: Paho, sent: list[bytes]) -> None:
    got = sub.get_n(len(sent))
    sub.nothing(1.0)  # each once
    assert sorted(m.payload for m in got) == sorted(sent)
    assert not any(m.dup for m in got)  # first deliveries
    assert all(m.qos == 1 for m in got)
    # in order per publisher and topic (each topic's messages are stored in one queue order)
    for t in TOPICS:
        mine = [m.payload for m in got if m.topic == t]
        assert mine == [b for i, b in enumerate(sent) if TOPICS[i % len(TOPICS)] == t]


def test_offline_persistent_session_gets_every_brokers_messages(cluster: Cluster) -> None:
    port = _mqtt_port(cluster)
    sub = Paho(port, "sep-off", clean=False)
    sub.subscribe("+/x", qos=1)
    sub.disconnect()
    sent = _publish(port, "off")
    ends = _lane_ends(cluster, "%LMQ%mqtt/sep-off/1")
    assert sum(ends.values()) == N and all(v > 0 for v in ends.values()), ends  # both brokers stored some
    sub.connect()
    _check(sub, sent)
    sub.disconnect()


def test_online_session_behind_reads_every_brokers_lane(cluster: Cluster) -> None:
    port = _mqtt_port(cluster)
    sub = Paho(port, "sep-on", clean=False)
    sub.subscribe("+/x", qos=1)
    sent = _publish(port, "on")
    ends = _lane_ends(cluster, "%LMQ%mqtt/sep-on/1")
    assert sum(ends.values()) == N and all(v > 0 for v in ends.values()), ends
    _check(sub, sent)
    sub.disconnect()


def test_one_topic_over_both_brokers_keeps_publish_order(cluster: Cluster) -> None:
    """A store topic with a queue on each broker: one publisher's messages alternate brokers,
    and a session reading them back (offline, or online and behind) gets them in publish order."""

    async def create() -> None:
        rp = RemoteProcessor(cluster.gateway_rpc())
        try:
            await rp.create_topic(CTX, "sepone", queues=2, exist_ok=True)
        finally:
            await rp.stop()

    asyncio.run(create())
    port = _mqtt_port(cluster)
    off = Paho(port, "sep-ord-off", clean=False)
    off.subscribe("sepone/#", qos=1)
    off.disconnect()
    on = Paho(port, "sep-ord-on", clean=False)
    on.subscribe("sepone/#", qos=1)
    pub = Paho(port, "sep-ord-pub")
    sent = [f"o-{i}".encode() for i in range(N)]
    for body in sent:
        pub.publish("sepone/x", body, qos=1)
    pub.disconnect()
    for cid in ("sep-ord-off", "sep-ord-on"):
        ends = _lane_ends(cluster, f"%LMQ%mqtt/{cid}/1")
        assert sum(ends.values()) == N and all(v > 0 for v in ends.values()), ends
    off.connect()
    for sub in (on, off):
        got = sub.get_n(N)
        sub.nothing(1.0)
        assert [m.payload for m in got] == sent
        assert not any(m.dup for m in got)
        sub.disconnect()


@pytest.mark.parametrize("how", ["stop", "kill9"])
def test_gateway_restart_keeps_every_brokers_backlog(cluster: Cluster, how: str) -> None:
    """The gateway holding a persistent session goes away (SIGTERM, or SIGKILL) and a new
    one starts: the session, kept in the brokers' door state, comes back with its lanes,
    and every message PUBACKed before is delivered from every broker's lane."""
    port = _mqtt_port(cluster)
    cid = f"sep-gw-{how}"
    sub = Paho(port, cid, clean=False)
    sub.subscribe("+/x", qos=1)
    sub.disconnect()
    sent = _publish(port, f"gw-{how}")
    ends = _lane_ends(cluster, f"%LMQ%mqtt/{cid}/1")
    assert sum(ends.values()) == N and all(v > 0 for v in ends.values()), ends
    old = cluster.gateways[0]
    if how == "stop":
        assert old.stop() == 0
    else:
        old.kill9()
    cluster.gateways[0] = cluster._spawn_gateway()
    sub = Paho(_mqtt_port(cluster), cid, clean=False)
    assert sub.connack[-1][0].session_present
    if how == "stop":
        _check(sub, sent)  # a clean stop: everything once, none flagged redelivered
    else:  # at least once: a SIGKILL may lose committed offsets, never messages
        got = sub.get_n(len(sent))
        assert {m.payload for m in got} == set(sent)
        for t in TOPICS:
            first = list(dict.fromkeys(m.payload for m in got if m.topic == t))
            assert first == [b for i, b in enumerate(sent) if TOPICS[i % len(TOPICS)] == t]
    sub.disconnect()


def test_discarded_session_leaves_no_lane_behind(cluster: Cluster) -> None:
    """A clean start discards a session whose LMQ has a lane on each broker: every lane goes,
    so a later session of the same client (whose LMQ gets the same name) starts empty."""
    port = _mqtt_port(cluster)
    cid = "sep-discard"
    sub = Paho(port, cid, clean=False)
    sub.subscribe("+/x", qos=1)
    sub.disconnect()
    _publish(port, "old")
    ends = _lane_ends(cluster, f"%LMQ%mqtt/{cid}/1")
    assert sum(ends.values()) == N and all(v > 0 for v in ends.values()), ends
    Paho(port, cid, clean=True).disconnect()  # discards the stored session and its LMQ
    sub = Paho(port, cid, clean=False)
    assert not sub.connack[-1][0].session_present
    sub.subscribe("+/x", qos=1)
    sent = _publish(port, "new")
    ends = _lane_ends(cluster, f"%LMQ%mqtt/{cid}/1")  # the same name again, holding only the new ones
    assert sum(ends.values()) == N, ends
    _check(sub, sent)  # only the new messages: nothing of the discarded session's lanes
    sub.disconnect()
