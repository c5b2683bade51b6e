"""The epoch file (which master wrote which part of the log) and the common-point rule.

``EpochFile`` is exercised on a real file in a temp dir (every change must be
on disk for a fresh reader); ``common_end`` on histories a failover produces.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core_broker.replication.epoch_file import EpochFile, common_end

pytestmark = pytest.mark.timeout(30)


def reread(path: Path) -> list[tuple[int, int]]:
    f = EpochFile(path)
    f.load()
    return f.entries


def test_a_missing_file_is_an_empty_history(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "epochs.json")
    f.load()
    assert f.entries == [] and f.last_epoch == 0
    assert not f.path.exists()  # loading does not create it


def test_begin_appends_an_epoch_and_persists_it(tmp_path: Path) -> None:
    path = tmp_path / "replication" / "epochs.json"  # its folder is made on first write
    f = EpochFile(path)
    f.load()
    f.begin(1, 0)
    f.begin(3, 4096)
    assert f.entries == [(1, 0), (3, 4096)] and f.last_epoch == 3
    assert reread(path) == [(1, 0), (3, 4096)]
    assert [p.name for p in path.parent.iterdir()] == ["epochs.json"]  # no temp file left behind


@pytest.mark.parametrize("epoch", [3, 2])
def test_begin_of_the_current_or_an_older_epoch_changes_nothing(tmp_path: Path, epoch: int) -> None:
    f = EpochFile(tmp_path / "epochs.json")
    f.begin(1, 0)
    f.begin(3, 100)
    f.begin(epoch, 999)  # taking office again in the same term (a restart), or a stale term
    assert f.entries == [(1, 0), (3, 100)]
    assert reread(f.path) == [(1, 0), (3, 100)]


def test_adopt_copies_the_masters_history_up_to_what_the_replica_holds(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "epochs.json")
    master = [(1, 0), (2, 1000), (4, 5000)]
    f.adopt(master, upto=3000)  # the replica holds the log below 3000: epoch 4 is not in it
    assert f.entries == [(1, 0), (2, 1000)]
    assert reread(f.path) == [(1, 0), (2, 1000)]
    f.adopt(master, upto=6000)
    assert reread(f.path) == master


def test_cut_forgets_epochs_that_start_past_the_cut(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "epochs.json")
    for e, s in [(1, 0), (2, 1000), (5, 2000)]:
        f.begin(e, s)
    f.cut(1500)
    assert f.entries == [(1, 0), (2, 1000)] and f.last_epoch == 2
    assert reread(f.path) == [(1, 0), (2, 1000)]
    f.cut(10_000)  # nothing past it
    assert reread(f.path) == [(1, 0), (2, 1000)]


def test_an_unparseable_epoch_file_is_reported_not_treated_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "epochs.json"
    path.write_text('{"entries": [[1, 0], [2')
    with pytest.raises(ValueError, match="epochs.json"):
        EpochFile(path).load()


# --------------------------------------------------------------------------- the common point


H1 = [(1, 0), (2, 100)]


@pytest.mark.parametrize(
    "mine, my_end, theirs, their_end, expected",
    [
        # the same history: the shorter log is a prefix of the longer one
        (H1, 300, H1, 250, 250),
        (H1, 250, H1, 300, 250),
        # a replica that missed the newest epoch entirely: all it has is epoch 1's part
        ([(1, 0)], 50, H1, 300, 50),
        ([(1, 0)], 180, H1, 300, 100),  # it holds bytes past epoch 1's end the new master never wrote
        # a deposed master of epoch 2 kept writing; the group moved on in epoch 3 from 150
        ([(1, 0), (2, 100)], 300, [(1, 0), (3, 150)], 400, 100),
        ([(1, 0), (3, 150)], 400, [(1, 0), (2, 100)], 300, 100),
        # one epoch number, two different starts: not the same master's writes
        ([(1, 0), (2, 100)], 300, [(1, 0), (2, 120)], 300, 100),
        # nothing in common, or no history at all: start over
        ([(2, 0)], 100, [(3, 0)], 100, 0),
        ([], 100, H1, 300, 0),
        (H1, 300, [], 0, 0),
    ],
)
def test_common_end(mine, my_end, theirs, their_end, expected) -> None:
    assert common_end(mine, my_end, theirs, their_end) == expected


def test_common_end_uses_the_newest_shared_epoch() -> None:
    replica = [(1, 0), (2, 100), (3, 200)]
    master = [(1, 0), (2, 100), (3, 200), (4, 260)]
    assert common_end(replica, 290, master, 500) == 260  # past 260 the replica has epoch 3's tail
    assert common_end(replica, 240, master, 500) == 240  # all it has is the master's too


def test_a_replica_cut_at_the_common_point_then_adopting_agrees_with_its_master(tmp_path: Path) -> None:
    deposed = EpochFile(tmp_path / "deposed.json")
    for e, s in [(1, 0), (2, 100)]:
        deposed.begin(e, s)
    master = [(1, 0), (3, 150)]
    point = common_end(deposed.entries, 300, master, 400)
    deposed.cut(point)
    deposed.adopt(master, upto=400)  # after copying the master's log up to its end
    assert reread(deposed.path) == master
    assert common_end(deposed.entries, 400, master, 400) == 400
