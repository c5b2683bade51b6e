"""Spark section: rows/s of the `unimq` source beside spark.read.json / spark.read.parquet of the same data.

What is timed: one SparkSession (``local[2]``, the same for all three), each
read is ``<read>.write.format("noop").mode("overwrite").save()`` (every row
and column materialised, nothing written), wall clock around that call,
2 untimed warm-up reads per path, then 5 rounds (1 and 1 with --quick) in
alternating order with a JVM GC before each read; each path's rate is at the
median of its own rounds (``bench/spark_rounds.py``), with CPU per process
group (JVM, Python workers, unimq server) in the notes. The unimq rows include the whole path: the
HTTP door pulling by offset (Arrow pages built from raw commitlog records),
the transfer, and Spark's Python data source workers.

The data: N small JSON messages (``{"id":…,"device":…,"temp":…,"ok":…}``,
about 60 B) loaded into topic ``spark-bench`` (4 queues) through the HTTP door
as CloudEvents batches (not timed). The files are written *from that topic*
by Spark before timing: NDJSON with the same 16 columns (body as text,
timestamps as text; read with an explicit schema, the faster way to use
spark.read.json) and snappy Parquet, so all three read the same rows.
Floor (issue 9): unimq >= 0.8x spark.read.json.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import Context, Row
from .spark_rounds import timed_reads

NAME = "spark"
TITLE = "Spark: the unimq source vs spark.read.json / parquet"
TOPIC = "spark-bench"
QUEUES = 4
FLOOR = 0.8
ROUNDS = 5  # timed reads per path (median) after WARMUP untimed ones, same rule for all: bench/spark_rounds.py
WARMUP = 2

# Segments sized for the run and the disk guards off: on a nearly full shared disk, retention
# would otherwise delete the data set in the middle of the measurement.
STORE_TOML = """[store]
commitlog_segment_size = 268435456
disk_refuse_free_ratio = 0.0
disk_min_free_ratio = 0.0
"""

JSON_SCHEMA = (
    "topic STRING, queue_id INT, queue_offset BIGINT, message_id STRING, keys ARRAY<STRING>, tag STRING, "
    "message_group STRING, body STRING, properties MAP<STRING, STRING>, protocol STRING, "
    "born_timestamp TIMESTAMP, store_timestamp TIMESTAMP, mqtt_topic STRING, ce_type STRING, "
    "ce_source STRING, ce_subject STRING"
)


def _start_unimq(scratch: Path) -> tuple[subprocess.Popen, int]:
    cfg = scratch / "unimq.toml"
    cfg.write_text(STORE_TOML)
    cmd = [sys.executable, "-m", "unimq", "up", "--config", str(cfg), "--data-dir", str(scratch / "data"),
           "--host", "127.0.0.1", "--log-level", "warning"]
    for flag in ("--mqtt-port", "--amqp-port", "--http-port", "--grpc-port", "--namesrv-port"):
        cmd += [flag, "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    port = None
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.match(r"unimq: http listening on .*:(\d+)$", line.strip())
        if m:
            port = int(m.group(1))
        if line.strip() == "unimq: ready":
            break
    if port is None:
        proc.kill()
        raise RuntimeError("unimq did not start")
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    return proc, port


def _load(port: int, n: int, threads: int = 3, batch: int = 1000) -> float:
    """N CloudEvents (batch mode) into TOPIC; returns seconds taken."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", "/v1/topics", json.dumps({"name": TOPIC, "queues": QUEUES}),
                 {"content-type": "application/json"})
    conn.getresponse().read()
    conn.close()
    chunks = list(range(0, n, batch))
    lock = threading.Lock()
    errors: list[str] = []

    def work() -> None:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        while True:
            with lock:
                if not chunks or errors:
                    break
                s = chunks.pop()
            evs = [{"specversion": "1.0", "id": str(i), "source": "/bench", "type": "reading",
                    "datacontenttype": "application/json",
                    "data": {"id": i, "device": f"dev-{i % 100}", "temp": round(15 + (i % 200) / 10, 1),
                             "ok": i % 7 != 0}} for i in range(s, min(n, s + batch))]
            c.request("POST", f"/v1/topics/{TOPIC}/events", json.dumps(evs),
                      {"content-type": "application/cloudevents-batch+json"})
            r = c.getresponse()
            body = r.read()
            if r.status != 200:
                with lock:
                    errors.append(body[:200].decode(errors="replace"))
        c.close()

    t = time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    if errors:
        raise RuntimeError(f"loading failed: {errors[0]}")
    return time.perf_counter() - t


def run(ctx: Context) -> list[Row]:
    from spark_ingest.session import get_spark, java_available

    if not java_available():
        return [Row(NAME, "unimq source (skipped: no Java runtime)", note="install openjdk-17-jre-headless")]
    n = 100_000 if ctx.quick else 1_000_000
    rounds, warmup = (1, 1) if ctx.quick else (ROUNDS, WARMUP)
    scratch = ctx.scratch("spark")
    proc, port = _start_unimq(scratch)
    spark = None
    try:
        load_s = _load(port, n)
        endpoint = f"http://127.0.0.1:{port}"
        spark = get_spark("unimq-bench", conf={"spark.driver.memory": "2g", "spark.ui.showConsoleProgress": "false"})
        src = spark.read.format("unimq").option("endpoint", endpoint).option("topics", TOPIC)
        t = time.perf_counter()
        df = src.load()
        (df.selectExpr(*[c if c != "body" else "cast(body AS string) AS body" for c in df.columns])
         .write.mode("overwrite").json(str(scratch / "json")))
        spark.read.schema(JSON_SCHEMA).json(str(scratch / "json")).write.mode("overwrite").parquet(
            str(scratch / "parquet"))
        prep_s = time.perf_counter() - t
        json_mb = sum(f.stat().st_size for f in (scratch / "json").glob("*.json")) / 1e6
        pq_mb = sum(f.stat().st_size for f in (scratch / "parquet").glob("*.parquet")) / 1e6

        paths = {
            "unimq": lambda: src.load(),
            "json": lambda: spark.read.schema(JSON_SCHEMA).json(str(scratch / "json")),
            "parquet": lambda: spark.read.parquet(str(scratch / "parquet")),
        }
        counts = {k: f().count() for k, f in paths.items()}  # workers started, files cached
        if len(set(counts.values())) != 1 or counts["unimq"] != n:
            raise RuntimeError(f"row counts differ: {counts} (expected {n})")
        res = timed_reads(spark, paths, n, rounds, warmup, proc.pid)
    finally:
        if spark is not None:
            spark.stop()
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.times.items()}
    rate = {k: res.rate(k) for k in med}
    ratio = rate["unimq"] / rate["json"]
    runs = {k: f"{res.runs(k)}; CPU per read (median): {res.cpu_note(k)}" for k in med}
    ctx.notes.append(
        f"spark: {n:,} messages loaded in {load_s:.0f} s (CloudEvents batches, not timed); files written from "
        f"the topic in {prep_s:.0f} s: NDJSON {json_mb:,.0f} MB, Parquet {pq_mb:,.0f} MB; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} after the run"
    )
    return [
        Row(NAME, f"unimq source, {n:,} JSON messages, {QUEUES} queues (rows/s)", rate["unimq"], None,
            peer=f"spark.read.json {rate['json']:,.0f} rows/s", ratio=f"{ratio:.2f}x",
            floor=f">= {FLOOR}x spark.read.json", meets=ratio >= FLOOR, note=f"runs {runs['unimq']} (round by round {res.round_ratios('unimq', 'json')} of json)"),
        Row(NAME, "spark.read.json of the same rows, explicit schema (peer)", rate["json"], json_mb / med["json"],
            note=f"runs {runs['json']}"),
        Row(NAME, "spark.read.parquet of the same rows (info)", rate["parquet"], pq_mb / med["parquet"],
            ratio=f"unimq {rate['unimq'] / rate['parquet']:.2f}x", note=f"runs {runs['parquet']}"),
    ]


def main() -> int:  # python -m bench.spark_bench [--quick]
    import tempfile

    quick = "--quick" in sys.argv
    with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent.parent / ".bench-tmp"
                                     if (Path(__file__).resolve().parent.parent / ".bench-tmp").exists()
                                     else None) as d:
        ctx = Context(Path(d), quick)
        for r in run(ctx):
            print(f"{r.name}: {r.msgs_s or 0:,.0f} rows/s  {r.peer}  {r.ratio}  {r.floor}  "
                  f"{'' if r.meets is None else ('meets' if r.meets else 'BELOW FLOOR')}  {r.note}")
        for note in ctx.notes:
            print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
