"""Spark on a batch topic: the sink writes batches (option batchSize, one record each), the source
reads them back whole into Arrow, every message a row with its own dense offset. Real `unimq up`,
real Spark (skipped without Java); the reader without Spark too."""

from __future__ import annotations

import httpx
import pyarrow as pa
import pytest

from spark_ingest import wire
from spark_ingest.options import SinkOptions
from spark_ingest.session import java_available
from spark_ingest.source import UnimqBatchReader, publish_rows

pytestmark = pytest.mark.timeout(600)


def _read(opts: dict) -> pa.Table:
    r = UnimqBatchReader(opts)
    batches = [b for p in r.partitions() for b in r.read(p)]
    return pa.Table.from_batches(batches, wire.ARROW_SCHEMA) if batches else wire.ARROW_SCHEMA.empty_table()


def _create(server, topic: str) -> None:
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        r = c.post("/v1/topics", json={"name": topic, "queues": 2,
                                       "attributes": {"batch": "true", "batch.compression": "lz4"}})
        assert r.status_code in (200, 201), r.text


def test_sink_batches_and_the_reader_reads_them_whole(unimq_server) -> None:
    server = unimq_server()
    _create(server, "sb")
    rows = [{"body": f"r{i}", "keys": [f"k{i}"], "properties": {"n": str(i)}} for i in range(1000)]
    opts = SinkOptions.parse({"endpoint": server.url(), "topic": "sb", "batchSize": "250"})
    assert publish_rows(opts, iter(rows)) == 1000
    # 1000 rows in 4 requests: each one record on one queue (4 batch-queue entries in all)
    files = [f.read_bytes() for q in (server.data_dir / "batchqueue" / "sb").iterdir() for f in q.iterdir()]
    entries = sum(1 for data in files for i in range(0, len(data), 32) if data[i + 28:i + 32] != b"\0\0\0\0")
    assert entries == 4
    t = _read({"endpoint": server.url(), "topics": "sb"})
    assert sorted(t.column("body").to_pylist()) == sorted(f"r{i}".encode() for i in range(1000))
    for q in (0, 1):
        offs = [o for o, qq in zip(t.column("queue_offset").to_pylist(), t.column("queue_id").to_pylist()) if qq == q]
        assert offs == list(range(len(offs)))
    by_body = {b: (k, p) for b, k, p in zip(t.column("body").to_pylist(), t.column("keys").to_pylist(),
                                           t.column("properties").to_pylist())}
    assert by_body[b"r7"] == (["k7"], [("n", "7")])


@pytest.mark.skipif(not java_available(), reason="no Java runtime on PATH; Spark cannot start")
def test_spark_writes_and_reads_a_batch_topic(unimq_server, spark) -> None:
    server = unimq_server()
    _create(server, "sk")
    df = spark.range(5000).selectExpr("CAST(id AS STRING) AS body")
    df.write.format("unimq").option("endpoint", server.url()).option("topic", "sk").option("batchSize", "500") \
        .mode("append").save()
    back = spark.read.format("unimq").option("endpoint", server.url()).option("topics", "sk").load()
    got = back.select("body", "queue_id", "queue_offset").collect()
    assert sorted(int(bytes(r["body"])) for r in got) == list(range(5000))
    for q in {r["queue_id"] for r in got}:
        offs = sorted(r["queue_offset"] for r in got if r["queue_id"] == q)
        assert offs == list(range(len(offs)))
    # ranges of 1,000 (5 or more) packed into the session's 2 task slots (the default travels to
    # Spark's planner process with the registered class), or into 1 task when the read says so
    ranged = spark.read.format("unimq").option("endpoint", server.url()).option("topics", "sk") \
        .option("maxMessagesPerPartition", "1000")
    for df, tasks in ((ranged.load(), 2), (ranged.option("maxPartitions", "1").load(), 1),
                      (ranged.option("maxPartitions", "0").load(), 6)):
        assert df.rdd.getNumPartitions() == tasks
        rows = df.select("queue_id", "queue_offset").collect()
        assert sorted((r[0], r[1]) for r in rows) == sorted((r["queue_id"], r["queue_offset"]) for r in got)
