"""The Spark source on a COMPACTED topic: ``compacted=all`` reads what compaction kept (offsets
with gaps), ``compacted=latest`` the table (latest value per key, deletes left out); without the
option the gaps are data loss, as for any topic. Against a real `unimq up` with real Spark."""

from __future__ import annotations

import httpx
import pyarrow as pa
import pytest
from compaction_helpers import SMALL, compact_until_once_per_key, create, put, roll

from spark_ingest import wire
from spark_ingest.options import OptionError
from spark_ingest.session import java_available
from spark_ingest.source import DataLossError, UnimqBatchReader, UnimqStreamReader

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def compacted(unimq_server):
    """A server with topic `kv` (3 queues): 60 keys written 3 times, 10 deleted, compacted."""
    server = unimq_server(*SMALL)
    latest: dict[str, bytes] = {}
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        create(c, "kv", queues=3)
        for rnd in range(3):
            for k in range(60):
                latest[f"k{k}"] = f"{rnd}-{k}".encode()
                put(c, "kv", f"k{k}", latest[f"k{k}"])
        for k in range(0, 60, 6):
            put(c, "kv", f"k{k}", b"")
            latest[f"k{k}"] = b""
        roll(c)
        compact_until_once_per_key(c, "kv")
        put(c, "kv", "k1", b"after")  # the live range: the table must prefer it
        latest["k1"] = b"after"
    return server, {k: v for k, v in latest.items() if v}


def _read(opts: dict) -> pa.Table:
    r = UnimqBatchReader(opts)
    batches = [b for p in r.partitions() for b in r.read(p)]
    return pa.Table.from_batches(batches, wire.ARROW_SCHEMA) if batches else wire.ARROW_SCHEMA.empty_table()


def test_reader_options_on_a_compacted_topic(compacted) -> None:
    server, table = compacted
    base = {"endpoint": server.url(), "topics": "kv"}
    with pytest.raises(DataLossError):
        _read(base)  # gaps without the option: loud, as for any topic
    every = _read({**base, "compacted": "all"})
    assert every.num_rows > len(table)  # delete markers, and k1's compacted value before "after"
    got = _read({**base, "compacted": "latest"})
    assert dict(zip([k[0] for k in got.column("keys").to_pylist()], got.column("body").to_pylist())) == table
    assert got.num_rows == len(table)
    with pytest.raises(OptionError):
        UnimqStreamReader({**base, "compacted": "latest"})
    with pytest.raises(OptionError):
        UnimqBatchReader({**base, "compacted": "newest"})


@pytest.mark.skipif(not java_available(), reason="no Java runtime on PATH; Spark cannot start")
def test_spark_reads_the_latest_value_per_key(compacted, spark) -> None:
    server, table = compacted
    df = (spark.read.format("unimq").option("endpoint", server.url()).option("topics", "kv")
          .option("compacted", "latest").load())
    rows = df.selectExpr("keys[0] AS key", "body").collect()
    assert {r["key"]: bytes(r["body"]) for r in rows} == table and len(rows) == len(table)
