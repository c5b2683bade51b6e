"""The Spark stats job's state topic: its aggregates survive a lost checkpoint and a SIGKILL.

Split from tests/test_spark_engine.py (same shared SparkSession, its own `unimq up`) so that
``--dist loadfile`` can run it beside the other Spark files. The kill test runs the job as a
child process (its JVM with it, in its own process group), SIGKILLs the group by PID after the
job's second commit, and restarts it on the same checkpoint here.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_fixtures import http, server  # noqa: F401 (fixtures; `spark` comes from conftest)
from spark_helpers import kill_group

pytestmark = pytest.mark.timeout(900)


def _feed_state_topic(http, lo: int, hi: int, topic: str = "se-state") -> None:
    """Messages ``lo..hi-1`` of ``topic``: nine in ten as CloudEvents, one in ten over HTTP."""
    if lo == 0:
        http.create_topic(topic, 3)
    http.send_events(topic, ({"temp": float(i % 37) / 4, "qty": i % 5} for i in range(lo, hi) if i % 10),
                     start_id=lo)
    for i in range(lo, hi, 10):
        http.send(topic, json.dumps({"temp": i % 41, "other": "x" * (i % 7)}).encode())


def test_stats_job_continues_from_its_state_topic_without_the_checkpoint(spark, server, http, tmp_path):
    """Run the stats job over part of a stream, stop it, wipe its checkpoint, feed more, restart
    it: its aggregates equal one uninterrupted computation over the whole stream."""
    import shutil

    from spark_ingest.jobs import stats
    from spark_ingest.progress import follow

    _feed_state_topic(http, 0, 1500)
    ck = tmp_path / "ck"
    argv = ["--endpoint", server.endpoint, "--topics", "se-state", "--available-now", "--window", "1 hour",
            "--fields", "temp,qty", "--output-topic", "se-state-out", "--checkpoint", str(ck),
            "--max-messages-per-trigger", "600", "--show", "0"]
    args = stats.build_parser().parse_args(argv)
    out = io.StringIO()
    follow(stats.start(spark, args, ["temp", "qty"], out=out), "stats", out=out, poll_s=0.5)
    first = out.getvalue()
    assert ": new" in first and "[stats] batch 2: 300 rows" in first and "[stats] batch 3" not in first, first

    shutil.rmtree(ck)  # the local checkpoint is gone: only the state topic remembers
    _feed_state_topic(http, 1500, 3000)
    out2 = io.StringIO()
    follow(stats.start(spark, stats.build_parser().parse_args(argv), ["temp", "qty"], out=out2), "stats",
           out=out2, poll_s=0.5)
    second = out2.getvalue()
    assert "open windows (commit 3)" in second and "[stats] batch 0: 600 rows" in second, second
    assert "[stats] batch 2: 300 rows" in second and "[stats] batch 3" not in second, second  # only the new 1500

    _assert_stats_equal_one_pass(spark, server, "se-state", stats.state_topic_name(args), "se-state-out", 3000)


def _assert_stats_equal_one_pass(spark, server, topic: str, state_topic: str, output_topic: str, total: int) -> None:
    """The state topic's entries and the last published statistics of each key equal one
    uninterrupted aggregation of the whole topic (Spark's own, in one pass)."""
    from pyspark.sql import functions as F

    from spark_ingest.jobs import stats
    from spark_ingest.state_topic import StateTopic

    whole = spark.read.format("unimq").option("endpoint", server.endpoint).option("topics", topic).load()
    ref = {(r.topic, r.protocol, r.start): r for r in stats.aggregate(whole, ["temp", "qty"], "1 hour", "10 minutes")
           .withColumn("start", F.unix_micros("window.start")).collect()}
    assert sum(r["count"] for r in ref.values()) == total and {k[1] for k in ref} == {"cloudevents", "http"}
    state = StateTopic(server.endpoint, state_topic)
    entries = state.load().entries
    state.close()
    assert len(entries) == len(ref)
    for e in entries.values():
        r = ref[(e["topic"], e["protocol"], e["start_us"])]
        assert (e["count"], e["bytes"]) == (r["count"], r["bytes"])
        for f in ("temp", "qty"):
            got = e["fields"].get(f)
            if r[f"{f}__avg"] is None:
                assert got is None
                continue
            mn, sm, n, mx = got
            assert (mn, mx) == (r[f"{f}__min"], r[f"{f}__max"]) and sm / n == pytest.approx(r[f"{f}__avg"])
    pub = (spark.read.format("unimq").option("endpoint", server.endpoint).option("topics", output_topic).load()
           .selectExpr("keys[0] AS k", "cast(body AS string) AS b").collect())
    final: dict[str, dict] = {}
    for p in pub:  # the last one of a key has the largest count
        doc = json.loads(p.b)
        if p.k not in final or doc["count"] > final[p.k]["count"]:
            final[p.k] = doc
    assert sorted(d["count"] for d in final.values()) == sorted(r["count"] for r in ref.values())
    assert sum(d["bytes"] for d in final.values()) == sum(r["bytes"] for r in ref.values())


@pytest.mark.slow
def test_stats_job_killed_mid_run_counts_every_message_once(spark, server, http, tmp_path):
    """SIGKILL the stats job (a child process, its JVM with it) after its second commit,
    wherever it is (reading, publishing, between a commit's writes), and restart it on the
    same checkpoint (the rest in one batch): Spark replays the killed batch, the state counts
    it once."""
    from spark_ingest.client import GatewayClient
    from spark_ingest.jobs import stats
    from spark_ingest.progress import follow
    from spark_ingest.state_topic import PROGRESS_KEY

    _feed_state_topic(http, 0, 1500, topic="se-kill")
    ck = tmp_path / "ck"
    argv = ["--endpoint", server.endpoint, "--topics", "se-kill", "--window", "1 hour", "--fields", "temp,qty",
            "--output-topic", "se-kill-out", "--checkpoint", str(ck), "--show", "0"]
    state_topic = stats.state_topic_name(stats.build_parser().parse_args(argv))
    log = open(tmp_path / "child.log", "w")
    child = subprocess.Popen([sys.executable, "-m", "spark_ingest.jobs.stats", *argv, "--trigger-seconds", "1",
                              "--max-messages-per-trigger", "300"],
                             cwd=Path(__file__).resolve().parent.parent, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)  # its own process group: the JVM dies with it
    try:
        deadline = time.monotonic() + 600
        with GatewayClient(server.endpoint) as c:
            while True:
                assert child.poll() is None, f"the job died: {(tmp_path / 'child.log').read_text()[-3000:]}"
                assert time.monotonic() < deadline, (tmp_path / "child.log").read_text()[-3000:]
                rows = c.read_table(state_topic) if c.describe(state_topic) is not None else []
                seq = [json.loads(base64.b64decode(r["body_base64"]))["seq"] for r in rows if r["key"] == PROGRESS_KEY]
                if seq and seq[0] >= 2:
                    break
                time.sleep(0.1)
        kill_group(child)  # wherever the job is: reading, publishing, between a commit's writes
    finally:
        kill_group(child)
        log.close()
    out = io.StringIO()
    follow(stats.start(spark, stats.build_parser().parse_args([*argv, "--available-now"]), ["temp", "qty"], out=out),
           "stats", out=out, poll_s=0.5)
    assert "open windows (commit " in out.getvalue(), out.getvalue()
    _assert_stats_equal_one_pass(spark, server, "se-kill", state_topic, "se-kill-out", 1500)


