"""/metrics (parsed with prometheus-client's own parser) and the `unimq topic` CLI against `unimq up`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO_ROOT, _unimq_command
from http_helpers import start_server

pytestmark = pytest.mark.timeout(120)


def _samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        out.setdefault(fam.name, []).extend(fam.samples)
    return out


def _value(samples: list, name: str, **labels: str) -> float | None:
    for s in samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


async def test_metrics(unimq_server, tmp_path: Path) -> None:
    server = start_server(unimq_server, tmp_path, "--flush", "sync")
    async with httpx.AsyncClient(base_url=server.url("http", "")) as c:
        await c.post("/v1/topics", json={"name": "m", "queues": 1})
        for i in range(3):
            r = await c.post("/v1/topics/m/events", headers={"ce-specversion": "1.0", "ce-id": str(i), "ce-source": "/s",
                                                             "ce-type": "t"}, content=b"x" * 100)
            assert r.status_code == 200
        await c.post("/v1/topics/m/messages", content=b"plain")
        popped = (await c.post("/v1/topics/m/groups/readers/pop", params={"max": 2})).json()["messages"]
        assert len(popped) == 2
        await c.get("/v1/topics/m/queues/0/messages", params={"max": 1})

        r = await c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        s = _samples(r.text)
        assert _value(s["unimq_messages_in"], "unimq_messages_in_total", protocol="cloudevents", topic="m") == 3
        assert _value(s["unimq_messages_in"], "unimq_messages_in_total", protocol="http", topic="m") == 1
        assert _value(s["unimq_messages_out"], "unimq_messages_out_total", protocol="http", topic="m") == 3
        # two popped, none acked: the group's backlog is all four
        assert _value(s["unimq_consumer_lag_messages"], "unimq_consumer_lag_messages", group="readers", topic="m") == 4
        assert _value(s["unimq_store_commitlog_bytes"], "unimq_store_commitlog_bytes") > 400
        count = _value(s["unimq_store_flush_seconds"], "unimq_store_flush_seconds_count")
        assert count is not None and count >= 1  # sync flush: every ack waited for an fdatasync
        assert _value(s["unimq_store_flush_seconds"], "unimq_store_flush_seconds_bucket", le="+Inf") == count

        await c.post("/v1/topics/m/groups/readers/ack", json={"receipt_handles": [m["receipt_handle"] for m in popped]})
        s = _samples((await c.get("/metrics")).text)
        assert _value(s["unimq_consumer_lag_messages"], "unimq_consumer_lag_messages", group="readers", topic="m") == 2
        assert _value(s["unimq_acks"], "unimq_acks_total", protocol="http") == 2


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_unimq_command(), "topic", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60)


def test_topic_cli(unimq_server, tmp_path: Path) -> None:
    server = start_server(unimq_server, tmp_path)
    ep = ["--endpoint", server.url("http", "")]
    r = _cli("create", "orders", "--queues", "2", "--type", "fifo", *ep)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("created: orders  type=FIFO  queues=2")
    r = _cli(*ep, "create", "orders", "--queues", "2", "--type", "FIFO")
    assert r.returncode == 0 and r.stdout.startswith("exists: ")
    r = _cli("create", "orders", "--type", "DELAY", *ep)
    assert r.returncode == 1 and "TOPIC_EXISTS" in r.stderr
    r = _cli("create", "events", *ep)
    assert r.returncode == 0
    r = _cli("list", *ep)
    assert r.returncode == 0
    lines = sorted(r.stdout.splitlines())
    assert lines == ["events\tNORMAL\tqueues=8\tmessages=0", "orders\tFIFO\tqueues=2\tmessages=0"]
    httpx.post(server.url("http", "/v1/topics/events/messages"), content=b"x")
    r = _cli("describe", "events", "--json", *ep)
    assert r.returncode == 0
    d = json.loads(r.stdout)
    assert d["name"] == "events" and d["type"] == "NORMAL" and sum(q["max_offset"] for q in d["queues"]) == 1
    r = _cli("delete", "orders", *ep)
    assert r.returncode == 0 and r.stdout.strip() == "deleted: orders"
    r = _cli("describe", "orders", *ep)
    assert r.returncode == 1 and "TOPIC_NOT_FOUND" in r.stderr
    r = _cli("create", "bad", "--type", "PRIORITY", *ep)
    assert r.returncode == 2
    server.stop()
    r = _cli("list", *ep)
    assert r.returncode == 1 and "cannot reach" in r.stderr


def test_topic_cli_default_endpoint_in_help() -> None:
    r = _cli("--help")
    assert r.returncode == 0 and "http://127.0.0.1:8080" in r.stdout
    for action in ("create", "list", "describe", "delete"):
        assert action in r.stdout
