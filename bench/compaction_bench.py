"""Compacted topics (issue 18): the cleaner's throughput and the time to read a 100,000-key table.

Rows:

- compaction throughput: a fresh ``MessageStore`` (16 MiB segments, async flush), one queue of
  a COMPACTED topic holding 4 values of each of K keys (100 B bodies, written with
  ``put_batch``), sealed by writing another topic past a segment and flushed; then one timed
  ``Compactor.compact_now`` (every pass it takes: the default 1,000,000-entry key map holds
  every key, so one pass). MB/s counts the bytes of the records compacted as input (header +
  key + body; a pass parses every header and copies only the latest record of each key, as
  Kafka's cleaner counts the log it cleaned), msgs/s the input messages.
- table read: `unimq up` as a child (8 MiB segments), a COMPACTED topic of 4 queues filled
  through the HTTP door with CloudEvents batches of 1,000 (``http_index_event_ids`` on, so an
  event's id is its key), 2 values of each of 100,000 keys, then ``GET /v1/topics/{t}/table``
  paged by 4,096 rows until the cursor ends, timed with httpx on one connection: once before
  any compaction (every row found in the commitlog through the live key map) and once after a
  forced compaction (rows from the compacted logs).
"""

from __future__ import annotations

import json
import time

from . import Context, Row

NAME = "compaction"
TITLE = "Compacted topics (cleaner throughput, table reads)"
BODY = 100
VALUES = 4


def _compaction_row(ctx: Context, keys: int) -> Row:
    from core_broker.config import StoreConfig
    from core_broker.message_store import MessageStore
    from core_broker.model import Message, MessageType
    from core_broker.topic_config import TopicConfig

    cfg = StoreConfig(data_dir=ctx.scratch("compaction-store"), commitlog_segment_size=16 << 20,
                      compaction_check_interval_s=3600.0, retention_check_interval_s=3600.0,
                      disk_min_free_ratio=0.0, disk_refuse_free_ratio=0.0, flush_interval_ms=50)
    store = MessageStore(cfg)
    store.start()
    try:
        store.topics.create(TopicConfig("kv", queues=1, message_type=MessageType.COMPACTED))
        for v in range(VALUES):
            body = bytes([65 + v]) * BODY
            batch = [Message("kv", body, keys=(f"key-{k:08d}",), queue_id=0) for k in range(keys)]
            for i in range(0, keys, 1000):
                store.put_batch(batch[i : i + 1000])
        seg = store.commitlog.files.files[-1].base
        while store.commitlog.files.files[-1].base == seg:
            store.put_batch([Message("filler", b"f" * 4000, queue_id=0)] * 64)
        deadline = time.monotonic() + 60
        while store._flush.flushed < store.commitlog.files.files[-1].base:  # flushed: cleanable
            if time.monotonic() > deadline:
                raise RuntimeError("the flush thread did not catch up")
            time.sleep(0.01)
        cq = store._cqs[("kv", 0)]
        n = cq.max_offset
        nbytes = sum(size for _, size, _ in cq.get(0, n))
        t0 = time.perf_counter()
        done = store.compaction.compact_now("kv")
        dt = time.perf_counter() - t0
        kept = store.compaction.gens[("kv", 0)].count
    finally:
        store.shutdown()
    assert kept == keys, (kept, keys)
    return Row(NAME, f"compaction, {n:,} messages of {keys:,} keys ({nbytes / 1e6:.0f} MB of records), "
                     f"{done['passes']} pass(es), {kept:,} kept", n / dt, nbytes / dt / 1e6,
               note="MB/s of input: the bytes of the records compacted (a pass reads every header and copies "
                    "the latest record of each key)")


def _table_rows(ctx: Context, keys: int) -> list[Row]:
    import httpx

    from .procs import UnimqChild

    config = ("http_index_event_ids = true\nmqtt_ws_port = -1\n[store]\ncommitlog_segment_size = 8388608\n"
              "compaction_check_interval_s = 3600.0\ndisk_min_free_ratio = 0.0\ndisk_refuse_free_ratio = 0.0\n")
    child = UnimqChild(ctx.scratch("compaction-table"), "http", config=config)
    rows: list[Row] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{child.port}", timeout=600) as c:
            r = c.post("/v1/topics", json={"name": "table", "queues": 4, "type": "COMPACTED"})
            assert r.status_code == 201, r.text
            for v in range(2):
                for i in range(0, keys, 1000):
                    events = [{"specversion": "1.0", "id": f"key-{k:08d}", "source": "/bench", "type": "t",
                               "data": {"v": v, "pad": "x" * 64}} for k in range(i, min(i + 1000, keys))]
                    r = c.post("/v1/topics/table/events", content=json.dumps(events),
                               headers={"content-type": "application/cloudevents-batch+json"})
                    assert r.status_code == 200, r.text
            for _ in range(8 * 1024 // 64 + 8):  # 8 MiB more: the events' segments are sealed
                c.post("/v1/topics/filler/messages", content=b"f" * 65536)
            for label in ("before compaction (live key map)", "after compaction (compacted logs)"):
                if label.startswith("after"):
                    time.sleep(1.0)  # flushed (500 ms interval)
                    r = c.post("/v1/topics/table/compact")
                    assert r.status_code == 200, r.text
                t0 = time.perf_counter()
                got, cursor = 0, None
                while True:
                    r = c.get("/v1/topics/table/table", params={"max": 4096, **({"cursor": cursor} if cursor else {})})
                    assert r.status_code == 200, r.text
                    page = r.json()
                    got += len(page["rows"])
                    cursor = page["cursor"]
                    if cursor is None:
                        break
                dt = time.perf_counter() - t0
                assert got == keys, (got, keys)
                rows.append(Row(NAME, f"table read over HTTP, {keys:,} keys, pages of 4,096, {label}: {dt:.2f} s",
                                keys / dt, None, note="msgs/s: rows per second"))
    finally:
        child.stop()
    return rows


def run(ctx: Context) -> list[Row]:
    keys = 25_000 if ctx.quick else 100_000
    return [_compaction_row(ctx, keys), *_table_rows(ctx, keys)]
