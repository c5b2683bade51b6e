"""Crash safety of the store: a writer process is SIGKILLed again and again on one data dir.

A child process (``tests/crash_writer.py``) opens the store -- recovering from
the previous kill -- and writes messages whose every field is a pure function
of (seed, sequence number) from sync-put threads, a put_batch thread and an
asyncio loop of concurrent ``put_async`` calls (group commit). It prints an
``ACK`` line only after a put returned, i.e. (sync flush) after fdatasync
covered the record. The parent kills it with SIGKILL at a random moment (a
random number of acks, a random delay, or right after spawning, possibly in
the middle of recovery), then opens a *copy* of the crashed data dir --
leaving the original crashed for the next writer to recover -- and checks:

* the store reopens, reports ``recovered_abnormally`` and its log walks cleanly;
* every record in the commitlog decodes to exactly the content its sequence
  number prescribes (unacknowledged but fully written records may be there),
  and no sequence number is stored twice;
* every consume queue is dense from 0, with no duplicate offset, each entry
  pointing at a record that names this (topic, queue, offset) and nothing else
  points anywhere -- read through ``get`` and ``read_at``;
* every acknowledged message is at the queue offsets and commitlog offset its
  PutResult named, by message id (server or client id) and by its keys, byte
  for byte.

The seed comes from ``UNIMQ_CRASH_SEED`` or is random; it is printed and part
of every assertion message so a failure can be replayed.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from core_broker import record
from core_broker.config import FlushMode, StoreConfig
from core_broker.message_store import MessageStore
from core_broker.model import GetStatus, Message

REPO_ROOT = Path(__file__).resolve().parent.parent
WRITER = Path(__file__).resolve().parent / "crash_writer.py"
SEQ_STRIDE = 10_000_000  # cycle c writes sequence numbers [c*STRIDE, (c+1)*STRIDE)

_spec = importlib.util.spec_from_file_location("unimq_crash_writer", WRITER)
cw = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(cw)  # type: ignore[union-attr]


@functools.lru_cache(maxsize=None)
def expected(seed: int, seq: int) -> dict:
    return cw.expected(seed, seq)


def _seed() -> int:
    env = os.environ.get("UNIMQ_CRASH_SEED")
    return int(env) if env else random.SystemRandom().randrange(1, 2**31)


@dataclass
class Cycle:
    index: int
    plan: str
    acks: dict[int, dict] = field(default_factory=dict)
    ready: dict | None = None
    returncode: int | None = None
    stderr: str = ""
    nacks: int = 0


def run_writer(
    data_dir: Path,
    flush: str,
    seed: int,
    cycle: int,
    rng: random.Random,
    log_dir: Path,
    *,
    plan: str | None = None,
    count: int | None = None,
) -> Cycle:
    """Run one writer; SIGKILL it (by PID) according to a random plan, or let it stop after ``count`` acks."""
    if plan is None:
        plan = rng.choices(["acks", "delay", "early"], weights=[5, 4, 1])[0]
    c = Cycle(cycle, plan if count is None else "clean")
    stderr_path = log_dir / f"writer-{cycle}.stderr"
    args = [sys.executable, str(WRITER), "--data-dir", str(data_dir), "--flush", flush, "--seed", str(seed),
            "--first-seq", str(cycle * SEQ_STRIDE)]
    if count is not None:
        args += ["--count", str(count)]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with stderr_path.open("w") as err:
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=err)
    spawned = time.monotonic()
    lines: queue.Queue[bytes | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, name=f"crash-writer-{proc.pid}", daemon=True)
    reader.start()

    kill_after_acks = rng.randint(1, 600)
    kill_delay = rng.uniform(0.005, 0.3)
    early_delay = rng.uniform(0.0, 0.3)  # often before READY, sometimes mid-recovery
    ready_at: float | None = None
    killed = False

    def handle(raw: bytes) -> None:
        nonlocal ready_at
        if not raw.endswith(b"\n"):
            return  # cut mid-line by the kill: never acknowledged
        kind, _, rest = raw.decode().rstrip("\n").partition(" ")
        if kind == "ACK":
            a = json.loads(rest)
            assert a["s"] not in c.acks, f"seed={seed}: seq {a['s']} acknowledged twice"
            c.acks[a["s"]] = a
        elif kind == "READY":
            c.ready = json.loads(rest)
            ready_at = time.monotonic()
        elif kind == "NACK":
            c.nacks += 1

    deadline = spawned + 60
    try:
        eof = False
        while not killed and not eof:
            now = time.monotonic()
            if count is None and (
                (plan == "early" and now - spawned >= early_delay)
                or (plan == "delay" and ready_at is not None and now - ready_at >= kill_delay)
                or (plan == "acks" and len(c.acks) >= kill_after_acks)
            ):
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
                break
            assert now < deadline, f"seed={seed}: writer cycle {cycle} made no progress; plan={plan}"
            try:
                raw = lines.get(timeout=0.005)
            except queue.Empty:
                continue
            if raw is None:
                eof = True
            else:
                handle(raw)
        c.returncode = proc.wait(timeout=30)
        reader.join(timeout=30)
        while True:  # everything the writer printed before it died was acknowledged
            try:
                raw = lines.get_nowait()
            except queue.Empty:
                break
            if raw is not None:
                handle(raw)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    c.stderr = stderr_path.read_text(errors="replace")
    expected_rc = 0 if count is not None else -signal.SIGKILL
    assert c.returncode == expected_rc, (
        f"seed={seed}: writer cycle {cycle} exited with {c.returncode} (plan {c.plan}); stderr:\n{c.stderr}"
    )
    # A FLUSH_DISK_TIMEOUT answer (NACK) is not an acknowledgement: such a message may or may
    # not be there, like any other unacknowledged one. Counted for the log only.
    if count is not None:
        assert len(c.acks) == count
    return c


# ---------------------------------------------------------------------------------- checks


def check_message(m, e: dict, ctx: str) -> None:
    """Every field of a read message against the content its sequence number prescribes."""
    got = {
        "body": bytes(m.body),
        "tag": m.tag,
        "keys": tuple(m.keys),
        "properties": dict(m.properties),
        "extra": tuple((t, q) for t, q in m.extra_dispatch),
        "message_group": m.message_group,
        "born_host": m.born_host,
        "born_timestamp_ms": m.born_timestamp_ms,
        "delivery_time_ms": m.delivery_time_ms,
        "protocol": m.protocol,
        "reconsume_times": m.reconsume_times,
    }
    want = {k: e[k] for k in got}
    if not e["born_timestamp_ms"]:  # none given: the store stamps the message with its store time
        want["born_timestamp_ms"] = m.store_timestamp_ms
    if got != want:
        diff = {k: (got[k] if k != "body" else f"{len(got[k])}B", want[k] if k != "body" else f"{len(want[k])}B")
                for k in got if got[k] != want[k]}
        raise AssertionError(f"{ctx}: content differs (got, want): {diff}")
    assert m.flags & record.FLAG_LINK == 0, f"{ctx}: unexpected link flag"
    if e["message_id"]:
        assert m.message_id == e["message_id"], f"{ctx}: message id {m.message_id!r} != {e['message_id']!r}"


def open_store(data_dir: Path, flush: str) -> MessageStore:
    store = MessageStore(cw.make_config(data_dir, flush))
    store.start()
    return store


def verify_store(
    store: MessageStore, seed: int, last_cycle: int, acks: dict[int, dict], ctx: str, deep: set[int] | None = None
) -> dict:
    """Check the whole store (see the module docstring); return a summary for later comparison."""
    if deep is None:
        deep = set(acks)
    cl = store.commitlog
    # 1. Walk the log record by record; every record is valid and decodes to its prescribed content.
    headers: list[record.RecordHeader] = []
    end = cl.scan(cl.first_record_offset(), headers.append)
    assert end == cl.write_pos, f"{ctx}: log walk ends at {end}, write position is {cl.write_pos}"
    seq_at: dict[int, int] = {}  # phys -> seq
    phys_of: dict[int, int] = {}  # seq -> phys
    cq_expect: dict[tuple[str, int], dict[int, int]] = {}  # (topic, qid) -> {queue offset: phys}
    for h in headers:
        m = store.read_phys(h.phys_offset)
        where = f"{ctx}: record at {h.phys_offset}"
        assert m.commitlog_offset == h.phys_offset and m.store_size == h.size, where
        seq = cw.seq_of(m)
        assert 0 <= seq < (last_cycle + 1) * SEQ_STRIDE, f"{where}: seq {seq} was never written"
        assert seq not in phys_of, f"{where}: seq {seq} stored twice (also at {phys_of[seq]})"
        e = expected(seed, seq)
        assert (m.topic, m.queue_id) == (e["topic"], e["queue_id"]), f"{where}: seq {seq} in the wrong queue"
        check_message(m, e, f"{where} (seq {seq})")
        phys_of[seq] = h.phys_offset
        seq_at[h.phys_offset] = seq
        names = [(h.topic, h.queue_id, h.queue_offset), *h.dispatch]
        assert {(t, q) for t, q, _ in names} == cw.targets(e), f"{where}: dispatch targets differ"
        for t, q, o in names:
            slot = cq_expect.setdefault((t, q), {})
            assert o not in slot, f"{where}: queue offset {t}/{q}@{o} given twice (also {slot[o]})"
            slot[o] = h.phys_offset

    # 2. Every consume queue: dense from 0, entries exactly the records that name them.
    known = {(t, q) for t in store.queue_topics() for q in store.queue_ids(t)}
    for key in known - set(cq_expect):
        assert store.max_offset(*key) == 0, f"{ctx}: queue {key} has entries but no record names it"
    for (topic, qid), slots in cq_expect.items():
        qctx = f"{ctx}: queue {topic}/{qid}"
        n = len(slots)
        assert sorted(slots) == list(range(n)), f"{qctx}: record queue offsets not dense: {sorted(slots)[:5]}..."
        assert store.min_offset(topic, qid) == 0, qctx
        assert store.max_offset(topic, qid) == n, f"{qctx}: max offset {store.max_offset(topic, qid)} != {n}"
        off = 0
        while off < n:
            r = store.get(topic, qid, off, 128)
            assert r.status == GetStatus.FOUND, f"{qctx}: get@{off} -> {r.status}"
            for m in r.messages:
                assert m.queue_offset == off, f"{qctx}: get returned offset {m.queue_offset}, expected {off}"
                assert m.commitlog_offset == slots[off], f"{qctx}@{off}: points at {m.commitlog_offset}"
                seq = seq_at[m.commitlog_offset]
                assert cw.seq_of(m) == seq, f"{qctx}@{off}"
                check_message(m, expected(seed, seq), f"{qctx}@{off} (seq {seq})")
                off += 1
            assert r.next_offset == off, f"{qctx}: get skipped entries ({r.next_offset} != {off})"
        r = store.get(topic, qid, n, 8)
        assert r.status == GetStatus.OFFSET_OVERFLOW_ONE and not r.messages, f"{qctx}: data past max offset"

    # 3. Every acknowledged message is where its PutResult said (every queue entry was checked
    #    byte for byte above); ``deep`` ones are also read back by queue offset, id and key.
    for seq, a in acks.items():
        actx = f"{ctx}: acknowledged seq {seq} ({a})"
        e = expected(seed, seq)
        assert phys_of.get(seq) == a["p"], f"{actx}: lost (found at {phys_of.get(seq)})"
        assert a["q"] == e["queue_id"] and len(a["x"]) == len(e["extra"]), actx
        places = [(e["topic"], a["q"], a["o"]), *((t, q, o) for (t, q), o in zip(e["extra"], a["x"]))]
        for t, q, o in places:
            assert cq_expect[(t, q)].get(o) == a["p"], f"{actx}: {t}/{q}@{o} holds {cq_expect[(t, q)].get(o)}"
        if e["message_id"]:
            assert a["id"] == e["message_id"], actx
        if seq not in deep:
            continue
        for t, q, o in places:
            m = store.read_at(t, q, o)
            assert m is not None, f"{actx}: nothing at {t}/{q}@{o}"
            assert m.commitlog_offset == a["p"], f"{actx}: {t}/{q}@{o} holds {m.commitlog_offset}"
            check_message(m, e, f"{actx} at {t}/{q}@{o}")
        m = store.query_by_id(a["id"])
        assert m is not None and m.commitlog_offset == a["p"], f"{actx}: query_by_id failed"
        check_message(m, e, f"{actx} by id")
        for k in e["keys"]:
            if k.startswith("shared-"):
                continue  # thousands of messages share it; its chain is checked by the unique keys
            found = store.query_by_key(e["topic"], k)
            assert a["p"] in [x.commitlog_offset for x in found], f"{actx}: query_by_key({k!r}) misses it"
    return {
        "write_pos": cl.write_pos,
        "records": len(headers),
        "queues": {k: len(v) for k, v in cq_expect.items()},
    }


def verify_copy(
    data_dir: Path, scratch: Path, flush: str, seed: int, cycle: int, acks: dict[int, dict], deep: set[int]
) -> dict:
    """Verify a copy of the crashed dir (the original stays crashed for the next writer to recover)."""
    copy = scratch / f"verify-{cycle}"
    shutil.copytree(data_dir, copy)
    ctx = f"seed={seed} cycle={cycle}"
    store = open_store(copy, flush)
    try:
        assert store.recovered_abnormally, f"{ctx}: a killed store must recover abnormally"
        summary = verify_store(store, seed, cycle, acks, ctx, deep)
    finally:
        store.shutdown()
    if cycle % 4 == 3:  # a clean restart after a crash recovery keeps everything, quickly
        store = open_store(copy, flush)
        try:
            assert not store.recovered_abnormally, f"{ctx}: clean stop after recovery not recognised"
            again = verify_store(store, seed, cycle, acks, ctx + " (clean reopen)", set())
            assert again == summary, f"{ctx}: clean reopen differs"
        finally:
            store.shutdown()
    shutil.rmtree(copy)
    return summary


def crash_loop(tmp_path: Path, flush: str, cycles: int, seed: int) -> None:
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    scratch = tmp_path / "scratch"
    log_dir = tmp_path / "logs"
    scratch.mkdir()
    log_dir.mkdir()
    acks: dict[int, dict] = {}
    history: list[str] = []
    print(f"crash test seed={seed} flush={flush} (replay: UNIMQ_CRASH_SEED={seed})")
    prev_records = 0
    for cycle in range(cycles):
        plan = "acks" if cycle == 0 else None  # the first writer always gets some acks in
        t0 = time.monotonic()
        c = run_writer(data_dir, flush, seed, cycle, rng, log_dir, plan=plan)
        t1 = time.monotonic()
        if c.ready is not None and cycle > 0:
            assert c.ready["recovered_abnormally"], f"seed={seed} cycle={cycle}: writer did not see the crash"
        acks.update(c.acks)
        history.append(f"{c.plan}:{len(c.acks)}" + (f"(+{c.nacks} nacks)" if c.nacks else ""))
        if not data_dir.exists():  # killed before the store created anything
            assert not c.acks
            continue
        # Read back by offset, id and key: this writer's acks and a sample of the older ones.
        older = sorted(set(acks) - set(c.acks))
        deep = set(c.acks) | set(rng.sample(older, min(len(older), 200)))
        summary = verify_copy(data_dir, scratch, flush, seed, cycle, acks, deep)
        assert summary["records"] >= prev_records, f"seed={seed} cycle={cycle}: records vanished"
        prev_records = summary["records"]
        print(f"  cycle {cycle}: {c.plan} plan, {len(c.acks)} acks, writer {t1 - t0:.2f}s, "
              f"verify {time.monotonic() - t1:.2f}s, {summary['records']} records")
    print(f"cycles (plan:acks): {' '.join(history)}; {len(acks)} acknowledged, {prev_records} records")
    assert len(acks) > 0, f"seed={seed}: no writer got a single ack in"

    # Finally a writer recovers the original dir itself, writes, and stops cleanly.
    c = run_writer(data_dir, flush, seed, cycles, rng, log_dir, count=300)
    assert c.ready is not None and c.ready["recovered_abnormally"], f"seed={seed}: final writer saw no crash"
    acks.update(c.acks)
    store = open_store(data_dir, flush)
    try:
        assert not store.recovered_abnormally, f"seed={seed}: clean stop not recognised"
        verify_store(store, seed, cycles, acks, f"seed={seed} final")
    finally:
        store.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigkill_sync_flush_loses_no_acknowledged_message(tmp_path: Path) -> None:
    crash_loop(tmp_path, "sync", cycles=12, seed=_seed())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigkill_async_flush_reopens_clean(tmp_path: Path) -> None:
    # SIGKILL does not lose the page cache, so even async-acknowledged messages survive.
    crash_loop(tmp_path, "async", cycles=3, seed=_seed())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("gap", [0, 1, 5, 11, 12, 40])
def test_sigkill_after_roll_with_short_segment_tail(tmp_path: Path, gap: int) -> None:
    """A record ending 1..11 bytes before its segment's end leaves no room for a BLANK.

    Recovery must continue in the next segment instead of cutting the log there
    (which used to drop every later segment, acknowledged messages included).
    """
    data_dir = tmp_path / "data"
    code = f"""
import os, signal, sys
from core_broker.config import FlushMode, StoreConfig
from core_broker.message_store import MessageStore
from core_broker.model import Message
from core_broker import record
st = MessageStore(StoreConfig(data_dir={str(data_dir)!r}, flush=FlushMode.SYNC, commitlog_segment_size=8192))
st.start()
bare = len(record.encode(Message("T", b""), 0, 0, 0))
while 8192 - st.commitlog.write_pos > 3000:
    st.put(Message("T", b"x" * 1000))
st.put(Message("T", b"y" * (8192 - st.commitlog.write_pos - {gap} - bare)))
print("END", st.commitlog.write_pos, flush=True)
for i in range(3):
    r = st.put(Message("T", b"after-%d" % i))
    print("ACK", r.queue_offset, r.commitlog_offset, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr
    out = p.stdout.split("\n")
    assert out[0] == f"END {8192 - gap}", out
    acked = [tuple(map(int, ln.split()[1:])) for ln in out if ln.startswith("ACK")]
    assert len(acked) == 3
    store = MessageStore(StoreConfig(data_dir=data_dir, flush=FlushMode.SYNC, commitlog_segment_size=8192))
    store.start()
    try:
        assert store.recovered_abnormally
        for i, (qo, phys) in enumerate(acked):
            m = store.read_at("T", 0, qo)
            assert m is not None and m.body == b"after-%d" % i and m.commitlog_offset == phys, (gap, qo, m)
        assert store.max_offset("T", 0) == acked[-1][0] + 1
        # and the store keeps writing where the log really ends
        r = store.put(Message("T", b"later"))
        assert r.queue_offset == acked[-1][0] + 1 and r.commitlog_offset > acked[-1][1]
    finally:
        store.shutdown()
