"""The store section: core_broker.MessageStore put/get throughput in one process.

Every measurement opens a fresh store (default geometry: 1 GiB commitlog
segments, preallocated) in its own directory under the run's data dir and
removes it afterwards. Messages are plain: topic ``bench``, queue 0, no tag,
keys or properties, bodies drawn from 64 distinct random bodies. The Message
objects are built before the clock starts (a producer hands the broker a
decoded message). Write rows time the store call loop **and** the wait until
the flush thread has fdatasync'ed everything written, so, like dd with
conv=fdatasync, they measure data on disk. Each row is repeated and the best
repetition is reported (the spread is listed under the table).
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import time
from pathlib import Path

from core_broker.config import FlushMode, StoreConfig
from core_broker.message_store import MessageStore
from core_broker.model import DispatchTarget, GetStatus, Message, PutStatus

from . import Context, Row

NAME = "store"
TITLE = "core_broker.MessageStore"
TOPIC = "bench"
BATCH = 128
READ_BATCH = 32
SYNC_WRITERS = 64

TIMED = """\
- **store rows**: a fresh `MessageStore` per run (default config: 1 GiB preallocated commitlog
  segments; only the free-space policies are off) in its own directory; plain messages (topic
  `bench`, queue 0, no tag, keys or properties, 64 distinct random bodies). `Message` objects
  are built before the clock starts. Write rows time the call loop *and* the wait until the
  flush thread has fdatasync'ed everything written, so like dd they measure data on disk.
  `put_batch` hands the store 128 messages per call. The group-commit row runs 64 coroutines on
  one event loop, each awaiting `put_async` in a loop for a fixed time; only acknowledged
  (fsync-covered) messages are counted. The sync single-writer row is a blocking `put` loop.
  Reads call `get(topic, 0, offset, 32)` from offset 0 over the messages the batch row before
  wrote (page cache warm), CRC-checking and decoding every message. Records add a header of
  117 B to the body (topic `bench`, protocol `internal`). Door-shaped rows: `put_batch(100)` of 100 B
  CloudEvents with six `ce_*` properties (HTTP door), and the group-commit row with 100 B MQTT QoS 1
  messages carrying four `mqtt_*` properties and one dispatch into a subscription LMQ. Each store row is measured 3 times
  (once with --quick; the sync single-writer row twice) and the best run is reported.
"""

try:  # the broker runs on uvloop when it is installed; so does the group-commit row
    import uvloop

    _loop_factory = uvloop.new_event_loop
    LOOP_NAME = "uvloop"
except ImportError:  # pragma: no cover - uvloop is a dependency
    _loop_factory = asyncio.new_event_loop
    LOOP_NAME = "asyncio"


def _messages(count: int, size: int) -> list[Message]:
    bodies = [os.urandom(size) for _ in range(64)]
    return [Message(TOPIC, bodies[i & 63]) for i in range(count)]


def _ce_messages(count: int) -> list[Message]:
    """HTTP-door-shaped: a 100 B CloudEvent with its six ``ce_*`` properties."""
    bodies = [os.urandom(100) for _ in range(64)]
    return [Message(TOPIC, bodies[i & 63], protocol="http", properties={
        "ce_specversion": "1.0", "ce_type": "com.example.order.created", "ce_source": "/orders/eu-west",
        "ce_id": f"evt-{i:08d}", "ce_time": "2026-11-22T00:10:00Z", "ce_datacontenttype": "application/json"})
        for i in range(count)]


def _mqtt_messages(count: int) -> list[Message]:
    """MQTT-QoS-1-shaped: 100 B, four ``mqtt_*`` properties, one subscription LMQ (of 8) to dispatch into."""
    bodies = [os.urandom(100) for _ in range(64)]
    return [Message(TOPIC, bodies[i & 63], protocol="mqtt", properties={
        "mqtt_topic": f"sensors/room{i & 7}/temp", "mqtt_qos": "1", "mqtt_retain": "0", "mqtt_client": f"client-{i & 15}"},
        extra_dispatch=(DispatchTarget(f"%LMQ%sub{i & 7}", 0),)) for i in range(count)]


class _Store:
    """A fresh store in its own directory, removed on exit."""

    def __init__(self, ctx: Context, name: str, sync: bool) -> None:
        self.ctx, self.name, self.sync = ctx, name, sync

    def __enter__(self) -> MessageStore:
        self.dir = self.ctx.scratch(f"{self.name}-{time.monotonic_ns()}")
        # Default config, except that the free-space policies are off: on a nearly full
        # disk they would refuse puts or drop segments under the readers mid-bench.
        cfg = StoreConfig(data_dir=self.dir, flush=FlushMode.SYNC if self.sync else FlushMode.ASYNC,
                          disk_min_free_ratio=0.0, disk_refuse_free_ratio=0.0)
        self.store = MessageStore(cfg)
        self.store.start()
        return self.store

    def __exit__(self, *exc: object) -> None:
        self.store.shutdown()
        shutil.rmtree(self.dir, ignore_errors=True)
        # Commit the deletion now (untimed): with ext4's online discard the journal commit
        # that frees a gigabyte waits for the discard, and the next row's fsyncs would too.
        os.sync()


def _wait_durable(store: MessageStore) -> None:
    """Block until the flush thread has fdatasync'ed everything written so far."""
    if not store._flush.wait(store.commitlog.write_pos, timeout=120.0):  # type: ignore[union-attr]
        raise RuntimeError("the flush did not complete in 120 s")


class Peer:
    """Formatting of the comparisons with the disk baseline."""

    def __init__(self, ctx: Context) -> None:
        p = ctx.peer
        self.dd = p.dd_mb_s if p else 0.0
        self.fsync = p.fsync_rate if p else 0.0

    def vs_dd(self, mb_s: float) -> tuple[str, str]:
        if not self.dd:
            return "—", "—"
        return f"dd {self.dd:,.0f} MB/s", f"{100 * mb_s / self.dd:.0f}% of dd"

    def vs_fsync(self, msgs_s: float) -> tuple[str, str]:
        if not self.fsync:
            return "—", "—"
        return f"fsync/write {self.fsync:,.0f}/s", f"{msgs_s / self.fsync:.1f}x"


class _Timed:
    """Wall clock and the calling thread's CPU time of one timed loop."""

    def __enter__(self) -> "_Timed":
        gc.collect()
        self.cpu0 = time.thread_time()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        self.cpu = time.thread_time() - self.cpu0


class _Runs:
    """Every repetition's (messages, wall, thread CPU); the row reports the best wall rate."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, float, float]] = []

    def add(self, n: int, t: _Timed) -> None:
        self.runs.append((n, t.wall, t.cpu))

    @property
    def best(self) -> float:
        return max(n / w for n, w, _ in self.runs)

    def note(self, *extra: str, cpu: bool = True) -> str:
        parts = list(extra)
        if len(self.runs) > 1:
            parts.append("runs " + " / ".join(f"{n / w:,.0f}" for n, w, _ in self.runs) + " msgs/s")
        if cpu:
            n, w, c = max(self.runs, key=lambda r: r[0] / r[1])
            if c > 0:
                parts.append(f"calling thread {n / c:,.0f} msgs per CPU-second (CPU {100 * c / w:.0f}% of wall)")
        return "; ".join(parts)


# ---------------------------------------------------------------------------------- timed loops


def _put_loop(store: MessageStore, msgs: list[Message]) -> _Timed:
    put = store.put
    with _Timed() as t:
        for m in msgs:
            put(m)
        _wait_durable(store)
    return t


def _batch_loop(store: MessageStore, batches: list[list[Message]]) -> _Timed:
    put_batch = store.put_batch
    with _Timed() as t:
        for b in batches:
            put_batch(b)
        _wait_durable(store)
    return t


def _get_loop(store: MessageStore, count: int) -> _Timed:
    get = store.get
    off = n = 0
    with _Timed() as t:
        while n < count:
            r = get(TOPIC, 0, off, READ_BATCH)
            if r.status is not GetStatus.FOUND:
                raise RuntimeError(f"read back {n} of {count} messages ({r.status})")
            n += len(r.messages)
            off = r.next_offset
    return t


def _sync_single_loop(store: MessageStore, msgs: list[Message], seconds: float) -> tuple[int, _Timed]:
    put = store.put
    n, k = 0, len(msgs)
    now = time.perf_counter
    with _Timed() as t:
        deadline = now() + seconds
        while now() < deadline:
            if put(msgs[n % k]).status is not PutStatus.PUT_OK:
                raise RuntimeError("a sync put timed out")
            n += 1
    return n, t


async def _sync_writers(store: MessageStore, msgs: list[Message], seconds: float, writers: int) -> tuple[int, _Timed]:
    """``writers`` coroutines, each awaiting put_async in a loop until the time is up."""
    running = [True]
    counts = [0] * writers
    k = len(msgs)

    async def writer(i: int) -> None:
        put = store.put_async
        n, j = 0, i
        while running[0]:
            await put(msgs[j % k])
            n += 1
            j += writers
        counts[i] = n

    loop = asyncio.get_running_loop()
    with _Timed() as t:
        loop.call_later(seconds, running.__setitem__, 0, False)
        await asyncio.gather(*(writer(i) for i in range(writers)))
    return sum(counts), t


# ---------------------------------------------------------------------------------- rows


def run(ctx: Context) -> list[Row]:
    quick = ctx.quick
    reps = 1 if quick else 3
    n_single = 150_000 if quick else 400_000
    n_single_1k = 100_000 if quick else 300_000
    n_batch = 300_000 if quick else 1_000_000
    n_batch_1k = 200_000 if quick else 1_000_000  # about as many bytes as dd writes
    n_read = 100_000 if quick else 300_000
    sync_seconds = 1.5 if quick else 4.0
    sync1_seconds = 1.0 if quick else 2.0

    # The fsync-bound rows first, right after the fsync peer and before dd or any bulk
    # write: the disk's fsync latency stays high for seconds after gigabytes are written.
    ctx.fsync_peer()
    sync_rows = _sync_rows(ctx, reps, sync_seconds, sync1_seconds)
    ctx.dd_peer()
    peer = Peer(ctx)
    rows: list[Row] = []

    def size_label(size: int) -> str:
        return "100 B" if size == 100 else "1 KiB"

    # -- single puts, async flush --
    for size, n in ((100, n_single), (1024, n_single_1k)):
        msgs = _messages(n, size)
        runs = _Runs()
        for _ in range(reps):
            with _Store(ctx, f"put-{size}", sync=False) as store:
                runs.add(n, _put_loop(store, msgs))
                per_record = store.commitlog.write_pos / n
        rate = runs.best
        mb = rate * size / 1e6
        p, r = peer.vs_dd(mb)
        floor, meets = ("≥ 200,000 msgs/s", rate >= 200_000) if size == 100 else ("—", None)
        rows.append(Row(NAME, f"put, async flush, {size_label(size)}, 1 thread", rate, mb, p, r, floor, meets,
                        note=runs.note(f"{per_record:.0f} B per record on disk")))
        del msgs

    # -- batch puts, async flush; then reads of what the last repetition wrote --
    for size, n in ((100, n_batch), (1024, n_batch_1k)):
        msgs = _messages(n, size)
        batches = [msgs[i : i + BATCH] for i in range(0, n, BATCH)]
        runs, reads = _Runs(), _Runs()
        cnt = min(n_read, n)
        for rep in range(reps):
            with _Store(ctx, f"batch-{size}", sync=False) as store:
                runs.add(n, _batch_loop(store, batches))
                if rep == reps - 1:
                    for _ in range(reps):
                        reads.add(cnt, _get_loop(store, cnt))
        rate = runs.best
        mb = rate * size / 1e6
        p, r = peer.vs_dd(mb)
        if size == 1024:
            floor, meets = "≥ 50% of dd", bool(peer.dd) and mb >= 0.5 * peer.dd
        else:
            floor, meets = "—", None
        rows.append(Row(NAME, f"put_batch({BATCH}), async flush, {size_label(size)}", rate, mb, p, r, floor, meets,
                        note=runs.note()))
        rr = reads.best
        rows.append(Row(NAME, f"get({READ_BATCH}) from one queue, {size_label(size)}", rr, rr * size / 1e6,
                        note=reads.note()))
        del msgs, batches

    # -- door-shaped batches: CloudEvents with six properties, 100 per put_batch --
    msgs = _ce_messages(n_batch // 2)
    batches = [msgs[i : i + 100] for i in range(0, len(msgs), 100)]
    runs = _Runs()
    for _ in range(reps):
        with _Store(ctx, "batch-ce", sync=False) as store:
            runs.add(len(msgs), _batch_loop(store, batches))
    rate = runs.best
    rows.append(Row(NAME, "put_batch(100), async flush, 100 B + 6 properties", rate, rate * 100 / 1e6,
                    note=runs.note()))
    del msgs, batches
    return rows + sync_rows


def _flush_note(store: MessageStore, acked: int) -> str:
    """Messages per fdatasync and the store's mean fdatasync time, from the flush service's counters."""
    fs = store._flush
    rounds = sum(getattr(fs, "sync_counts", ()) or ())
    if not rounds:
        return ""
    note = f"{acked / rounds:.0f} messages per fdatasync, {1e6 * fs.sync_seconds / rounds:,.0f} µs per fdatasync"
    warm = getattr(fs, "warm_syncs", 0)
    if warm:  # the warm-up's own pieces (zeros ahead of the writer), between group-commit rounds
        note += f" (+ {warm} warm-up pieces of 1 MiB, {1e3 * fs.warm_seconds / warm:,.1f} ms each)"
    return note


def _sync_rows(ctx: Context, reps: int, seconds: float, seconds_1: float) -> list[Row]:
    peer = Peer(ctx)
    msgs = _messages(4096, 100)
    rows = []

    # -- sync flush: group commit under 64 concurrent asyncio writers --
    runs = _Runs()
    flush_note = ""
    for _ in range(reps):
        with _Store(ctx, "sync-64", sync=True) as store:
            with asyncio.Runner(loop_factory=_loop_factory) as runner:
                n, t = runner.run(_sync_writers(store, msgs, seconds, SYNC_WRITERS))
            runs.add(n, t)
            if n / t.wall >= runs.best:
                flush_note = _flush_note(store, n)
    rate = runs.best
    p, r = peer.vs_fsync(rate)
    rows.append(Row(NAME, f"put_async, sync flush (group commit), 100 B, {SYNC_WRITERS} writers on {LOOP_NAME}",
                    rate, rate * 100 / 1e6, p, r, "≥ 10x fsync/write", bool(peer.fsync) and rate >= 10 * peer.fsync,
                    note=runs.note(*([f"best run: {flush_note}"] if flush_note else []))))

    # -- the same, MQTT-QoS-1-shaped: properties and one LMQ dispatch per message --
    door = _mqtt_messages(4096)
    runs = _Runs()
    for _ in range(reps):
        with _Store(ctx, "sync-64-lmq", sync=True) as store:
            with asyncio.Runner(loop_factory=_loop_factory) as runner:
                n, t = runner.run(_sync_writers(store, door, seconds, SYNC_WRITERS))
            runs.add(n, t)
    rate = runs.best
    rows.append(Row(NAME, f"put_async, sync flush, 100 B + 4 properties + 1 LMQ dispatch, {SYNC_WRITERS} writers",
                    rate, rate * 100 / 1e6, note=runs.note()))

    # -- sync flush, one blocking writer --
    runs = _Runs()
    for _ in range(max(1, reps - 1)):
        with _Store(ctx, "sync-1", sync=True) as store:
            runs.add(*_sync_single_loop(store, msgs, seconds_1))
    rate = runs.best
    p, r = peer.vs_fsync(rate)
    rows.append(Row(NAME, "put, sync flush, 100 B, 1 thread", rate, rate * 100 / 1e6, p, r, note=runs.note(cpu=False)))
    return rows
