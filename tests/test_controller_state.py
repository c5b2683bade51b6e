"""The controller's replicated state machine and the leader's lease table, in process."""

from __future__ import annotations

import pytest

from core_broker.errors import InvalidArgumentError, StaleEpochError
from nameserver.controller_state import ControllerState, GroupNotFoundError, LeaseTable


def _group_of_three() -> ControllerState:
    s = ControllerState()
    s.register("g", "a", "127.0.0.1:1", priority=0)
    s.register("g", "b", "127.0.0.1:2", priority=5)
    s.register("g", "c", "127.0.0.1:3", priority=1)
    return s


def test_first_broker_becomes_master_at_epoch_one() -> None:
    s = _group_of_three()
    st = s.group_state("g")
    assert (st.master_id, st.master_addr, st.master_epoch) == ("a", "127.0.0.1:1", 1)
    assert st.in_sync == frozenset({"a"}) and st.in_sync_epoch == 1
    assert st.members == {"a": "127.0.0.1:1", "b": "127.0.0.1:2", "c": "127.0.0.1:3"}
    with pytest.raises(GroupNotFoundError):
        s.group_state("nope")


def test_alter_in_sync_is_compare_and_set() -> None:
    s = _group_of_three()
    st = s.alter_in_sync("g", "a", 1, 1, frozenset({"a", "b"}))
    assert st.in_sync == {"a", "b"} and st.in_sync_epoch == 2
    with pytest.raises(StaleEpochError):  # stale in-sync epoch
        s.alter_in_sync("g", "a", 1, 1, frozenset({"a", "b", "c"}))
    with pytest.raises(StaleEpochError):  # not the master
        s.alter_in_sync("g", "b", 1, 2, frozenset({"a", "b", "c"}))
    with pytest.raises(StaleEpochError):  # stale master epoch
        s.alter_in_sync("g", "a", 0, 2, frozenset({"a", "b", "c"}))
    with pytest.raises(InvalidArgumentError):
        s.alter_in_sync("g", "a", 1, 2, frozenset({"b"}))
    with pytest.raises(InvalidArgumentError):
        s.alter_in_sync("g", "a", 1, 2, frozenset({"a", "zz"}))
    assert s.group_state("g").in_sync == {"a", "b"}


def test_election_only_from_live_in_sync_most_advanced_then_priority() -> None:
    s = _group_of_three()
    s.alter_in_sync("g", "a", 1, 1, frozenset({"a", "b", "c"}))
    st = s.elect("g", {"b": 100, "c": 200}, allow_unclean=False)
    assert (st.master_id, st.master_epoch) == ("c", 2)
    assert st.in_sync == {"c"} and st.in_sync_epoch == 3
    s2 = _group_of_three()
    s2.alter_in_sync("g", "a", 1, 1, frozenset({"a", "b", "c"}))
    assert s2.elect("g", {"b": 100, "c": 100}, allow_unclean=False).master_id == "b"  # priority 5 > 1


def test_no_live_in_sync_member_means_no_master_unless_unclean() -> None:
    s = _group_of_three()
    s.alter_in_sync("g", "a", 1, 1, frozenset({"a", "b"}))
    st = s.elect("g", {"c": 999}, allow_unclean=False)
    assert st.master_id is None and st.master_addr is None and st.master_epoch == 2
    assert st.in_sync == {"a", "b"}  # kept: the data lives there
    st = s.elect("g", {"c": 999, "b": 5}, allow_unclean=False)  # b returns: in sync, elected
    assert (st.master_id, st.master_epoch) == ("b", 3)
    s2 = _group_of_three()
    st = s2.elect("g", {"c": 7}, allow_unclean=True)
    assert (st.master_id, st.master_epoch, st.in_sync) == ("c", 2, frozenset({"c"}))


def test_lease_table_elects_only_after_one_lease_and_on_lapse() -> None:
    s = _group_of_three()
    leases = LeaseTable(lease_s=2.0, now=100.0)
    assert leases.elections_due(s, 100.5) == []  # a new leader waits one lease
    leases.beat("g", "a", 10, now=101.0)
    leases.beat("g", "b", 9, now=101.0)
    assert leases.elections_due(s, 102.5) == []  # master alive
    leases.beat("g", "b", 11, now=103.5)
    assert leases.elections_due(s, 103.5) == ["g"]  # a's lease lapsed
    assert leases.live("g", 103.5) == {"b": 11}
    assert leases.offset("g", "a") == 10


def test_snapshot_data_is_plain() -> None:
    s = _group_of_three()
    data = s.to_data()
    assert data["g"]["master_id"] == "a" and data["g"]["in_sync"] == ["a"]
    s.alter_in_sync("g", "a", 1, 1, frozenset({"a", "c"}))
    restored = ControllerState.from_data(s.to_data())
    assert restored.cluster_state() == s.cluster_state()
