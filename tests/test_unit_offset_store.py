"""ConsumerOffsetStore: commits in memory, the table written when it changed, read back on start."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from core_broker.offset_store import ConsumerOffsetStore

pytestmark = pytest.mark.timeout(30)


def fresh(path: Path) -> ConsumerOffsetStore:
    s = ConsumerOffsetStore(path)
    s.load()
    return s


def test_commit_and_get(tmp_path: Path) -> None:
    s = fresh(tmp_path / "offsets.json")
    assert s.get("g", "t", 0) is None  # never committed: not 0
    s.commit("g", "t", 0, 42)
    s.commit("g", "t", 0, 43)  # the newest commit wins
    s.commit("g", "t", 1, 7)
    assert s.get("g", "t", 0) == 43
    assert s.get("g", "t", 1) == 7
    assert s.get("g", "u", 0) is None and s.get("other", "t", 0) is None
    assert s.groups() == ["g"]
    assert s.of_group("g") == {("t", 0): 43, ("t", 1): 7}
    assert s.of_group("nobody") == {}


def test_of_group_is_a_copy(tmp_path: Path) -> None:
    s = fresh(tmp_path / "offsets.json")
    s.commit("g", "t", 0, 1)
    s.of_group("g")[("t", 0)] = 999
    assert s.get("g", "t", 0) == 1


def test_nothing_is_written_before_persist(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    s = fresh(path)
    s.commit("g", "t", 0, 5)
    assert not path.exists()


def test_persisted_offsets_are_read_back_by_a_new_store(tmp_path: Path) -> None:
    path = tmp_path / "config" / "offsets.json"
    s = fresh(path)
    s.commit("g1", "orders", 0, 10)
    s.commit("g1", "orders", 3, 30)
    s.commit("g2", "a@b", 2, 5)  # "@" separates topic and queue in the file: names may contain it
    s.commit("g2", "%RETRY%g2+orders", 0, 1)
    s.persist()
    back = fresh(path)
    assert back.get("g1", "orders", 0) == 10
    assert back.get("g1", "orders", 3) == 30
    assert back.get("g2", "a@b", 2) == 5
    assert back.get("g2", "%RETRY%g2+orders", 0) == 1
    assert sorted(back.groups()) == ["g1", "g2"]


def test_persist_writes_only_when_something_changed_unless_forced(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    s = fresh(path)
    s.commit("g", "t", 0, 1)
    s.persist()
    path.unlink()  # so a write is visible
    s.persist()
    assert not path.exists()  # nothing changed since the last write
    s.persist(force=True)  # a clean shutdown writes it anyway
    assert fresh(path).get("g", "t", 0) == 1
    path.unlink()
    s.commit("g", "t", 0, 2)
    s.persist()
    assert fresh(path).get("g", "t", 0) == 2


def test_delete_topic_forgets_that_topic_for_every_group_only(tmp_path: Path) -> None:
    path = tmp_path / "offsets.json"
    s = fresh(path)
    s.commit("g1", "gone", 0, 1)
    s.commit("g1", "gone", 1, 2)
    s.commit("g1", "kept", 0, 3)
    s.commit("g2", "gone", 0, 4)
    s.persist()
    s.delete_topic("gone")
    assert s.of_group("g1") == {("kept", 0): 3}
    assert s.get("g2", "gone", 0) is None
    s.persist()  # the deletion is a change: written
    back = fresh(path)
    assert back.of_group("g1") == {("kept", 0): 3}
    assert back.get("g2", "gone", 0) is None


def test_clear_forgets_every_commit(tmp_path: Path) -> None:
    s = fresh(tmp_path / "offsets.json")
    s.commit("g", "t", 0, 9)
    s.clear()
    assert s.groups() == [] and s.get("g", "t", 0) is None


def test_a_missing_file_is_an_empty_table_and_a_broken_one_is_reported(tmp_path: Path) -> None:
    assert fresh(tmp_path / "none.json").groups() == []
    broken = tmp_path / "broken.json"
    broken.write_text('{"g": {"t@0": ')
    with pytest.raises(ValueError):
        fresh(broken)


def test_the_file_format_is_group_then_topic_at_queue(tmp_path: Path) -> None:
    """The layout other tools (and older versions) read: {group: {"topic@queue": offset}}."""
    path = tmp_path / "offsets.json"
    s = fresh(path)
    s.commit("g", "t", 4, 17)
    s.persist()
    assert json.loads(path.read_text()) == {"g": {"t@4": 17}}


def test_commits_during_persists_are_never_lost(tmp_path: Path) -> None:
    """The housekeeping thread persists while consumers commit: the last persist holds the last commit."""
    path = tmp_path / "offsets.json"
    s = fresh(path)
    stop = threading.Event()

    def persister() -> None:
        while not stop.is_set():
            s.persist()

    th = threading.Thread(target=persister)
    th.start()
    try:
        for i in range(300):
            s.commit("g", "t", i % 4, i)
    finally:
        stop.set()
        th.join(10)
    s.persist()
    back = fresh(path)
    assert [back.get("g", "t", q) for q in range(4)] == [296, 297, 298, 299]
