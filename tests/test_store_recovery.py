"""MessageStore recovery: crashes, torn and corrupt tails, lost indexes, full disks.

A crash is simulated in-process with :func:`store_helpers.crash_copy`: the
data dir of a *running* store is copied under its put lock, which is what a
``kill -9`` at that instant leaves on disk (abort marker present, checkpoint
as last written by the flush thread). The copy is then damaged on purpose
where a test says so and opened by a fresh store. The child-process SIGKILL
loop lives in test_store_crash.py.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from core_broker import mapped_file, record
from core_broker.errors import StoreFullError
from core_broker.filter import compile_filter
from core_broker.message_store import MessageStore
from core_broker.model import DispatchTarget, FilterExpression, GetStatus, Message, PutStatus

from store_helpers import (  # noqa: F401  (stores is a fixture)
    CQ_PER_FILE,
    SEG,
    body_for,
    copy_config,
    crash_copy,
    flip_bytes,
    force_checkpoint,
    locate,
    make_config,
    read_all,
    record_size,
    segment_paths,
    stores,
    walk_segment,
    write_at,
)


def _fill(s: MessageStore, n: int, start: int = 0, topic: str = "R", queues: int = 2):
    """n messages with keys, tags, some client ids and some multi-dispatch; returns [(msg, result)]."""
    out = []
    for i in range(start, start + n):
        m = Message(
            topic,
            body_for(i),
            queue_id=i % queues,
            tag=f"t{i % 3}",
            keys=(f"k{i}",),
            message_id=f"cid-{i}" if i % 4 == 0 else "",
            extra_dispatch=(DispatchTarget("W", 0),) if i % 5 == 0 else (),
        )
        out.append((m, s.put(m)))
    return out


def _expected(sent, topic: str = "R", queues: int = 2) -> dict[tuple[str, int], list[bytes]]:
    exp: dict[tuple[str, int], list[bytes]] = {(topic, q): [] for q in range(queues)}
    exp[("W", 0)] = []
    for m, _ in sent:
        exp[(topic, m.queue_id)].append(m.body)
        if m.extra_dispatch:
            exp[("W", 0)].append(m.body)
    return exp


def _check_all(s: MessageStore, sent, topic: str = "R", queues: int = 2) -> None:
    for (t, q), bodies in _expected(sent, topic, queues).items():
        assert [m.body for m in read_all(s, t, q)] == bodies, (t, q)
        assert s.max_offset(t, q) == len(bodies)
    for m, r in sent[:: max(1, len(sent) // 25)] + sent[-3:]:
        assert [x.body for x in s.query_by_key(topic, m.keys[0])] == [m.body]
        got = s.query_by_id(r.message_id)
        assert got is not None and got.body == m.body


def _open_copy(stores, s: MessageStore, name: str, **overrides) -> MessageStore:
    dest = crash_copy(s, stores.tmp_path / name)
    return stores.open(copy_config(s, dest, **overrides))


# ============================================================================ crash, nothing damaged


def test_crash_after_a_checkpoint_recovers_everything(stores) -> None:
    s = stores.open(checkpoint_interval_ms=3_600_000)
    sent = _fill(s, 300)
    link = s.put_link(sent[7][1].commitlog_offset, "DELAY", 0, properties={"fired": "yes"})
    force_checkpoint(s)
    cp = json.loads((s.root / "checkpoint").read_text())
    assert "clean_end" not in cp and cp["safe"] == s.commitlog.write_pos
    sent += _fill(s, 150, start=300)  # after the checkpoint: only in the page cache
    c = _open_copy(stores, s, "crash1")
    assert c.recovered_abnormally is True
    _check_all(c, sent)
    assert c.read_at("DELAY", 0, 0).properties == {"fired": "yes"}
    assert c.read_at("DELAY", 0, 0).message_id == link.message_id
    assert c.commitlog.write_pos == s.commitlog.write_pos
    # offsets continue after recovery
    more = _fill(c, 40, start=450)
    _check_all(c, sent + more)
    c2 = stores.reopen(c)
    assert c2.recovered_abnormally is False
    _check_all(c2, sent + more)


def test_crash_before_any_checkpoint_scans_the_whole_log(stores) -> None:
    s = stores.open(checkpoint_interval_ms=3_600_000)
    sent = _fill(s, 400)
    assert not (s.root / "checkpoint").exists()
    c = _open_copy(stores, s, "crash")
    assert c.recovered_abnormally is True
    _check_all(c, sent)


def test_abort_marker_left_behind_means_recovery(stores) -> None:
    s = stores.open()
    sent = _fill(s, 120)
    s.shutdown()
    (s.root / "abort").touch()
    s2 = stores.open(s.config)
    assert s2.recovered_abnormally is True
    _check_all(s2, sent)
    s3 = stores.reopen(s2)
    assert s3.recovered_abnormally is False
    assert not (s2.root / "abort").exists() or s3.running


def test_crash_while_the_next_segment_is_preallocated_but_empty(stores) -> None:
    """A crash right after roll() created the next segment, before anything was written to it."""
    s = stores.open(checkpoint_interval_ms=3_600_000)
    sent = _fill(s, 200)
    c_dir = crash_copy(s, stores.tmp_path / "c")
    last = segment_paths(c_dir)[-1]
    nxt = c_dir / "commitlog" / f"{int(last.name) + SEG:020d}"
    with open(nxt, "wb") as f:
        f.truncate(SEG)
    c = stores.open(copy_config(s, c_dir))
    _check_all(c, sent)
    more = _fill(c, 200, start=200)
    _check_all(c, sent + more)


def test_crash_with_a_segment_tail_under_12_bytes(stores) -> None:
    s = stores.open(checkpoint_interval_ms=3_600_000)
    hdr = record_size("Z", b"")
    first = b"a" * (SEG // 2 - hdr)
    s.put(Message("Z", first))
    second = b"b" * (SEG - s.commitlog.write_pos - 7 - hdr)  # leaves 7 bytes: no blank fits
    s.put(Message("Z", second))
    assert SEG - s.commitlog.write_pos == 7
    rest = [body_for(i, 3000) for i in range(40)]  # two more segments
    for b in rest:
        s.put(Message("Z", b))
    c = _open_copy(stores, s, "c")
    assert [m.body for m in read_all(c, "Z", 0)] == [first, second, *rest]
    assert c.commitlog.write_pos == s.commitlog.write_pos


# ============================================================================ corrupt and torn tails


@pytest.mark.parametrize("where", ["size", "magic", "crc", "header", "body", "last-byte"])
def test_corrupt_last_record_is_cut(stores, where: str) -> None:
    s = stores.open(checkpoint_interval_ms=3_600_000)
    sent = _fill(s, 100)
    force_checkpoint(s)
    sent += _fill(s, 10, start=100)
    _, last = sent[-1]
    c_dir = crash_copy(s, stores.tmp_path / "c")
    path, off = locate(c_dir, SEG, last.commitlog_offset)
    pos = {"size": 0, "magic": 4, "crc": 8, "header": 20, "body": last.store_size - 40,
           "last-byte": last.store_size - 1}[where]
    flip_bytes(path, off + pos, 1 if where == "last-byte" else 4)
    c = stores.open(copy_config(s, c_dir))
    assert c.recovered_abnormally is True
    # the corrupt record is gone, everything before it intact
    assert c.commitlog.write_pos == last.commitlog_offset
    _check_all(c, sent[:-1])
    assert c.query_by_key("R", sent[-1][0].keys[0]) == []
    assert c.query_by_id(last.message_id) is None
    # the tail past the cut is zeroed: nothing of the corrupt record is left to find
    assert path.read_bytes()[off : off + last.store_size] == b"\0" * last.store_size
    # new puts continue exactly at the cut point, with the cut queue offset
    m = Message("R", b"replacement", queue_id=sent[-1][0].queue_id, keys=("rk",))
    r = c.put(m)
    assert r.commitlog_offset == last.commitlog_offset and r.queue_offset == last.queue_offset
    assert c.read_at("R", m.queue_id, r.queue_offset).body == b"replacement"
    c2 = stores.reopen(c)
    _check_all(c2, sent[:-1] + [(m, r)])


def test_corrupt_record_below_the_checkpoint_is_never_returned(stores) -> None:
    """Bit rot in a record the checkpoint vouches for: reads verify the CRC and skip it."""
    s = stores.open()
    sent = _fill(s, 60)
    s.shutdown()  # clean stop: the checkpoint covers every record
    m_last, last = sent[-1]
    path, off = locate(s.root, SEG, last.commitlog_offset)
    flip_bytes(path, off + last.store_size - 10, 4)
    c = stores.open(s.config)
    q = m_last.queue_id
    got = read_all(c, "R", q)
    assert [m.body for m in got] == [m.body for m, _ in sent[:-1] if m.queue_id == q]
    assert c.read_at("R", q, last.queue_offset) is None
    assert c.query_by_id(last.message_id) is None
    g = c.get("R", q, last.queue_offset, 10)
    assert g.messages == [] and g.next_offset == last.queue_offset + 1
    r = c.put(Message("R", b"next", queue_id=q))
    assert c.read_at("R", q, r.queue_offset).body == b"next"
    assert [m.body for m in read_all(c, "R", q)][-1] == b"next"


@pytest.mark.parametrize("kind", ["torn-half", "torn-header", "garbage", "bogus-size"])
def test_torn_or_garbage_tail_is_cut(stores, kind: str) -> None:
    s = stores.open(checkpoint_interval_ms=3_600_000)
    sent = _fill(s, 80)
    end = s.commitlog.write_pos
    c_dir = crash_copy(s, stores.tmp_path / "c")
    path, off = locate(c_dir, SEG, end)
    full = record.encode(Message("R", b"torn" * 100, keys=("torn",)), 40, end, 1)
    junk = {
        "torn-half": full[: len(full) // 2],
        "torn-header": full[:20],
        "garbage": os.urandom(300),
        "bogus-size": full[:4] + b"\0" * 200,  # a plausible size, nothing behind it
    }[kind]
    write_at(path, off, junk)
    c = stores.open(copy_config(s, c_dir))
    assert c.commitlog.write_pos == end
    _check_all(c, sent)
    assert c.query_by_key("R", "torn") == []
    r = c.put(Message("R", b"after", queue_id=0))
    assert r.commitlog_offset == end
    assert c.read_at("R", 0, r.queue_offset).body == b"after"
    c2 = stores.reopen(c)
    assert [m.body for m in read_all(c2, "R", 0)] == [m.body for m, _ in sent if m.queue_id == 0] + [b"after"]


@pytest.mark.parametrize("checkpoint", ["none", "just-before-the-victim"])
def test_corruption_in_the_middle_cuts_the_rest_and_queues_follow(stores, checkpoint: str) -> None:
    """Records after a corrupt one are not trusted: the log ends there, across CQ files and segments."""
    s = stores.open(checkpoint_interval_ms=3_600_000)
    sent = []
    for i in range(200):  # one queue: 200 entries = four 64-entry CQ files; ~5 segments
        if i == 62 and checkpoint != "none":
            force_checkpoint(s)  # recovery then re-dispatches nothing of this queue
        m = Message("Q", body_for(i, 1500), keys=(f"q{i}",), extra_dispatch=((("W", 0),) if i % 2 else ()))
        sent.append((m, s.put(m)))
    assert len(segment_paths(s.root)) >= 4
    victim = sent[62][1]
    c_dir = crash_copy(s, stores.tmp_path / "c")
    path, off = locate(c_dir, SEG, victim.commitlog_offset)
    flip_bytes(path, off + 200, 4)
    c = stores.open(copy_config(s, c_dir))
    assert c.commitlog.write_pos == victim.commitlog_offset
    assert len(segment_paths(c_dir)) == victim.commitlog_offset // SEG + 1
    assert c.max_offset("Q", 0) == 62 and c.max_offset("W", 0) == 31
    assert [m.body for m in read_all(c, "Q", 0)] == [m.body for m, _ in sent[:62]]
    assert c.get("Q", 0, 62, 5).status == GetStatus.OFFSET_OVERFLOW_ONE
    assert c.query_by_key("Q", "q100") == []
    # new puts reuse the cut queue offsets, across the consume-queue file boundary at 64
    new = []
    for i in range(10):
        m = Message("Q", b"new-%d" % i, extra_dispatch=(("W", 0),))
        r = c.put(m)
        assert r.queue_offset == 62 + i and r.extra_offsets == (31 + i,)
        new.append(m.body)
    expect = [m.body for m, _ in sent[:62]] + new
    assert [m.body for m in read_all(c, "Q", 0)] == expect
    assert [c.read_at("Q", 0, o).body for o in range(60, 72)] == expect[60:72]
    expect_w = [m.body for m, _ in sent[:62] if m.extra_dispatch] + new
    assert [m.body for m in read_all(c, "W", 0)] == expect_w
    # and the consume queues on disk say the same after a clean restart and after a crash
    c2 = stores.reopen(c)
    assert c2.max_offset("Q", 0) == 72 and [m.body for m in read_all(c2, "Q", 0)] == expect
    c3 = _open_copy(stores, c2, "c3")
    assert c3.max_offset("Q", 0) == 72 and [m.body for m in read_all(c3, "Q", 0)] == expect
    assert [m.body for m in read_all(c3, "W", 0)] == expect_w


def test_consume_queue_entries_past_the_log_end_are_truncated(stores) -> None:
    """The consume queue reached disk, the commitlog's last pages did not."""
    s = stores.open(checkpoint_interval_ms=3_600_000)
    sent = _fill(s, 120)
    cut_at = sent[100][1].commitlog_offset
    c_dir = crash_copy(s, stores.tmp_path / "c")
    path, off = locate(c_dir, SEG, cut_at)
    write_at(path, off, b"\0" * (SEG - off))
    for p in segment_paths(c_dir):
        if int(p.name) > cut_at:
            p.unlink()
    c = stores.open(copy_config(s, c_dir))
    assert c.commitlog.write_pos == cut_at
    _check_all(c, sent[:100])
    for q in (0, 1):
        assert c.get("R", q, c.max_offset("R", q), 1).status == GetStatus.OFFSET_OVERFLOW_ONE
    more = _fill(c, 30, start=100)
    _check_all(c, sent[:100] + more)
    _check_all(stores.reopen(c), sent[:100] + more)


# ============================================================================ lost indexes


@pytest.mark.parametrize("stop", ["crash", "clean"])
def test_deleted_consumequeue_dir_is_rebuilt(stores, stop: str) -> None:
    s = stores.open()
    sent = _fill(s, 300)
    link = s.put_link(sent[3][1].commitlog_offset, "DELAY", 1, properties={"p": "1"})
    if stop == "crash":
        force_checkpoint(s)
        d = crash_copy(s, stores.tmp_path / "c")
        cfg = copy_config(s, d)
    else:
        s.shutdown()
        d, cfg = s.root, s.config
    shutil.rmtree(d / "consumequeue")
    c = stores.open(cfg)
    assert c.recovered_abnormally is (stop == "crash")
    _check_all(c, sent)
    assert c.read_at("DELAY", 1, 0).message_id == link.message_id
    flt = compile_filter(FilterExpression("t1"))
    assert [m.body for m in read_all(c, "R", 0, flt=flt)] == [
        m.body for m, _ in sent if m.queue_id == 0 and m.tag == "t1"
    ]
    more = _fill(c, 20, start=300)
    _check_all(stores.reopen(c), sent + more)


def test_deleted_index_dir_is_rebuilt_after_a_crash_without_checkpoint(stores) -> None:
    s = stores.open(checkpoint_interval_ms=3_600_000)
    sent = _fill(s, 250)
    d = crash_copy(s, stores.tmp_path / "c")
    shutil.rmtree(d / "index")
    c = stores.open(copy_config(s, d))
    _check_all(c, sent)


def test_recovery_twice_in_a_row_is_stable(stores) -> None:
    s = stores.open(checkpoint_interval_ms=3_600_000)
    sent = _fill(s, 150)
    c1 = _open_copy(stores, s, "c1")
    c2 = _open_copy(stores, c1, "c2")  # crash again right after recovering
    _check_all(c2, sent)
    assert c2.commitlog.write_pos == s.commitlog.write_pos
    # re-dispatching twice never duplicated an index hit
    assert len(c2.query_by_key("R", "k5")) == 1


# ============================================================================ full disk (simulated)


@pytest.fixture
def enospc(monkeypatch):
    """Switch: while on, every new segment/queue/index file allocation fails with ENOSPC."""

    class Switch:
        on = False
        calls = 0

    real = os.posix_fallocate

    def fake(fd, offset, length):
        if Switch.on:
            Switch.calls += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, offset, length)

    monkeypatch.setattr(mapped_file.os, "posix_fallocate", fake)
    return Switch


def _walk_all(data_dir: Path) -> list[int]:
    """Every record offset found walking the segments (asserting each is whole)."""
    out = []
    for p in segment_paths(data_dir):
        recs, _ = walk_segment(p)
        out += [int(p.name) + o for o, kind, _ in recs if kind == 1]
    return out


def _leftover_files(data_dir: Path) -> set[Path]:
    return {p for p in data_dir.rglob("*") if p.is_file()}


def test_full_disk_at_segment_roll(stores, enospc) -> None:
    s = stores.open()
    sent = []
    while s.commitlog.write_pos < SEG - 3000:
        m = Message("F", body_for(len(sent), 900), queue_id=len(sent) % 2, keys=(f"f{len(sent)}",))
        sent.append((m, s.put(m)))
    pos = s.commitlog.write_pos
    files_before = _leftover_files(s.root)
    seg_bytes = segment_paths(s.root)[0].read_bytes()
    enospc.on = True
    big = Message("F", body_for(9999, 5000), queue_id=0)
    for attempt in (lambda: s.put(big), lambda: s.put_batch([Message("F", b"small"), big])):
        with pytest.raises(StoreFullError) as ei:
            attempt()
        assert ei.value.code == "STORE_FULL"
    assert enospc.calls >= 2
    # the batch stored what fit before it needed a new segment; everything else is untouched
    batch_small_stored = s.commitlog.write_pos != pos
    assert len(segment_paths(s.root)) == 1
    assert {p for p in _leftover_files(s.root) if "commitlog" in p.parts} == {
        p for p in files_before if "commitlog" in p.parts
    }
    if not batch_small_stored:
        assert segment_paths(s.root)[0].read_bytes() == seg_bytes
    expect = sent + ([(Message("F", b"small"), None)] if batch_small_stored else [])
    assert _walk_all(s.root) == [r.commitlog_offset for _, r in sent] + (
        [pos] if batch_small_stored else []
    )
    # still readable, and small puts that fit the current segment still work
    for q in (0, 1):
        assert [m.body for m in read_all(s, "F", q)] == [m.body for m, _ in expect if m.queue_id == q]
    # the disk frees up: puts work again
    enospc.on = False
    r = s.put(big)
    assert r.status == PutStatus.PUT_OK and r.commitlog_offset == SEG
    assert s.read_at("F", 0, r.queue_offset).body == big.body
    s2 = stores.reopen(s)
    assert s2.read_at("F", 0, r.queue_offset).body == big.body
    assert [m.body for m in read_all(s2, "F", 1)] == [m.body for m, _ in expect if m.queue_id == 1]


async def test_full_disk_put_async_and_link(stores, enospc) -> None:
    s = stores.open()
    r0 = s.put(Message("F", b"origin"))
    while s.commitlog.write_pos < SEG - 2000:
        s.put(Message("F", b"x" * 1000))
    pos = s.commitlog.write_pos
    enospc.on = True
    with pytest.raises(StoreFullError):
        await s.put_async(Message("F", b"y" * 4000))
    with pytest.raises(StoreFullError):
        await s.put_batch_async([Message("F", b"y" * 4000)])
    # a link that fits the current segment still works, one that needs a roll is refused
    while True:
        try:
            s.put_link(r0.commitlog_offset, "L", 0, properties={"pad": "p" * 500})
        except StoreFullError:
            break
    assert s.commitlog.write_pos <= SEG and len(segment_paths(s.root)) == 1
    assert s.commitlog.write_pos >= pos
    enospc.on = False
    rl = s.put_link(r0.commitlog_offset, "L", 0)
    assert s.read_at("L", 0, rl.queue_offset).body == b"origin"


def test_full_disk_at_consume_queue_roll(stores, enospc) -> None:
    s = stores.open()
    for i in range(CQ_PER_FILE):
        s.put(Message("C", b"m%d" % i, queue_id=0))
    s.put(Message("other", b"o"))
    pos = s.commitlog.write_pos
    enospc.on = True
    with pytest.raises(StoreFullError):
        s.put(Message("C", b"needs a new cq file", queue_id=0))
    with pytest.raises(StoreFullError):
        s.put_batch([Message("C", b"needs a new cq file", queue_id=0)])
    with pytest.raises(StoreFullError):
        s.put(Message("other", b"dispatch", extra_dispatch=(("C", 0),)))
    assert s.commitlog.write_pos == pos
    assert s.max_offset("C", 0) == CQ_PER_FILE and s.max_offset("other", 0) == 1
    s.put(Message("other", b"fits"))  # a queue with room is unaffected
    enospc.on = False
    r = s.put(Message("C", b"now", queue_id=0))
    assert r.queue_offset == CQ_PER_FILE
    assert [m.body for m in read_all(s, "C", 0)][-2:] == [b"m63", b"now"]
    s2 = stores.reopen(s)
    assert [m.body for m in read_all(s2, "C", 0)][-2:] == [b"m63", b"now"]
    assert [m.body for m in read_all(s2, "other", 0)] == [b"o", b"fits"]


def test_full_disk_at_index_roll_writes_nothing(stores, enospc) -> None:
    s = stores.open(index_entries_per_file=16)
    n = 0
    while True:  # fill the index file exactly
        s.put(Message("I", b"i%d" % n, keys=(f"ik{n}",)))
        n += 1
        if s.index.files[-1].count == 16:
            break
    pos = s.commitlog.write_pos
    enospc.on = True
    for m in (
        Message("I", b"with key", keys=("new-key",)),
        Message("I", b"with id", message_id="new-id"),
        Message("I", b"with two keys", keys=("a", "b")),
    ):
        with pytest.raises(StoreFullError):
            s.put(m)
        with pytest.raises(StoreFullError):
            s.put_batch([m])
    assert s.commitlog.write_pos == pos and s.max_offset("I", 0) == n
    s.put(Message("I", b"no key needs no index"))
    enospc.on = False
    r = s.put(Message("I", b"with key", keys=("new-key",), message_id="new-id"))
    assert [m.body for m in s.query_by_key("I", "new-key")] == [b"with key"]
    assert s.query_by_id("new-id").commitlog_offset == r.commitlog_offset
    assert [m.body for m in read_all(s, "I", 0)][-2:] == [b"no key needs no index", b"with key"]


def test_full_disk_in_the_middle_of_a_batch_leaves_whole_records(stores, enospc) -> None:
    s = stores.open()
    s.put(Message("B", b"before"))
    enospc.on = True
    msgs = [Message("B", body_for(i, 2000)) for i in range(60)]  # needs a second segment
    with pytest.raises(StoreFullError):
        s.put_batch(msgs)
    stored = read_all(s, "B", 0)
    # what was stored is a prefix of the batch, each record whole and readable
    assert stored[0].body == b"before"
    assert [m.body for m in stored[1:]] == [m.body for m in msgs[: len(stored) - 1]]
    assert _walk_all(s.root) == [m.commitlog_offset for m in stored]
    enospc.on = False
    rs = s.put_batch(msgs[len(stored) - 1 :])
    assert [m.body for m in read_all(s, "B", 0)[1:]] == [m.body for m in msgs]
    assert rs[-1].queue_offset == 60


# ============================================================================ full disk (real filesystem)


@pytest.fixture
def tiny_fs(tmp_path: Path):
    """A 2 MiB tmpfs mounted for this test (root only; skipped where mount is not allowed)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / f"tiny-{uuid.uuid4().hex[:8]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True,
                       timeout=30)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_real_tiny_filesystem_fills_up(stores, tiny_fs: Path) -> None:
    ballast = tiny_fs / "ballast"
    ballast.write_bytes(b"\1" * (512 * 1024))  # freed later to make room again
    cfg = make_config(tiny_fs / "data", commitlog_segment_size=256 * 1024)
    s = stores.open(cfg)
    acked = []
    with pytest.raises(StoreFullError):
        for i in range(2000):  # 2 MiB cannot hold 2000 x 4 KiB: bounded
            m = Message("F", body_for(i, 4000), queue_id=i % 2, keys=(f"k{i}",))
            acked.append((m, s.put(m)))
    assert 100 < len(acked) < 2000
    # the log is readable and holds every acknowledged message, byte for byte
    for q in (0, 1):
        assert [m.body for m in read_all(s, "F", q)] == [m.body for m, _ in acked if m.queue_id == q]
    assert _walk_all(s.root) == [r.commitlog_offset for _, r in acked]
    with pytest.raises(StoreFullError):
        s.put(Message("F", body_for(0, 60_000)))
    ballast.unlink()
    more = []
    for i in range(10):
        m = Message("F", body_for(5000 + i, 4000), queue_id=0)
        more.append((m, s.put(m)))
    s2 = stores.reopen(s)
    assert s2.recovered_abnormally is False
    assert [m.body for m in read_all(s2, "F", 0)] == [m.body for m, _ in acked + more if m.queue_id == 0]
    s2.shutdown()
