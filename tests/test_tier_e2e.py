"""Tiered storage end to end (issue 17): `unimq up` with the tier on, read over HTTP after local retention.

A real `unimq up` process (HTTP door only) with 64 KiB segments, local retention
of about a second and the tier on a real S3-compatible server (moto) on
127.0.0.1: messages are sent over HTTP, their segments uploaded and deleted
locally, then the queue is read from offset 0 over HTTP, as JSON and as the
Spark source's Arrow pages, and must come back byte for byte with their ids;
and by Spark itself (the `unimq` source, a local session), a topic about three
times what the local disk keeps.
"""

from __future__ import annotations

import base64
import os
import signal
from pathlib import Path

import httpx
import pytest

from tier_helpers import S3Server, aws_credentials, s3, tier_up_sets, wait_for  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("aws_credentials")]
N = 400
M = 1200  # ~600 KB: about ten 64 KiB segments


def test_messages_retired_locally_are_read_over_http_from_the_tier(unimq_server, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    srv = unimq_server(*tier_up_sets(s3, bucket))
    first_segment = Path(srv.data_dir) / "commitlog" / f"{0:020d}"
    bodies = [os.urandom(300 + i) for i in range(N)]
    with httpx.Client(base_url=srv.url("http", ""), timeout=30) as c:
        assert c.post("/v1/topics", json={"name": "cold", "queues": 1}).status_code in (200, 201)
        ids = []
        for i, b in enumerate(bodies):
            r = c.post(f"/v1/topics/cold/messages?keys=k{i}", content=b)
            assert r.status_code in (200, 201), r.text
            ids.append(r.json()["message_id"])
        wait_for(lambda: not first_segment.exists(), timeout=60)  # uploaded, then retired locally
        assert c.get("/v1/topics/cold").json()["queues"][0]["min_offset"] == 0

        got, off = [], 0
        while off < N:
            page = c.get("/v1/topics/cold/queues/0/messages", params={"offset": off, "max": 100}).json()
            assert page["messages"], page
            got += page["messages"]
            off = page["next_offset"]
        assert [m["queue_offset"] for m in got] == list(range(N))
        assert [base64.b64decode(m["body_base64"]) for m in got] == bodies
        assert [m["message_id"] for m in got] == ids
        assert [m["keys"] for m in got] == [[f"k{i}"] for i in range(N)]

        pa = pytest.importorskip("pyarrow")
        r = c.get("/v1/topics/cold/queues/0/messages", params={"offset": 0, "max": 100, "format": "arrow"})
        assert r.status_code == 200, r.text
        table = pa.ipc.open_stream(r.content).read_all()
        assert int(r.headers["unimq-next-offset"]) == table.num_rows > 0
        assert table.column("body").to_pylist() == bodies[: table.num_rows]
    assert srv.stop(signal.SIGTERM) == 0, srv.stderr()


@pytest.mark.timeout(600)
def test_spark_reads_a_topic_three_times_the_local_disk_from_the_tier(unimq_server, s3: S3Server, spark) -> None:
    """Issue 17's end to end read: about three times what local retention leaves on disk is sent
    (64 KiB segments, retention of about a second), then Spark's `unimq` source reads the topic
    from offset 0 and every message comes back byte for byte, most of them from the tier."""
    bucket = s3.new_bucket()
    srv = unimq_server(*tier_up_sets(s3, bucket))
    log_dir = Path(srv.data_dir) / "commitlog"
    bodies = [os.urandom(200 + i % 600) for i in range(M)]
    with httpx.Client(base_url=srv.url("http", ""), timeout=30) as c:
        assert c.post("/v1/topics", json={"name": "lake", "queues": 2}).status_code in (200, 201)
        where = {}
        for i, b in enumerate(bodies):
            r = c.post("/v1/topics/lake/messages", content=b)
            assert r.status_code in (200, 201), r.text
            where[(r.json()["queue_id"], r.json()["queue_offset"])] = i
        sent = sum(map(len, bodies))
        wait_for(lambda: not (log_dir / f"{0:020d}").exists(), timeout=60)  # uploaded, retired locally
        # what the local disk still holds of the log: a third of what was sent at most
        wait_for(lambda: sum(f.stat().st_size for f in log_dir.iterdir()) * 3 <= sent, timeout=60)
        assert all(q["min_offset"] == 0 for q in c.get("/v1/topics/lake").json()["queues"])
        rows = (spark.read.format("unimq").option("endpoint", srv.url("http", "")).option("topics", "lake").load()
                .select("queue_id", "queue_offset", "body").collect())
    assert len(rows) == M
    assert sorted(where[(r.queue_id, r.queue_offset)] for r in rows) == list(range(M))
    assert all(bytes(r.body) == bodies[where[(r.queue_id, r.queue_offset)]] for r in rows)
    assert srv.stop(signal.SIGTERM) == 0, srv.stderr()
