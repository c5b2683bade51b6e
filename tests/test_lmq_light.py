"""Light message queues at fleet scale: paho clients against `unimq up`, real files.

Why: every QoS 1 subscription has its own LMQ (``%LMQ%mqtt/<client>/<n>``), and a
fleet subscribes by the ten thousand. An LMQ must cost no topic-table entry, no
topics.json write and no nameserver route, yet the first message to each new
subscription must arrive, and a discarded session's LMQ files must go with it.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from core_broker.light_queue import stored_names
from mqtt_fixtures import Paho, config_file, start_unimq, wait_for
from nameserver.client import NameserverClient, parse_addresses
from unimq.local_cluster import Cluster
from conftest import TEST_STORE_ARGS

pytestmark = pytest.mark.timeout(300)

SUBS = 10_000
PER_CLIENT = 500
CHUNK = 100  # topic filters per SUBSCRIBE packet


def _lmq_dirs(data_dir: Path) -> set[str]:
    """The LMQs the (merged) store holds on disk: since issue 21 in one shared log, no
    directory each (what the store's last checkpoint, once a second, wrote)."""
    return {n for n in stored_names(data_dir / "consumequeue") if n.startswith("%LMQ%")}


def test_ten_thousand_qos1_subscriptions_first_message_each(tmp_path_factory) -> None:
    srv = start_unimq(tmp_path_factory, "--config", config_file(tmp_path_factory.mktemp("cfg")))
    port = srv.ports["mqtt"]
    clients: list[Paho] = []
    pub = None
    try:
        t0 = time.monotonic()
        topics = [f"fleet/{i}/cmd" for i in range(SUBS)]
        for k in range(0, SUBS, PER_CLIENT):
            c = Paho(port, f"fleet-{k // PER_CLIENT}")
            mine = topics[k : k + PER_CLIENT]
            for j in range(0, len(mine), CHUNK):
                c.c.subscribe([(t, 1) for t in mine[j : j + CHUNK]])
            clients.append(c)
        assert wait_for(lambda: all(len(c.subacks) == PER_CLIENT // CHUNK for c in clients), 120)
        for c in clients:
            assert all(rc.value == 1 for acks in c.subacks for rc in acks)  # granted QoS 1
        pub = Paho(port, "fleet-pub", connect=False)
        pub.c.max_inflight_messages_set(0)  # no client-side cap: the broker is measured
        pub.connect()
        for i, t in enumerate(topics):
            pub.c.publish(t, str(i).encode(), qos=1)

        def delivered() -> int:
            return sum(c.messages.qsize() for c in clients)

        assert wait_for(lambda: delivered() >= SUBS, 180), f"{delivered()} of {SUBS} delivered"
        elapsed = time.monotonic() - t0
        for k, c in enumerate(clients):
            got = [c.messages.get_nowait() for _ in range(c.messages.qsize())]
            assert sorted(m.topic for m in got) == sorted(topics[k * PER_CLIENT : (k + 1) * PER_CLIENT])
            assert all(m.payload == m.topic.split("/")[1].encode() and m.qos == 1 for m in got)
        print(f"{SUBS} QoS 1 subscriptions, first message each: {elapsed:.1f} s")

        # no LMQ in the topic table, on disk or as served
        data = Path(srv.data_dir)
        tables = list(data.rglob("topics.json"))
        assert tables
        for p in tables:
            assert not [n for n in json.loads(p.read_text() or "{}") if n.startswith("%LMQ%")]
        assert wait_for(lambda: len([n for n in _lmq_dirs(data) if n.startswith("%LMQ%mqtt/fleet-")]) == SUBS, 30)

        # a discarded session (clean session, disconnected): its LMQs' files are gone
        gone = clients.pop(0)
        gone.disconnect()
        prefix = f"%LMQ%mqtt/{gone.client_id}/"
        assert wait_for(lambda: not [n for n in _lmq_dirs(data) if n.startswith(prefix)], 60)
        left = _lmq_dirs(data)
        assert len([n for n in left if n.startswith("%LMQ%mqtt/fleet-")]) == SUBS - PER_CLIENT
    finally:
        srv.stop(timeout=60)  # first: 9,500 clean sessions ending one by one would only slow the stop
        for c in [*clients, *([pub] if pub else [])]:
            c.c.loop_stop()


def _brokers_lmqs(root: Path, brokers: list[str], prefix: str) -> dict[str, set[str]]:
    out = {}
    for b in brokers:
        out[b] = {n for n in stored_names(root / b / "consumequeue") if n.startswith(prefix)}
    return out


def test_separated_lmq_parts_on_every_broker_go_with_the_session(tmp_path_factory) -> None:
    """Two brokers: a subscription's LMQ has a part on each broker that stored a message for
    it; the nameservers route no LMQ, no broker's topics.json lists one, and when the
    session is discarded every broker's part is deleted."""
    root = tmp_path_factory.mktemp("lmq-sep")
    c = Cluster(root, brokers=2, gateways=1, lease_s=4.0, heartbeat_s=1.0, extra_broker_args=TEST_STORE_ARGS).start()
    try:
        port = c.gateways[0].ports["mqtt"]
        topics = [f"lsep{i}/x" for i in range(8)]  # eight first levels: spread over the brokers
        sub = Paho(port, "lsep-sub")
        sub.subscribe("+/x", qos=1)
        pub = Paho(port, "lsep-pub")
        for i in range(40):
            pub.publish(topics[i % 8], str(i).encode(), qos=1)
        got = sub.get_n(40)
        assert sorted(int(m.payload) for m in got) == list(range(40))
        brokers = sorted(c.brokers)
        prefix = "%LMQ%mqtt/lsep-sub/"
        # both brokers hold a part of the LMQ (on disk after their next checkpoint)
        assert wait_for(lambda: all(_brokers_lmqs(root, brokers, prefix).values()), 30), _brokers_lmqs(root, brokers, prefix)

        async def routed() -> list[str]:
            ns = NameserverClient(parse_addresses(c.namesrv))
            try:
                return [t for b in await ns.call_any("list_brokers") for t in b.get("topics", {})]
            finally:
                await ns.close()

        names = asyncio.run(routed())
        assert names and not [t for t in names if t.startswith("%LMQ%")]
        for b in brokers:
            for p in (root / b).rglob("topics.json"):
                assert not [n for n in json.loads(p.read_text() or "{}") if n.startswith("%LMQ%")]
        sub.disconnect()  # clean session: discarded
        assert wait_for(lambda: not any(_brokers_lmqs(root, brokers, prefix).values()), 30)
        pub.disconnect()
    finally:
        c.stop()
