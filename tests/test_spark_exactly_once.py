"""The `unimq` source's exactly-once kill and restart, in a real Spark.

The first query runs in a child process (this file run as a script) whose reads are slowed;
that process group is killed with SIGKILL by PID while a micro-batch is in flight (its offsets
are in the WAL, its commit is not); the query restarts on the same checkpoint here (the shared
SparkSession of tests/spark_fixtures.py), and ``spark.read.parquet`` must hold every message
exactly once. Split from tests/test_spark_engine.py so that ``--dist loadfile`` can run it on
another worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spark_fixtures import http, server  # noqa: F401 (fixtures; `spark` comes from conftest)
from spark_helpers import kill_group

pytestmark = pytest.mark.timeout(900)


def _child_query(endpoint: str, out: str, checkpoint: str, markers: str) -> None:
    """The query killed mid-batch: reads slowed by 1.5 s per partition (class pickled by value)."""
    from spark_ingest.session import get_spark
    from spark_ingest.source import UnimqDataSource, UnimqStreamReader

    class SlowReader(UnimqStreamReader):
        def read(self, partition):
            Path(markers, f"{partition.topic}-{partition.queue_id}-{partition.start}-{partition.end}").touch()
            time.sleep(1.5)
            yield from super().read(partition)

    class SlowSource(UnimqDataSource):
        def streamReader(self, schema):
            return SlowReader(dict(self.options))

    spark = get_spark("unimq-eo-child", conf={"spark.ui.showConsoleProgress": "false",
                                              "spark.local.dir": str(Path(markers).parent / "spark-local")})
    spark.dataSource.register(SlowSource)  # same name "unimq": the checkpoint sees the same source
    q = (spark.readStream.format("unimq").option("endpoint", endpoint).option("topics", "se-eo")
         .option("maxMessagesPerTrigger", "500").load()
         .writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
         .trigger(processingTime="1 second").start())
    print("child: query started", flush=True)
    q.awaitTermination()


def _in_flight_batch(checkpoint: Path, markers: Path, started: float) -> int | None:
    """A batch id whose offsets are logged, whose commit is not, and whose reads have begun."""
    offs = {int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*")} if (checkpoint / "offsets").exists() else set()
    done = {int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")} if (checkpoint / "commits").exists() else set()
    pending = sorted(offs - done)
    if not pending or not done:  # wait for at least one committed batch first
        return None
    b = pending[-1]
    logged = (checkpoint / "offsets" / str(b)).stat().st_mtime
    if any(m.stat().st_mtime >= logged for m in markers.iterdir()):
        return b
    return None


@pytest.mark.slow
def test_kill_and_restart_is_exactly_once(spark, server, http, tmp_path):
    from spark_ingest.progress import as_dict

    http.create_topic("se-eo", 4)
    http.send_events("se-eo", ({"i": i} for i in range(2000)))
    out, ck, markers = tmp_path / "out", tmp_path / "ck", tmp_path / "markers"
    markers.mkdir()
    stop = threading.Event()
    produced = [2000]

    def producer() -> None:  # more messages arrive while the query runs
        from spark_helpers import Http

        h = Http(server.endpoint)
        try:
            while not stop.is_set() and produced[0] < 4000:
                produced[0] += h.send_events("se-eo", ({"i": i} for i in range(produced[0], produced[0] + 100)))
                stop.wait(0.3)
        finally:
            h.close()

    log = open(tmp_path / "child.log", "w")
    child = subprocess.Popen([sys.executable, __file__, "child", server.endpoint, str(out), str(ck), str(markers)],
                             cwd=Path(__file__).resolve().parent.parent, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)  # its own process group: the JVM dies with it
    feeder = threading.Thread(target=producer, daemon=True)
    feeder.start()
    killed_batch = None
    try:
        deadline = time.monotonic() + 600
        while killed_batch is None:
            assert child.poll() is None, f"the child query died: {(tmp_path / 'child.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no batch in flight: {(tmp_path / 'child.log').read_text()[-3000:]}"
            killed_batch = _in_flight_batch(ck, markers, time.monotonic())
            time.sleep(0.05)
        kill_group(child)  # mid-batch: offsets in the WAL, no commit
    finally:
        kill_group(child)
        log.close()
        stop.set()
        feeder.join(timeout=120)
    assert not (ck / "commits" / str(killed_batch)).exists()
    logged = (ck / "offsets" / str(killed_batch)).read_text().splitlines()[-1]
    total = sum(hi for _, hi in http.describe("se-eo").values())
    assert total == produced[0]

    q = (spark.readStream.format("unimq").option("endpoint", server.endpoint).option("topics", "se-eo").load()
         .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ck))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    assert q.exception() is None
    progress = [as_dict(p) for p in q.recentProgress]
    first = progress[0]
    assert first["batchId"] == killed_batch  # the killed batch is replayed first ...
    end = first["sources"][0]["endOffset"]
    assert (json.loads(end) if isinstance(end, str) else end) == json.loads(logged)  # ... with the same offsets

    df = spark.read.parquet(str(out))
    r = df.selectExpr("count(*) n", "count(DISTINCT queue_id, queue_offset) d",
                      "count(DISTINCT get_json_object(cast(body AS string), '$.i')) i").collect()[0]
    assert (r.n, r.d, r.i) == (total, total, total)
    per_queue = df.groupBy("queue_id").agg({"queue_offset": "max", "*": "count"}).collect()
    bounds = http.describe("se-eo")
    for row in per_queue:
        assert row["count(1)"] == row["max(queue_offset)"] + 1 == bounds[row.queue_id][1]  # contiguous 0..max-1


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "child":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    _child_query(*sys.argv[2:])
