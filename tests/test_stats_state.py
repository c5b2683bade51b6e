"""The stats job's state without Spark: the state topic (a real COMPACTED topic of a real
`unimq up`: commit, restore, a commit cut short by a crash, deletes) and the merge of
micro-batch partials (windows, watermark, late rows, replays, offset gaps).

The same job with real Spark, stopped, its checkpoint wiped and restarted, is
tests/test_spark_state.py."""

from __future__ import annotations

import base64

import pytest

from spark_ingest.client import GatewayClient
from spark_ingest.jobs.stats_state import OffsetGapError, RunningStats, duration_us
from spark_ingest.state_topic import PROGRESS_KEY, StateError, StateTopic, restore

pytestmark = pytest.mark.timeout(120)

MIN = 60_000_000


@pytest.fixture
def endpoint(unimq_server) -> str:
    return unimq_server().url().rstrip("/")


def _table(endpoint: str, topic: str) -> dict[str, bytes]:
    with GatewayClient(endpoint) as c:
        return {r["key"]: base64.b64decode(r["body_base64"]) for r in c.read_table(topic)}


def test_state_topic_commits_restores_and_undoes_a_cut_commit(endpoint) -> None:
    st = StateTopic(endpoint, "job-state")
    assert st.load().seq == 0 and st.load().entries == {}
    assert st.commit({"a": {"n": 1}, "b": {"n": 2}}, {"offsets": {"t": {"0": 5}}}) == 1
    assert st.commit({"a": {"n": 3}, "c": [1, 2]}, {"offsets": {"t": {"0": 9}}}) == 2
    st.close()

    again = StateTopic(endpoint, "job-state")
    snap = again.load()
    assert (snap.seq, snap.progress, snap.entries) == (2, {"offsets": {"t": {"0": 9}}},
                                                       {"a": {"n": 3}, "b": {"n": 2}, "c": [1, 2]})
    # A crash after the entries of commit 3 were sent and before its progress record:
    # the next load must see commit 2 exactly (b's new value undone, d not there, a not deleted).
    again.write({"b": {"n": 20}, "d": {"n": 4}, "a": None})
    again.close()
    cut = StateTopic(endpoint, "job-state")
    snap = cut.load()
    assert (snap.seq, snap.entries) == (2, {"a": {"n": 3}, "b": {"n": 2}, "c": [1, 2]})
    assert sorted(snap.undone) == ["a", "b", "d"]  # rolled back in the topic by load()
    # The job goes on from there: commit 3 deletes a (its marker leaves the table) and sets b.
    assert cut.commit({"a": None, "b": {"n": 21}}, {"offsets": {"t": {"0": 12}}}) == 3
    cut.close()
    table = _table(endpoint, "job-state")
    assert "a" not in table and set(table) == {"b", "c", PROGRESS_KEY}  # d: its roll-back deleted it
    last = StateTopic(endpoint, "job-state")
    snap = last.load()
    assert (snap.seq, snap.entries) == (3, {"b": {"n": 21}, "c": [1, 2]})  # not d, of the cut commit 3
    assert last.reset() and last.load().seq == 0
    last.close()


def test_restore_refuses_an_entry_two_commits_ahead() -> None:
    rows = {PROGRESS_KEY: b'{"seq": 1}', "k": b'{"seq": 3, "value": 1, "prev": null}'}
    with pytest.raises(StateError):
        restore(rows)


def test_duration_parsing() -> None:
    assert duration_us("1 minute") == MIN and duration_us("10 minutes") == 10 * MIN
    assert duration_us("1 hour 30 minutes") == 90 * MIN and duration_us("2 seconds") == 2_000_000
    for bad in ("ten minutes", "5 fortnights", "5"):
        with pytest.raises(ValueError):
            duration_us(bad)


def _partial(queue: int, lo: int, hi: int, start_min: int, temps: list[float], proto: str = "http") -> dict:
    return {"topic": "t", "protocol": proto, "queue_id": queue, "lo": lo, "hi": hi,
            "start_us": start_min * MIN, "end_us": (start_min + 1) * MIN, "max_ts_us": start_min * MIN + 30_000_000,
            "count": len(temps), "bytes": 10 * len(temps), "temp__min": min(temps), "temp__sum": sum(temps),
            "temp__n": len(temps), "temp__max": max(temps)}


def test_running_stats_merge_close_late_rows_and_gaps() -> None:
    rs = RunningStats("1 minute", "2 minutes", ["temp"])
    updated, closed = rs.apply([_partial(0, 0, 1, 0, [1.0, 3.0]), _partial(1, 0, 0, 0, [5.0])])
    assert closed == [] and list(updated) == ["w|t|http|0"]
    assert updated["w|t|http|0"]["count"] == 3 and updated["w|t|http|0"]["fields"]["temp"] == [1.0, 9.0, 3, 5.0]
    assert rs.offsets == {"t": {"0": 2, "1": 1}}
    # Window 3 moves the watermark to 3:30 - 2:00 = 1:30: window 0 (ends 1:00) closes.
    updated, closed = rs.apply([_partial(0, 2, 2, 3, [7.0])])
    assert list(updated) == ["w|t|http|180000000"] and closed == ["w|t|http|0"] and set(rs.entries) == set(updated)
    # A late message of the closed window is not counted, but its offset is.
    updated, closed = rs.apply([_partial(1, 1, 1, 0, [100.0])])
    assert updated == {} and rs.offsets["t"]["1"] == 2 and "w|t|http|0" not in rs.entries
    with pytest.raises(OffsetGapError):
        rs.apply([_partial(0, 5, 6, 3, [1.0])])  # offsets 3 and 4 of queue 0 were never counted
    assert rs.apply([_partial(0, 5, 6, 3, [1.0])], check_gaps=False)[0]["w|t|http|180000000"]["count"] == 2


def test_running_stats_survive_the_state_topic(endpoint) -> None:
    rs = RunningStats("1 minute", "10 minutes", ["temp"])
    updated, _ = rs.apply([_partial(0, 0, 9, 0, [1.0, 2.5]), _partial(0, 10, 10, 1, [4.0], proto="mqtt")])
    st = StateTopic(endpoint, "stats-state")
    st.load()
    st.commit(updated, rs.progress())
    st.close()
    back = RunningStats.restored(StateTopic(endpoint, "stats-state").load(), "60 seconds", "10 minutes", ["other"])
    assert (back.entries, back.offsets, back.max_event_us, back.fields) == (rs.entries, rs.offsets, rs.max_event_us,
                                                                           ["temp"])
    with pytest.raises(ValueError):
        RunningStats.restored(StateTopic(endpoint, "stats-state").load(), "2 minutes", "10 minutes", ["temp"])
