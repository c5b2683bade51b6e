"""Light message queues in the store: one shared log, no file per LMQ (issue 21).

Real stores in tmp dirs: LMQs are created by dispatching real messages into them,
read back through the store's own readers, after clean stops, simulated crashes
(a copy of the running store's files) and retention.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from core_broker.light_queue import DIR_NAME, LightQueue, stored_names
from core_broker.model import DispatchTarget, GetStatus, Message

from store_helpers import copy_config, crash_copy, force_checkpoint, read_all, segment_paths, stores  # noqa: F401


def _lmq(i: int) -> str:
    return f"%LMQ%mqtt/dev-{i // 100}/{i}"


def _send(s, i: int, body: bytes) -> None:
    s.put(Message("mqtt/in", body, extra_dispatch=(DispatchTarget(_lmq(i), 0),)))


def _bodies(s, name: str) -> list[bytes]:
    return [m.body for m in read_all(s, name, 0)]


def test_many_lmqs_make_no_file_each_and_survive_a_clean_restart(stores) -> None:
    s = stores.open()
    n = 3000
    for i in range(n):
        _send(s, i, f"a{i}".encode())
    for i in range(0, n, 7):
        _send(s, i, f"b{i}".encode())
    assert all(isinstance(s._cqs[(_lmq(i), 0)], LightQueue) for i in range(n))
    force_checkpoint(s)  # the LMQ log is written at checkpoints
    cq = s.root / "consumequeue"
    assert sorted(p.name for p in cq.iterdir()) == sorted(["mqtt%2Fin", DIR_NAME])
    log_files = list((cq / DIR_NAME).iterdir())
    assert 1 <= len(log_files) <= 2  # one shared log, whatever the number of LMQs
    s = stores.reopen(s)
    assert stored_names(s.root / "consumequeue") >= {_lmq(i) for i in range(n)}
    for i in (0, 1, 7, 2999):
        want = [f"a{i}".encode()] + ([f"b{i}".encode()] if i % 7 == 0 else [])
        assert _bodies(s, _lmq(i)) == want
    _send(s, 1, b"c1")  # offsets continue after the restart
    assert _bodies(s, _lmq(1)) == [b"a1", b"c1"]
    assert s.max_offset(_lmq(1), 0) == 2
    assert [m.queue_offset for m in read_all(s, _lmq(1), 0)] == [0, 1]


def test_entries_after_the_last_checkpoint_are_rebuilt_after_a_crash(stores, tmp_path: Path) -> None:
    s = stores.open(checkpoint_interval_ms=3_600_000)
    for i in range(50):
        _send(s, i, f"a{i}".encode())
    force_checkpoint(s)  # the first 50 are in the LMQ log ...
    for i in range(50, 80):
        _send(s, i, f"a{i}".encode())  # ... these only in the commitlog (and memory)
    _send(s, 3, b"b3")
    s.commitlog.sync()
    d = crash_copy(s, tmp_path / "crash")
    c = stores.open(copy_config(s, d))
    assert c.recovered_abnormally
    for i in range(80):
        assert _bodies(c, _lmq(i)) == [f"a{i}".encode()] + ([b"b3"] if i == 3 else []), i
    c = stores.reopen(c)  # what recovery wrote is in the log now
    assert _bodies(c, _lmq(79)) == [b"a79"]


def test_torn_log_tail_is_cut_and_the_rest_kept(stores) -> None:
    s = stores.open()
    for i in range(20):
        _send(s, i, f"a{i}".encode())
    s.shutdown()
    log = sorted((s.root / "consumequeue" / DIR_NAME).iterdir())[-1]
    size = log.stat().st_size
    with open(log, "ab") as f:
        f.write(b"\x01\x40\x00\x00\x00%LMQ%half")  # a record cut short by a crash
    c = stores.open(s.config)
    assert log.stat().st_size == size
    assert [_bodies(c, _lmq(i)) for i in range(20)] == [[f"a{i}".encode()] for i in range(20)]


def test_deleted_lmq_is_gone_from_memory_and_disk_and_stays_gone(stores) -> None:
    s = stores.open()
    for i in range(10):
        _send(s, i, f"a{i}".encode())
    s.delete_topic_queues(_lmq(4))
    assert not s.has_queue(_lmq(4), 0)
    assert s.get(_lmq(4), 0, 0, 10).status == GetStatus.NO_MESSAGE_IN_QUEUE
    s = stores.reopen(s)
    assert _lmq(4) not in stored_names(s.root / "consumequeue")
    assert not s.has_queue(_lmq(4), 0)
    assert _bodies(s, _lmq(5)) == [b"a5"]
    _send(s, 4, b"again")  # a new subscription of the same name starts afresh
    assert [(m.queue_offset, m.body) for m in read_all(s, _lmq(4), 0)] == [(0, b"again")]


def test_retention_removes_old_log_files_and_lmq_offsets_never_go_back(stores) -> None:
    s = stores.open(retention_hours=1.0)
    s.lmqs.segment_bytes = 2048  # a new LMQ log file every ~30 entries
    for i in range(1000, 1020):  # LMQs whose every record is in the oldest log files
        s.put(Message("mqtt/in", os.urandom(900), extra_dispatch=(DispatchTarget(_lmq(i), 0),)))
    for i in range(400):
        s.put(Message("mqtt/in", os.urandom(900), extra_dispatch=(DispatchTarget(_lmq(i % 40), 0),)))
        if i % 20 == 19:
            s._sync_indexes()
    s._sync_indexes()
    logs = sorted((s.root / "consumequeue" / DIR_NAME).iterdir())
    assert len(logs) > 4
    segs = segment_paths(s.root)
    t = time.time() - 7200
    for p in segs[:-1]:
        os.utime(p, (t, t))
    assert s.run_retention() == len(segs) - 1
    assert len(list((s.root / "consumequeue" / DIR_NAME).iterdir())) < len(logs)
    ends = {i: s.max_offset(_lmq(i), 0) for i in range(40)}
    assert ends == {i: 10 for i in range(40)}
    s = stores.reopen(s)
    assert {i: s.max_offset(_lmq(i), 0) for i in range(40)} == ends  # not back to 0
    for i in range(1000, 1020):  # their entries left with the log files, their offsets did not
        assert (s.min_offset(_lmq(i), 0), s.max_offset(_lmq(i), 0)) == (1, 1)
    for i in range(40):
        g = s.get(_lmq(i), 0, 0, 100)
        assert g.status == GetStatus.OFFSET_MOVED or all(m.queue_offset >= s.min_offset(_lmq(i), 0) for m in g.messages)
    s.put(Message("mqtt/in", b"new", extra_dispatch=(DispatchTarget(_lmq(0), 0),)))
    assert [(m.queue_offset, m.body) for m in read_all(s, _lmq(0), 0, 10)] == [(10, b"new")]


def test_a_crash_does_not_revive_a_deleted_lmq_but_keeps_its_successor(stores, tmp_path: Path) -> None:
    """Records stored after the last checkpoint are dispatched again by recovery: not into an
    LMQ deleted after them; a new LMQ of the same name (a new session of the same client) keeps
    what was stored for it after the deletion."""
    s = stores.open(checkpoint_interval_ms=3_600_000)
    _send(s, 1, b"kept")
    force_checkpoint(s)
    for i in (0, 0, 1):
        _send(s, i, b"old")  # after the checkpoint: recovery dispatches these again
    s.delete_topic_queues(_lmq(0))
    _send(s, 0, b"new")  # the name again, after the deletion
    s.commitlog.sync()
    d = crash_copy(s, tmp_path / "crash")
    c = stores.open(copy_config(s, d))
    assert c.recovered_abnormally
    assert [(m.queue_offset, m.body) for m in read_all(c, _lmq(0), 0)] == [(0, b"new")]
    assert _bodies(c, _lmq(1)) == [b"kept", b"old"]
    c = stores.reopen(c)
    assert [(m.queue_offset, m.body) for m in read_all(c, _lmq(0), 0)] == [(0, b"new")]
