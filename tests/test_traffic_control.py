"""Issue 19, traffic control: the token buckets and connection counts every door asks (sans-io, a fake clock).

The doors' own answers (MQTT 0x97, AMQP NOT_ALLOWED / basic.nack, HTTP 429, RocketMQ
TOO_MANY_REQUESTS) are in ``test_traffic_doors.py`` with real clients.
"""

from __future__ import annotations

import pytest

from core_broker.errors import InvalidArgumentError
from gateway.access.limits import Limits, parse_subject
from gateway.access.traffic import QuotaExceededError, TrafficControl


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _tc(limits: dict, refuse_after_s: float = 10.0) -> tuple[TrafficControl, Clock]:
    clock = Clock()
    tc = TrafficControl(refuse_after_s=refuse_after_s, burst_s=1.0, clock=clock)
    tc.install(limits)
    return tc, clock


def test_no_limits_is_inactive_and_free() -> None:
    tc, _ = _tc({})
    assert not tc.active
    m = tc.meter("alice", "c1")
    assert m.charge(10_000, 10**9) == 0.0
    assert m.subscriptions() is None
    leases = [tc.connect("alice", "c1") for _ in range(50)]
    assert tc.connections("user", "alice") == 50
    for lease in leases:
        lease.release()
        lease.release()  # twice is harmless
    assert tc.connections("user", "alice") == 0


def test_a_rate_holds_back_then_refuses_when_it_persists() -> None:
    tc, clock = _tc({("user", "alice"): Limits(publish_msgs_per_s=10)}, refuse_after_s=2.0)
    m = tc.meter("alice", "c1")
    # a second's worth is there at once (the burst)
    assert [m.charge(1, 1) for _ in range(10)] == [0.0] * 10
    # then each message waits for its token
    assert m.charge(1, 1) == pytest.approx(0.1)
    assert m.charge(1, 1) == pytest.approx(0.2)
    # the client waited as told, and keeps going at the rate: still held, until it has been over 2 s
    waits = []
    with pytest.raises(QuotaExceededError) as e:
        for _ in range(100):
            clock.t += 0.1
            waits.append(m.charge(1, 1))
    assert all(w > 0 for w in waits)
    assert 15 <= len(waits) <= 25
    assert e.value.code == "TOO_MANY_REQUESTS"
    assert e.value.details["what"] == "publish" and e.value.details["subject"] == "user:alice"
    assert e.value.retry_after_s >= 1.0
    # it backs off: budget again
    clock.t += 5
    assert m.charge(1, 1) == 0.0


def test_a_backlog_longer_than_refuse_after_is_refused_and_nothing_taken() -> None:
    tc, _ = _tc({("user", "bob"): Limits(publish_bytes_per_s=1000)}, refuse_after_s=2.0)
    m = tc.meter("bob")
    with pytest.raises(QuotaExceededError):
        m.charge(1, 5000)  # 4 s of debt
    assert m.charge(1, 1000) == 0.0  # the refused one took nothing


def test_a_users_budget_is_shared_by_its_connections_and_defaults_are_per_identity() -> None:
    tc, _ = _tc({("user", "alice"): Limits(publish_msgs_per_s=5), ("user", "*"): Limits(publish_msgs_per_s=5)})
    a1, a2 = tc.meter("alice", "x"), tc.meter("alice", "y")
    for _ in range(5):
        assert a1.charge(1, 0) == 0.0
    assert a2.charge(1, 0) > 0  # alice's budget is spent, whatever the connection
    c, d = tc.meter("carol"), tc.meter("dave")
    for _ in range(5):
        assert c.charge(1, 0) == 0.0
    assert d.charge(1, 0) == 0.0  # the default gives each user its own


def test_a_client_id_limit_and_the_stricter_of_both() -> None:
    tc, _ = _tc({("user", "alice"): Limits(subscriptions=10), ("client", "dev-1"): Limits(subscriptions=2)})
    assert tc.meter("alice", "dev-1").subscriptions() == 2
    assert tc.meter("alice", "dev-2").subscriptions() == 10
    assert tc.meter("bob", "dev-1").subscriptions() == 2


def test_connection_limits_count_open_connections_and_a_takeover() -> None:
    tc, _ = _tc({("user", "alice"): Limits(connections=2), ("client", "solo"): Limits(connections=1)})
    l1 = tc.connect("alice", "a")
    tc.connect("alice", "b")
    with pytest.raises(QuotaExceededError) as e:
        tc.connect("alice", "c")
    assert e.value.details["what"] == "connections" and e.value.details["limit"] == 2
    l1.release()
    tc.connect("alice", "c")
    tc.connect("bob", "solo")
    with pytest.raises(QuotaExceededError):
        tc.connect("carol", "solo")
    tc.connect("carol", "solo", replaces=True)  # MQTT: the open one is being taken over


def test_a_limit_changed_reaches_open_meters() -> None:
    tc, _ = _tc({("user", "alice"): Limits(publish_msgs_per_s=1)})
    m = tc.meter("alice")
    assert m.charge(1, 0) == 0.0
    assert m.charge(1, 0) > 0
    tc.install({("user", "alice"): Limits(publish_msgs_per_s=1000)})
    assert m.charge(1, 0) == 0.0
    tc.install({})
    assert not tc.active
    assert all(m.charge(100, 0) == 0.0 for _ in range(100))


def test_zero_allows_nothing() -> None:
    tc, _ = _tc({("user", "mute"): Limits(publish_msgs_per_s=0, connections=0)})
    with pytest.raises(QuotaExceededError):
        tc.meter("mute").charge(1, 0)
    with pytest.raises(QuotaExceededError):
        tc.connect("mute")


def test_limits_values() -> None:
    lim = Limits.from_dict({"connections": 3, "publish_msgs_per_s": 2.5})
    assert lim.to_dict() == {"connections": 3, "publish_msgs_per_s": 2.5}
    assert Limits.from_json(lim.to_json()) == lim
    assert lim.merged(Limits(subscriptions=4)).to_dict() == {"connections": 3, "publish_msgs_per_s": 2.5,
                                                             "subscriptions": 4}
    for bad in ({"connections": -1}, {"connections": 1.5}, {"publish_msgs_per_s": "fast"}, {"nope": 1},
                {"subscriptions": True}, []):
        with pytest.raises(InvalidArgumentError):
            Limits.from_dict(bad)
    assert parse_subject("user", "*") == ("user", "*")
    for kind, name in (("group", "x"), ("user", ""), ("user", "role:x"), ("client", "a\nb")):
        with pytest.raises(InvalidArgumentError):
            parse_subject(kind, name)


def test_a_connection_rate_per_user_client_and_address() -> None:
    tc, clock = _tc({("user", "alice"): Limits(connections_per_s=2),
                     ("address", "*"): Limits(connections_per_s=1),
                     ("client", "c9"): Limits(connections_per_s=0.5)})
    # the user's bucket holds two (one second's worth); refused attempts take nothing from it
    tc.connect("alice", "a1").release()
    tc.connect("alice", "a2").release()
    with pytest.raises(QuotaExceededError) as e:
        tc.connect("alice", "a3")
    assert e.value.details["what"] == "connection_rate" and e.value.details["subject"] == "user:alice"
    assert e.value.retry_after_s >= 1
    clock.t += 0.5
    tc.connect("alice", "a4").release()  # a second's worth comes back over a second
    # every address gets a bucket of its own; the port is no part of it
    tc.connect("bob", "", address="10.0.0.1:5000")
    with pytest.raises(QuotaExceededError) as e:
        tc.connect("bob", "", address="10.0.0.1:5001")
    assert e.value.details["subject"] == "address:10.0.0.1"
    tc.connect("bob", "", address="[::1]:5001")
    assert tc.connections("address", "10.0.0.1") == 1 and tc.connections("address", "::1") == 1
    # a client id's rate (floor: one connection saved up even below 1/s)
    tc.connect("carol", "c9")
    with pytest.raises(QuotaExceededError):
        tc.connect("dave", "c9")
    clock.t += 2.0
    tc.connect("dave", "c9")
    # zero: none at all
    tc.install({("address", "10.9.9.9"): Limits(connections_per_s=0)})
    with pytest.raises(QuotaExceededError):
        tc.connect("erin", "", address="10.9.9.9:1")


def test_an_address_limit_counts_connections_and_takes_no_publish_figures() -> None:
    tc, _ = _tc({("address", "127.0.0.2"): Limits(connections=1)})
    lease = tc.connect("alice", "x", address="127.0.0.2:1")
    with pytest.raises(QuotaExceededError) as e:
        tc.connect("bob", "y", address="127.0.0.2:2")
    assert e.value.details == {"what": "connections", "subject": "address:127.0.0.2", "limit": 1,
                               "retry_after_s": 1.0}
    lease.release()
    tc.connect("bob", "y", address="127.0.0.2:2")
    assert parse_subject("address", "::0:1") == ("address", "::1")
    for bad in ("host.example", "10.0.0.300", ""):
        with pytest.raises(InvalidArgumentError):
            parse_subject("address", bad)
    Limits(connections=2, connections_per_s=1).check_kind("address")
    with pytest.raises(InvalidArgumentError):
        Limits(publish_msgs_per_s=1).check_kind("address")
