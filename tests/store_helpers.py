"""Helpers shared by the MessageStore tests (test_store*.py).

Why a helper module and not conftest.py: these are plain functions and one
fixture the store tests import explicitly, so a reader of a test file sees
where everything comes from.

Crash simulation in-process: :func:`crash_copy` copies a *running* store's
data directory while holding the store's put lock. Segments are shared
mappings, so a plain file read sees every byte a put wrote (the page cache is
the same), but nothing was shut down: the copy has the abort marker and only
the checkpoint the flush thread last wrote -- exactly what a ``kill -9``
leaves behind. Opening the copy exercises the crash-recovery path without a
subprocess; the original store keeps running and is shut down at teardown.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Iterator

import pytest

from core_broker import record
from core_broker.appender import Appender
from core_broker.commitlog import CommitLog
from core_broker.config import FlushMode, StoreConfig
from core_broker.consume_queue import ConsumeQueue
from core_broker.index_file import IndexService
from core_broker.message_store import MessageStore
from core_broker.model import GetStatus, Message, StoredMessage

SEG = 64 * 1024  # commitlog segment size used by most tests
CQ_PER_FILE = 64  # consume-queue entries per file: queues roll every 64 messages


def make_appender(root: Path, *, segment: int = 1 << 20, max_size: int = 1 << 20, cq_entries: int = 1000,
                  native: bool = True) -> Appender:
    """An open Appender over a commitlog, an index and consume queues in ``root``, no store.

    For the tests of the appender itself (test_appender.py, test_record_native.py): what
    the store adds around it (flush, dispatch threads, recovery) would only hide its bytes.
    """
    cl = CommitLog(root / "commitlog", segment)
    cl.load()
    index = IndexService(root / "index", 1024, 4096)
    index.load()
    cqs: dict[tuple[str, int], ConsumeQueue] = {}

    def factory(topic: str, qid: int) -> ConsumeQueue:
        cq = cqs.get((topic, qid))
        if cq is None:
            cq = cqs[(topic, qid)] = ConsumeQueue(root / "cq", topic, qid, cq_entries)
        return cq

    a = Appender(cl, index, cqs, factory, max_size, native=native)
    a.set_store_id("00112233AABBCCDD")
    a.open = True
    return a


def make_config(data_dir: Path, **overrides) -> StoreConfig:
    """A small store: 64 KiB segments, 64-entry consume-queue files, tiny index files.

    Background housekeeping (retention, offset persistence) is pushed far out so a
    test decides when retention runs, and the disk thresholds are zero so the
    host's real free space never changes a test's outcome.
    """
    kw = dict(
        data_dir=data_dir,
        flush=FlushMode.ASYNC,
        commitlog_segment_size=SEG,
        cq_entries_per_file=CQ_PER_FILE,
        index_slots=64,
        index_entries_per_file=256,
        flush_interval_ms=10,
        checkpoint_interval_ms=50,
        retention_check_interval_s=3600.0,
        consumer_offset_persist_interval_s=3600.0,
        disk_min_free_ratio=0.0,
        disk_refuse_free_ratio=0.0,
    )
    kw.update(overrides)
    return StoreConfig(**kw)


class StoreFactory:
    """Opens stores under ``tmp_path``; shuts every still-running one down at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.stores: list[MessageStore] = []

    def config(self, name: str = "data", **overrides) -> StoreConfig:
        return make_config(self.tmp_path / name, **overrides)

    def open(self, cfg: StoreConfig | None = None, **overrides) -> MessageStore:
        if cfg is None:
            cfg = self.config(**overrides)
        elif overrides:
            kw = {**_config_fields(cfg), **overrides}
            cfg = make_config(kw.pop("data_dir"), **kw)
        s = MessageStore(cfg)
        s.start()
        self.stores.append(s)
        return s

    def reopen(self, store: MessageStore, **overrides) -> MessageStore:
        """Clean stop (if running) and open the same data dir again."""
        if store.running:
            store.shutdown()
        return self.open(store.config, **overrides)

    def close_all(self) -> None:
        errors = []
        for s in reversed(self.stores):
            if s.running:
                try:
                    s.shutdown()
                except Exception as e:  # keep closing the others
                    errors.append(e)
        self.stores.clear()
        if errors:
            raise errors[0]


def _config_fields(cfg: StoreConfig) -> dict:
    from dataclasses import fields

    return {f.name: getattr(cfg, f.name) for f in fields(cfg)}


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[StoreFactory]:
    f = StoreFactory(tmp_path)
    yield f
    f.close_all()


# --------------------------------------------------------------------------- crash simulation


def force_checkpoint(store: MessageStore, timeout: float = 10.0) -> int:
    """Make the checkpoint cover the current write position; return that position.

    With a short checkpoint interval the flush thread writes it soon: wait for that
    (writing it from here too would race the flush thread on the same temp file).
    With a long one (tests that control checkpoints) write it from here.
    """
    with store._lock:
        pos = store.commitlog.write_pos
    if store.config.checkpoint_interval_ms <= 5000:

        def covered() -> bool:
            try:
                return json.loads((store.root / "checkpoint").read_text()).get("safe", -1) >= pos
            except (FileNotFoundError, ValueError):
                return False

        assert wait_until(covered, timeout), "the flush thread wrote no checkpoint"
        return pos
    store.commitlog.sync()
    store._checkpoint(pos)
    return pos


def crash_copy(store: MessageStore, dest: Path) -> Path:
    """Copy a running store's data dir as a SIGKILL at this instant would leave it."""
    with store._lock:  # no put is half way through while we copy
        src = store.root
        for dirpath, _dirs, files in os.walk(src):
            rel = Path(dirpath).relative_to(src)
            (dest / rel).mkdir(parents=True, exist_ok=True)
            for name in files:
                if name.endswith(".tmp"):
                    continue  # a checkpoint being written by the flush thread right now
                try:
                    shutil.copyfile(Path(dirpath) / name, dest / rel / name)
                except FileNotFoundError:
                    pass  # replaced under us (atomic rename); the other version was copied
    assert (dest / "abort").exists(), "a running store must have its abort marker"
    return dest


def copy_config(store: MessageStore, dest: Path, **overrides) -> StoreConfig:
    kw = {**_config_fields(store.config), **overrides}
    kw.pop("data_dir")
    return make_config(dest, **kw)


# --------------------------------------------------------------------------- on-disk inspection


def segment_paths(data_dir: Path) -> list[Path]:
    d = Path(data_dir) / "commitlog"
    return sorted(p for p in d.iterdir() if p.name.isdigit()) if d.exists() else []


def walk_segment(path: Path) -> tuple[list[tuple[int, int, int]], int]:
    """Records of one segment file: ([(offset_in_file, kind, size)], end_of_valid_data).

    kind 1 = message, 2 = blank filler. Stops at zeros, garbage or a bad CRC.
    """
    data = path.read_bytes()
    out = []
    pos = 0
    while pos < len(data):
        kind, size = record.check(data, pos, len(data))
        if kind == 0:
            break
        out.append((pos, kind, size))
        pos += size
        if kind == 2:
            break
    return out, pos


def flip_bytes(path: Path, offset: int, count: int = 4) -> None:
    """XOR ``count`` bytes at ``offset`` of a file with 0xFF (a bit-rot / torn-write stand-in)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(count)
        f.seek(offset)
        f.write(bytes(x ^ 0xFF for x in b))
        f.flush()
        os.fsync(f.fileno())


def write_at(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def locate(data_dir: Path, seg_size: int, phys: int) -> tuple[Path, int]:
    """(segment file, offset in it) of a commitlog offset."""
    base = phys - phys % seg_size
    return Path(data_dir) / "commitlog" / f"{base:020d}", phys - base


# --------------------------------------------------------------------------- reading


def read_all(store: MessageStore, topic: str, queue_id: int, start: int = 0, flt=None) -> list[StoredMessage]:
    """Every message of a queue from ``start`` via get(), following next_offset."""
    out: list[StoredMessage] = []
    off = start
    for _ in range(100_000):
        r = store.get(topic, queue_id, off, 32, flt)
        if r.status == GetStatus.OFFSET_MOVED:
            off = r.next_offset
            continue
        if r.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
            out.extend(r.messages)
            assert r.next_offset > off, "get must make progress"
            off = r.next_offset
            continue
        return out
    raise AssertionError("read_all did not terminate")


def wait_until(pred, timeout: float = 10.0, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def next_ms(after: int) -> int:
    """Busy-wait (bounded) until the wall clock in ms is past ``after``; return it."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        now = int(time.time() * 1000)
        if now > after:
            return now
        time.sleep(0.001)
    raise AssertionError("wall clock did not advance")


def body_for(i: int, size: int | None = None) -> bytes:
    """A deterministic body, different for every i (and not all zeros)."""
    n = size if size is not None else 20 + (i * 37) % 300
    seed = i.to_bytes(4, "little")
    return (seed * (n // 4 + 1))[:n]


def record_size(topic: str, body: bytes, **kw) -> int:
    """The exact commitlog size of a message (encoding does not depend on offsets)."""
    return len(record.encode(Message(topic, body, **kw), 0, 0, 1))


def assert_same_message(got: StoredMessage, sent: Message, *, message_id: str | None = None) -> None:
    assert got.body == sent.body
    assert got.tag == sent.tag
    assert tuple(got.keys) == tuple(sent.keys)
    assert got.properties == sent.properties
    assert got.message_group == sent.message_group
    assert got.delivery_time_ms == sent.delivery_time_ms
    assert got.born_host == sent.born_host
    assert got.protocol == sent.protocol
    assert got.reconsume_times == sent.reconsume_times
    if sent.born_timestamp_ms:
        assert got.born_timestamp_ms == sent.born_timestamp_ms
    if message_id is not None:
        assert got.message_id == message_id
