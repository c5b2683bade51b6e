"""The tier's upload backlog on `/metrics` (issue 17), against a real `unimq up` and a real object store.

Why through the process: the figures travel from the uploader through the
broker's ``store_stats`` and the gateway to the HTTP door's collector, and an
operator reads them with a Prometheus scraper; prometheus-client's own text
parser checks the exposition. The object store (moto or ``rclone serve s3`` on
127.0.0.1) is down while messages arrive: the backlog and the failed attempts
grow; once it is back the backlog drains and the uploaded count rises.
"""

from __future__ import annotations

import os
import signal

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tier_helpers import S3Server, aws_credentials, s3, wait_for  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("aws_credentials")]


def tier_metrics(c: httpx.Client) -> dict[str, float]:
    r = c.get("/metrics")
    assert r.status_code == 200
    out = {}
    for fam in text_string_to_metric_families(r.text):
        if fam.name.startswith("unimq_tier_"):
            for smp in fam.samples:
                out[smp.name] = smp.value
    return out


def test_the_upload_backlog_is_a_prometheus_metric(unimq_server, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    sets = {
        "doors": '["http"]',
        "store.commitlog_segment_size": 65536,
        "store.tier_enabled": "true",
        "store.tier_bucket": bucket,
        "store.tier_endpoint": s3.endpoint,
        "store.tier_region": "us-east-1",
        "store.tier_scan_interval_s": 0.1,
        "store.tier_retry_max_s": 0.3,
    }
    s3.stop()
    try:
        srv = unimq_server(*[f"--set={k}={v}" for k, v in sets.items()])
        with httpx.Client(base_url=srv.url("http", ""), timeout=30) as c:
            assert c.post("/v1/topics", json={"name": "m", "queues": 1}).status_code in (200, 201)
            for _ in range(300):
                assert c.post("/v1/topics/m/messages", content=os.urandom(1000)).status_code in (200, 201)
            wait_for(lambda: tier_metrics(c).get("unimq_tier_upload_failures_total", 0) >= 1)
            m = tier_metrics(c)
            assert m["unimq_tier_backlog_segments"] >= 3
            assert m["unimq_tier_backlog_bytes"] == m["unimq_tier_backlog_segments"] * 65536
            assert m["unimq_tier_uploaded_segments"] == 0
            waiting = m["unimq_tier_backlog_segments"]

            s3.restart()
            wait_for(lambda: tier_metrics(c)["unimq_tier_backlog_segments"] == 0, timeout=60)
            m = tier_metrics(c)
            assert m["unimq_tier_backlog_bytes"] == 0
            assert m["unimq_tier_uploaded_segments"] >= waiting
        assert srv.stop(signal.SIGTERM) == 0, srv.stderr()
    finally:
        if not s3.running:
            s3.restart()


def test_no_tier_families_without_the_tier(unimq_server) -> None:
    srv = unimq_server('--set=doors=["http"]')
    with httpx.Client(base_url=srv.url("http", ""), timeout=30) as c:
        assert tier_metrics(c) == {}
