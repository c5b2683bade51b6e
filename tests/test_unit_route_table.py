"""RouteTable: routes of registered brokers under a lease, with an injected clock."""

from __future__ import annotations

import pytest

from nameserver.route_table import PERM_READ, PERM_RW, PERM_WRITE, RouteTable

pytestmark = pytest.mark.timeout(30)

T0 = 1000.0


def topics(**queues: int) -> dict[str, dict]:
    return {name: {"queues": n} for name, n in queues.items()}


def test_a_route_lists_every_broker_serving_the_topic_sorted_by_name() -> None:
    rt = RouteTable(lease_s=30)
    rt.register("broker-b", "10.0.0.2:10911", PERM_RW, {"orders": {"queues": 4, "queue_base": 4, "type": "FIFO"}}, now=T0)
    rt.register("broker-a", "10.0.0.1:10911", PERM_RW, {"orders": {"queues": 4, "type": "FIFO"}, "other": {"queues": 1}},
                now=T0)
    rt.register("broker-c", "10.0.0.3:10911", PERM_RW, topics(unrelated=2), now=T0)
    r = rt.route("orders", now=T0 + 1)
    assert r == {
        "topic": "orders",
        "type": "FIFO",
        "queues": [
            {"broker": "broker-a", "address": "10.0.0.1:10911", "queue_base": 0, "queues": 4, "perm": PERM_RW},
            {"broker": "broker-b", "address": "10.0.0.2:10911", "queue_base": 4, "queues": 4, "perm": PERM_RW},
        ],
    }


def test_an_unknown_topic_has_no_route() -> None:
    rt = RouteTable()
    assert rt.route("nothing", now=T0) is None
    rt.register("b", "h:1", PERM_RW, topics(t=1), now=T0)
    assert rt.route("nothing", now=T0) is None


def test_the_type_defaults_to_normal() -> None:
    rt = RouteTable()
    rt.register("b", "h:1", PERM_RW, topics(t=2), now=T0)
    assert rt.route("t", now=T0)["type"] == "NORMAL"


@pytest.mark.parametrize(
    "broker_perm, topic_perm, expected",
    [(PERM_RW, PERM_RW, PERM_RW), (PERM_READ, PERM_RW, PERM_READ), (PERM_RW, PERM_WRITE, PERM_WRITE),
     (PERM_READ, PERM_WRITE, 0), (0, PERM_RW, 0)],
)
def test_a_queues_permission_is_the_topics_limited_by_the_brokers(broker_perm: int, topic_perm: int,
                                                                   expected: int) -> None:
    rt = RouteTable()
    rt.register("b", "h:1", broker_perm, {"t": {"queues": 1, "perm": topic_perm}}, now=T0)
    assert rt.route("t", now=T0)["queues"][0]["perm"] == expected


def test_a_broker_is_dropped_once_its_lease_runs_out() -> None:
    rt = RouteTable(lease_s=30)
    rt.register("a", "h:1", PERM_RW, topics(t=1), now=T0)
    rt.register("b", "h:2", PERM_RW, topics(t=1), now=T0 + 10)
    assert [q["broker"] for q in rt.route("t", now=T0 + 30)["queues"]] == ["a", "b"]  # exactly the lease: alive
    assert [q["broker"] for q in rt.route("t", now=T0 + 31)["queues"]] == ["b"]
    assert rt.route("t", now=T0 + 41) is None
    assert rt.brokers == {}


def test_a_new_registration_renews_the_lease_and_replaces_the_old_one() -> None:
    rt = RouteTable(lease_s=30)
    rt.register("a", "h:1", PERM_RW, topics(t=1, old=1), now=T0)
    rt.register("a", "h:9", PERM_READ, topics(t=8), now=T0 + 25)  # heartbeat with changed state
    r = rt.route("t", now=T0 + 50)
    assert r["queues"] == [{"broker": "a", "address": "h:9", "queue_base": 0, "queues": 8, "perm": PERM_READ}]
    assert rt.route("old", now=T0 + 50) is None  # topics are replaced, not merged


def test_expire_returns_the_names_it_removed() -> None:
    rt = RouteTable(lease_s=10)
    rt.register("a", "h:1", PERM_RW, {}, now=T0)
    rt.register("b", "h:2", PERM_RW, {}, now=T0 + 5)
    assert rt.expire(now=T0 + 10) == []
    assert rt.expire(now=T0 + 11) == ["a"]
    assert rt.expire(now=T0 + 11) == []
    assert sorted(rt.brokers) == ["b"]


def test_unregister_drops_at_once_and_is_idempotent() -> None:
    rt = RouteTable()
    rt.register("a", "h:1", PERM_RW, topics(t=1), now=T0)
    rt.unregister("a")
    rt.unregister("a")
    assert rt.route("t", now=T0) is None


def test_list_brokers_shows_live_brokers_with_their_topic_names() -> None:
    rt = RouteTable(lease_s=30)
    rt.register("b", "h:2", PERM_READ, topics(z=1, a=2), now=T0, replicated=True, epoch=3)
    rt.register("a", "h:1", PERM_RW, {}, now=T0 - 40)  # its lease is already over
    assert rt.list_brokers(now=T0) == [
        {"name": "b", "address": "h:2", "perm": PERM_READ, "topics": ["a", "z"], "replicated": True}
    ]


def test_the_default_clock_is_used_when_none_is_given() -> None:
    rt = RouteTable(lease_s=60)
    rt.register("a", "h:1", PERM_RW, topics(t=1))
    assert rt.route("t") is not None
    assert rt.list_brokers()[0]["name"] == "a"


# --------------------------------------------------------------------------- replicated groups


def test_an_older_masters_registration_is_refused() -> None:
    rt = RouteTable()
    assert rt.register("g", "new-master:1", PERM_RW, topics(t=1), now=T0, replicated=True, epoch=5)
    # the deposed master of epoch 4 still heartbeats (a partition healed late)
    assert not rt.register("g", "old-master:1", PERM_RW, topics(t=1), now=T0 + 1, replicated=True, epoch=4)
    assert rt.route("t", now=T0 + 1)["queues"][0]["address"] == "new-master:1"
    assert rt.brokers["g"].epoch == 5
    assert rt.brokers["g"].last_seen == T0  # a refused registration does not renew the lease


def test_the_same_or_a_newer_epoch_is_accepted() -> None:
    rt = RouteTable()
    rt.register("g", "m1:1", PERM_RW, topics(t=1), now=T0, replicated=True, epoch=5)
    assert rt.register("g", "m1:1", PERM_RW, topics(t=1), now=T0 + 1, replicated=True, epoch=5)
    assert rt.register("g", "m2:1", PERM_RW, topics(t=1), now=T0 + 2, replicated=True, epoch=6)
    assert rt.route("t", now=T0 + 2)["queues"][0]["address"] == "m2:1"


def test_unreplicated_brokers_have_no_epoch_rule() -> None:
    rt = RouteTable()
    rt.register("b", "h:1", PERM_RW, topics(t=1), now=T0, epoch=9)
    assert rt.register("b", "h:2", PERM_RW, topics(t=1), now=T0 + 1, epoch=1)
    assert rt.route("t", now=T0 + 1)["queues"][0]["address"] == "h:2"


def test_once_the_newer_masters_lease_ran_out_an_older_epoch_may_register() -> None:
    rt = RouteTable(lease_s=30)
    rt.register("g", "m5:1", PERM_RW, topics(t=1), now=T0, replicated=True, epoch=5)
    rt.expire(now=T0 + 31)
    assert rt.register("g", "m4:1", PERM_RW, topics(t=1), now=T0 + 31, replicated=True, epoch=4)


def test_a_route_carries_the_attributes_gateways_act_on() -> None:
    """A batch topic's attributes go with its route (gateways pack its batches), from any broker."""
    rt = RouteTable()
    attrs = {"batch": "true", "batch.compression": "zstd"}
    rt.register("a", "h:1", PERM_RW, {"clicks": {"queues": 2}}, now=T0)
    rt.register("b", "h:2", PERM_RW, {"clicks": {"queues": 2, "queue_base": 2, "attributes": attrs}}, now=T0)
    assert rt.route("clicks", now=T0)["attributes"] == attrs
    rt.register("c", "h:3", PERM_RW, {"plain": {"queues": 1}}, now=T0)
    assert "attributes" not in rt.route("plain", now=T0)
