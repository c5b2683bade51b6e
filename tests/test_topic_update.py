"""Changing a topic's attributes after creation (issue 17): ``PATCH /v1/topics/{t}`` and
``unimq topic update``, against real `unimq up` processes, a real separated deployment and
the tier on a real S3-compatible server (moto) on 127.0.0.1.

The change merges (a null value removes an attribute), is checked as at creation (400),
is durable (``topics.json``, a restart), reaches every broker holding the topic, and the
tier's expiry uses the new ``tier_retention_hours``.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from conftest import REPO_ROOT, TEST_STORE_ARGS, _unimq_command
from tier_helpers import S3Server, aws_credentials, s3, tier_up_sets, wait_for  # noqa: F401 (fixtures)
from unimq.local_cluster import Cluster

HTTP_ONLY = '--set=doors=["http"]'


def _topics_json(data_dir: Path) -> dict:
    return json.loads((Path(data_dir) / "config" / "topics.json").read_text())


def _cli(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*_unimq_command(), "topic", *args, "--endpoint", url], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(180)
def test_patch_merges_validates_persists_and_the_cli_updates(unimq_server) -> None:
    srv = unimq_server(HTTP_ONLY)
    with httpx.Client(base_url=srv.url("http", ""), timeout=30) as c:
        r = c.post("/v1/topics", json={"name": "audit", "queues": 2,
                                       "attributes": {"tier_retention_hours": "8760", "team": "ops"}})
        assert r.status_code == 201, r.text
        assert r.json()["attributes"] == {"tier_retention_hours": "8760", "team": "ops"}
        r = c.patch("/v1/topics/audit", json={"attributes": {"tier_retention_hours": "48", "team": None, "tier": "x"}})
        assert r.status_code == 200, r.text
        assert r.json()["attributes"] == {"tier_retention_hours": "48", "tier": "x"}
        assert len(r.json()["queues"]) == 2 and r.json()["type"] == "NORMAL"
        assert c.get("/v1/topics/audit").json()["attributes"] == {"tier_retention_hours": "48", "tier": "x"}
        for bad in ("-1", "forever", "nan", "inf"):
            r = c.patch("/v1/topics/audit", json={"attributes": {"tier_retention_hours": bad}})
            assert r.status_code == 400, (bad, r.text)
            assert {"error", "message"} <= set(r.json()) and r.headers["content-type"].startswith("application/")
        for body in ({"attributes": {"tier_retention_hours": 5}}, {"queues": 3}, {}, [1]):
            assert c.patch("/v1/topics/audit", json=body).status_code == 400, body  # not the contract's shape
        assert c.patch("/v1/topics/nowhere", json={"attributes": {"a": "1"}}).status_code == 404
        assert c.get("/v1/topics/audit").json()["attributes"] == {"tier_retention_hours": "48", "tier": "x"}
        assert "attributes" not in c.post("/v1/topics", json={"name": "plain"}).json()  # none: none shown

        out = _cli(srv.url("http", ""), "update", "audit", "--attr", "tier_retention_hours=24", "--attr", "tier=")
        assert out.returncode == 0, out.stderr
        assert "tier_retention_hours=24" in out.stdout
        out = _cli(srv.url("http", ""), "update", "audit", "--attr", "tier_retention_hours=-3")
        assert out.returncode == 1 and "tier_retention_hours" in out.stderr
        out = _cli(srv.url("http", ""), "describe", "audit", "--json")
        assert json.loads(out.stdout)["attributes"] == {"tier_retention_hours": "24"}
    assert _topics_json(srv.data_dir)["audit"]["attributes"] == {"tier_retention_hours": "24"}
    assert srv.stop(signal.SIGTERM) == 0, srv.stderr()

    again = unimq_server(HTTP_ONLY, data_dir=srv.data_dir)
    with httpx.Client(base_url=again.url("http", ""), timeout=30) as c:
        assert c.get("/v1/topics/audit").json()["attributes"] == {"tier_retention_hours": "24"}


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("aws_credentials")
def test_the_tier_expires_by_the_updated_retention_after_a_restart(unimq_server, s3: S3Server) -> None:
    """Kept for a year at creation, the topic's segments stay in the tier; its retention cut to
    seconds over HTTP, the tier's expiry deletes them, and a restart still has the new value. (The first segment
    also holds what the server wrote at its start, kept for ever by the global setting.)"""
    bucket = s3.new_bucket()
    args = [*tier_up_sets(s3, bucket), "--set=store.tier_expiry_interval_s=0.2", "--set=store.tier_retention_hours=0"]
    srv = unimq_server(*args)
    second_segment = Path(srv.data_dir) / "commitlog" / f"{65536:020d}"

    def later_segments() -> set[str]:
        return {k.rsplit("/", 1)[1] for k in s3.keys(bucket) if "/segment/" in k and not k.endswith(f"/{0:020d}")}

    with httpx.Client(base_url=srv.url("http", ""), timeout=30) as c:
        r = c.post("/v1/topics", json={"name": "cold", "queues": 1, "attributes": {"tier_retention_hours": "8760"}})
        assert r.status_code == 201, r.text
        for i in range(400):
            assert c.post("/v1/topics/cold/messages", content=b"x" * 400).status_code in (200, 201)
        wait_for(lambda: not second_segment.exists(), timeout=60)  # uploaded, then retired locally
        kept = later_segments()  # kept for a year so far
        assert f"{65536:020d}" in kept
        r = c.patch("/v1/topics/cold", json={"attributes": {"tier_retention_hours": "0.0005"}})  # 1.8 s
        assert r.status_code == 200 and r.json()["attributes"] == {"tier_retention_hours": "0.0005"}, r.text
    assert srv.stop(signal.SIGTERM) == 0, srv.stderr()

    again = unimq_server(*args, data_dir=srv.data_dir)
    with httpx.Client(base_url=again.url("http", ""), timeout=30) as c:
        assert c.get("/v1/topics/cold").json()["attributes"] == {"tier_retention_hours": "0.0005"}
    wait_for(lambda: not (later_segments() & kept), timeout=60)


@pytest.mark.timeout(240)
def test_every_broker_of_a_separated_deployment_takes_the_change(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, brokers=2, gateways=1, lease_s=4.0, heartbeat_s=1.0,
                      extra_broker_args=TEST_STORE_ARGS).start()
    try:
        url = f"http://127.0.0.1:{cluster.gateways[0].ports['http']}"
        with httpx.Client(base_url=url, timeout=30) as c:
            r = c.post("/v1/topics", json={"name": "spread", "queues": 4, "attributes": {"keep": "1"}})
            assert r.status_code == 201, r.text
            hosts = {n for n in cluster.brokers if "spread" in _topics_json(tmp_path / n)}
            assert hosts == {"broker-a", "broker-b"}
            r = c.patch("/v1/topics/spread", json={"attributes": {"tier_retention_hours": "72"}})
            assert r.status_code == 200, r.text
            both = {"keep": "1", "tier_retention_hours": "72"}  # merged into what the brokers hold
            assert r.json()["attributes"] == both and len(r.json()["queues"]) == 4
            assert c.patch("/v1/topics/spread", json={"attributes": {"tier_retention_hours": "-1"}}).status_code == 400
            assert c.get("/v1/topics/spread").json()["attributes"] == both
        for n in sorted(hosts):
            tc = _topics_json(tmp_path / n)["spread"]
            assert tc["attributes"] == both, (n, tc)
        out = _cli(url, "update", "spread", "--attr", "tier_retention_hours=96", "--attr", "keep=")
        assert out.returncode == 0, out.stderr
        assert {n: _topics_json(tmp_path / n)["spread"]["attributes"] for n in hosts} == {
            n: {"tier_retention_hours": "96"} for n in hosts}
    finally:
        cluster.stop()
