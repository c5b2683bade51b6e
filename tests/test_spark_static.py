"""Spark's `unimq` source over a static topic remapped between two runs of a streaming query
(the lake job, availableNow, one checkpoint), in the separated deployment (a nameserver, two
brokers and a gateway as real processes): the second run reads exactly the messages sent after
the first, across the remap, because a logic queue's offsets keep growing where they were."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from core_broker.model import Message  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from gateway.context import RequestContext  # noqa: E402
from gateway.processor_rpc import RemoteProcessor  # noqa: E402
from spark_ingest.session import java_available  # noqa: E402
from unimq.local_cluster import Cluster  # noqa: E402
from conftest import TEST_STORE_ARGS  # noqa: E402

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not java_available(), reason="no Java runtime on PATH: Spark cannot start"),
]
CTX = RequestContext("test", client_id="spark-static")


def test_lake_job_reads_on_across_a_remap(tmp_path: Any, spark: SparkSession) -> None:
    from spark_ingest.jobs import lake
    from spark_ingest.progress import follow

    cluster = Cluster(tmp_path / "cluster", brokers=2, gateways=1, lease_s=10.0, heartbeat_s=1.0,
                      extra_broker_args=TEST_STORE_ARGS).start()
    try:
        endpoint = f"http://127.0.0.1:{cluster.gateways[0].ports['http']}"
        rp = RemoteProcessor(cluster.gateway_rpc())

        async def send(first: int, n: int) -> list:
            return await rp.send(CTX, [Message("lake-static", f'{{"i": {i}}}'.encode(), keys=(f"k{i % 8}",))
                                       for i in range(first, first + n)])

        async def prepare() -> None:
            await rp.create_topic(CTX, "lake-static", queues=2, attributes={"static": "true"})
            await send(0, 300)

        asyncio.run(prepare())
        path = tmp_path / "lake"
        argv = ["--endpoint", endpoint, "--topics", "lake-static", "--path", str(path), "--available-now"]
        follow(lake.start(spark, lake.build_parser().parse_args(argv)), "lake", out=io.StringIO(), poll_s=0.5)

        async def remap_and_send() -> list:
            rp2 = RemoteProcessor(cluster.gateway_rpc())
            for q in range(2):
                lead = (await rp2.describe_topic(CTX, "lake-static")).config.mapping["queues"][q][-1][0]
                await rp2.remap_queue(CTX, "lake-static", q, "broker-b" if lead == "broker-a" else "broker-a")
            sent = await rp2.send(CTX, [Message("lake-static", f'{{"i": {i}}}'.encode(), keys=(f"k{i % 8}",))
                                        for i in range(300, 500)])
            await rp2.stop()
            return sent

        sent = asyncio.run(remap_and_send())
        assert {r.queue_offset for r in sent} and min(r.queue_offset for r in sent) > 0
        out = io.StringIO()
        follow(lake.start(spark, lake.build_parser().parse_args(argv)), "lake", out=out, poll_s=0.5)
        assert "200 rows" in out.getvalue(), out.getvalue()  # the second run: only what came after
        df = spark.read.parquet(str(path))
        stats = df.selectExpr("count(*) n", "count(DISTINCT queue_id, queue_offset) d",
                              "count(DISTINCT get_json_object(cast(body AS string), '$.i')) i").collect()[0]
        assert (stats.n, stats.d, stats.i) == (500, 500, 500)
        for q in range(2):  # each logic queue's offsets dense across the remap
            offs = sorted(r.queue_offset for r in df.where(f"queue_id = {q}").select("queue_offset").collect())
            assert offs == list(range(len(offs)))
        # a batch read sees the same, with keys in their logic queues
        whole = spark.read.format("unimq").option("endpoint", endpoint).option("topics", "lake-static").load()
        assert whole.count() == 500
        assert whole.selectExpr("count(DISTINCT keys[0], queue_id) kq", "count(DISTINCT keys[0]) k").collect()[0] \
            .asDict() == {"kq": 8, "k": 8}
    finally:
        cluster.stop()
