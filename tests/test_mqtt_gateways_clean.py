"""Several gateways: clean sessions, QoS 0 and shared subscriptions across gateways (issue 21;
adapters/mqtt/tail.py, adapters/mqtt/fleet_share.py).

Real processes (one nameserver, two brokers, two gateways started with the documented
command) and real paho clients: a subscriber on one gateway must get what a publisher on
the other sends, in order and once, as on one gateway.
"""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest

from conftest import TEST_STORE_ARGS
from adapters.mqtt import codec as C
from mqtt_fixtures import Paho, RawClient, wait_for
from unimq.local_cluster import Cluster, Proc, write_toml

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

NEVER = 0xFFFFFFFF


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("mqtt-gws-clean")
    gw = write_toml(root / "gateway.toml", {"mqtt_takeover_timeout_s": 5.0}, {})
    c = Cluster(root, brokers=2, gateways=2, gateway_toml=gw, extra_broker_args=TEST_STORE_ARGS).start()
    yield c
    c.stop()


def _port(g: Proc) -> int:
    return g.ports["mqtt"]


def _reaches(pub: Paho, sub: Paho, topic: str) -> None:
    """Wait until ``pub``'s publishes reach ``sub`` (the gateways see each other alive within a
    second or two of starting), then let what is still on its way arrive and drop it."""

    def one() -> bool:
        pub.publish(topic, b"probe-" + uuid.uuid4().hex.encode(), qos=0)
        try:
            sub.get(timeout=0.5)
            return True
        except AssertionError:
            return False

    wait_for(one, timeout=30.0, what=f"{topic} to reach the other gateway's subscriber")
    while True:
        try:
            sub.get(timeout=1.5)
        except AssertionError:
            break


def _publish_mixed(pub: Paho, under: str, tag: str, n: int) -> list[tuple[bytes, int]]:
    """``n`` messages over three topics under ``under``, QoS 0 and 1 in turn: (body, QoS) as sent."""
    sent = []
    for i in range(n):
        body = f"{tag}-{i}".encode()
        pub.publish(f"{under}/{i % 3}", body, qos=i % 2)
        sent.append((body, i % 2))
    return sent


def _fleet(a: Proc, b: Proc) -> None:
    """Wait until ``a`` and ``b`` see each other alive (a publish through ``a`` reaches a
    subscriber on ``b``: ``a`` stamps what it stores, ``b`` tails)."""
    sub, pub = Paho(_port(b)), Paho(_port(a))
    sub.subscribe("fleetprobe/#", qos=0)
    _reaches(pub, sub, "fleetprobe/x")
    sub.disconnect()
    pub.disconnect()


def test_clean_subscriber_gets_another_gateways_qos0_and_qos1_in_order_once(cluster: Cluster) -> None:
    a, b = cluster.gateways
    sub = Paho(_port(a), "clean-sub-" + uuid.uuid4().hex[:6])  # clean session, 3.1.1
    sub.subscribe("cleanx/#", qos=1)
    pub = Paho(_port(b))
    _reaches(pub, sub, "cleanx/probe")
    sent = _publish_mixed(pub, "cleanx/dev", "m", 40)
    got = sub.get_n(len(sent))
    assert [(m.payload, m.qos) for m in got] == sent  # in order, QoS as published (under the sub's 1)
    sub.nothing(1.5)  # none twice
    # a publisher on the subscriber's own gateway: delivered there once, not again from the tail
    local = Paho(_port(a))
    local.publish("cleanx/local", b"here", qos=1)
    assert sub.get().payload == b"here"
    sub.nothing(1.5)
    # an unsubscribe stops it
    unsubacks: list[int] = []
    sub.c.on_unsubscribe = lambda c, u, mid, rcs, props: unsubacks.append(mid)
    sub.c.unsubscribe("cleanx/#")
    wait_for(lambda: unsubacks, what="the UNSUBACK")
    pub.publish("cleanx/after", b"not for you", qos=1)
    pub.publish("cleanx/after", b"not for you", qos=0)
    sub.nothing(2.0)
    for c in (sub, pub, local):
        c.disconnect()


def test_qos0_reaches_a_persistent_session_on_the_other_gateway_once(cluster: Cluster) -> None:
    """A persistent session's QoS 0 subscription's deliveries come from the tail; its QoS 1 one's
    through its queue (the publishing gateway's routing copy), a QoS 0 publish too -- each once."""
    a, b = cluster.gateways
    sub = Paho(_port(a), "pers-" + uuid.uuid4().hex[:6], v5=True, clean=False, session_expiry=NEVER)
    sub.subscribe("persq/#", qos=1)
    sub.subscribe("persz/#", qos=0)
    pub = Paho(_port(b))
    _reaches(pub, sub, "persz/probe")
    pub.publish("persq/x", b"q1", qos=1)  # queue path
    pub.publish("persq/x", b"q0", qos=0)  # QoS 0 to a QoS 1 subscription: its queue too
    pub.publish("persz/x", b"z1", qos=1)  # downgraded to the subscription's 0: tail
    got = sorted((m.payload, m.qos) for m in sub.get_n(3))
    assert got == [(b"q0", 0), (b"q1", 1), (b"z1", 0)]
    sub.nothing(1.5)
    sub.disconnect()
    pub.disconnect()


def test_qos0_reaches_a_persistent_qos1_subscription_on_the_other_gateway_through_its_queue(
        cluster: Cluster) -> None:
    """A persistent session with only QoS 1 subscriptions makes its gateway tail nothing (every
    gateway's routing copy of it puts each message in its queue, QoS 0 too): QoS 0 publishes at
    the other gateway still reach it, at QoS 0, each once, beside the QoS 1 ones."""
    a, b = cluster.gateways
    sub = Paho(_port(a), "personly-" + uuid.uuid4().hex[:6], v5=True, clean=False, session_expiry=NEVER)
    sub.subscribe("personly/#", qos=1)
    pub = Paho(_port(b))
    _reaches(pub, sub, "personly/probe")  # (QoS 0 probes: once b's copy says online at a)
    sent = _publish_mixed(pub, "personly/dev", "p", 30)
    got = sub.get_n(len(sent))
    assert sorted((m.payload, m.qos) for m in got) == sorted(sent)  # QoS as published (under the sub's 1)
    sub.nothing(1.5)  # none twice
    # the same through a clean subscriber's demand beside it: the tail now reads the topic at a,
    # and still leaves the persistent session's messages to its queue
    clean = Paho(_port(a), "personly-clean-" + uuid.uuid4().hex[:6])
    clean.subscribe("personly/#", qos=0)
    _reaches(pub, clean, "personly/probe2")
    while True:  # the probes reached the persistent session too
        try:
            sub.get(timeout=1.5)
        except AssertionError:
            break
    pub.publish("personly/dev/9", b"both", qos=0)
    assert clean.get().payload == b"both"
    m = sub.get()
    assert (m.payload, m.qos) == (b"both", 0)
    sub.nothing(1.5)
    for c in (sub, pub, clean):
        c.disconnect()


def test_shared_group_across_two_gateways_gets_each_message_once(cluster: Cluster) -> None:
    a, b = cluster.gateways
    _fleet(a, b)
    # a member on A only, publishes through B (a gateway without members): every one to it
    members = [Paho(_port(a), "shr-a-" + uuid.uuid4().hex[:6])]
    members[0].subscribe("$share/grp/shr/#", qos=1)
    pubs = [Paho(_port(a)), Paho(_port(b))]
    first = [f"only-a-{i}".encode() for i in range(10)]
    for i, body in enumerate(first):
        pubs[1].publish("shr/dev/x", body, qos=i % 2)
    assert sorted(m.payload for m in members[0].get_n(len(first))) == sorted(first)
    members[0].nothing(1.5)
    # members on both gateways, publishes through both
    members.append(Paho(_port(b), "shr-b-" + uuid.uuid4().hex[:6]))
    members[1].subscribe("$share/grp/shr/#", qos=1)
    sent = []
    for i in range(60):
        body = f"s-{i}".encode()
        pubs[i % 2].publish(f"shr/dev/{i % 5}", body, qos=(i // 2) % 2)  # QoS 0 and 1 through both
        sent.append(body)
    got: list[bytes] = []
    wait_for(lambda: len(members[0].received) + len(members[1].received) >= len(sent), timeout=30.0,
             what="every message at one of the members")
    for m in members:  # what each one got, and nothing more within 1.5 s
        while True:
            try:
                got.append(m.get(timeout=1.5).payload)
            except AssertionError:
                break
    assert sorted(got) == sorted(sent)  # each message once, in the whole fleet
    for c in members + pubs:
        c.disconnect()


def test_a_filter_with_a_wildcard_first_level_gets_other_gateways_messages(cluster: Cluster) -> None:
    """``+/...`` and ``#`` need every store topic: the tail lists them, and reads one made after
    the subscription from its start."""
    a, b = cluster.gateways
    _fleet(a, b)
    sub = Paho(_port(a))
    sub.subscribe("+/wildx/#", qos=1)
    pub = Paho(_port(b))
    topic = "wt" + uuid.uuid4().hex[:8] + "/wildx/1"  # a store topic made after the SUBSCRIBE
    pub.publish(topic, b"first", qos=1)
    assert sub.get(timeout=30.0).payload == b"first"
    sent = [f"w-{i}".encode() for i in range(10)]
    for i, body in enumerate(sent):
        pub.publish(topic, body, qos=i % 2)
    assert [m.payload for m in sub.get_n(len(sent))] == sent
    sub.nothing(1.5)
    sub.disconnect()
    pub.disconnect()


def test_a_clean_client_id_connecting_at_another_gateway_closes_the_old_connection(cluster: Cluster) -> None:
    a, b = cluster.gateways
    _fleet(b, a)  # b tells a
    cid = "dup-" + uuid.uuid4().hex[:6]
    old = RawClient(_port(a), C.MQTT_5)
    assert old.connect(cid, clean=True).reason_code == 0
    new = RawClient(_port(b), C.MQTT_5)
    assert new.connect(cid, clean=True).reason_code == 0
    got = old.closed_by_server()
    assert any(isinstance(p, C.Disconnect) and p.reason_code == 0x8E for p in got), got
    old.close()
    # the new connection stays
    new.send(C.PingReq())
    assert new.recv_type(C.PingResp)
    new.close()
