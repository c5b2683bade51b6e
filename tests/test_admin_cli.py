"""`unimq admin ...` against a real `unimq up`: every action, its table and --json output, its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import httpx
import paho.mqtt.client as mqtt

from tests.conftest import REPO_ROOT


def admin(srv: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "unimq", "admin", *args, "--endpoint", srv.url().rstrip("/")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


def test_every_admin_action_and_its_exit_codes(unimq_server: Any) -> None:
    srv = unimq_server("--set=broker.max_delivery_attempts=1", "--set=broker.retry_backoff_ms=[100]")
    with httpx.Client(base_url=srv.url(), timeout=20) as h:
        for i in range(4):
            h.post("/v1/topics/payments/messages", params={"keys": f"p-{i}"}, content=b'{"amount": %d}' % i)
        popped = h.post("/v1/topics/payments/groups/ledger/pop", params={"max": 32}).json()["messages"]
        h.post("/v1/topics/payments/groups/ledger/ack", json={"receipt_handles": [m["receipt_handle"] for m in popped]})
        h.post("/v1/topics/jobs/messages", content=b"job")
        h.post("/v1/topics/jobs/groups/workers/pop", params={"invisible_s": 0.2})  # never acked: dead-lettered
    dev = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="meter-1", clean_session=False)
    dev.reconnect_delay_set(min_delay=120, max_delay=120)  # stays away once disconnected below
    dev.connect("127.0.0.1", srv.ports["mqtt"])
    dev.loop_start()
    dev.subscribe("meters/#", 1)
    time.sleep(0.5)

    r = admin(srv, "overview")
    assert r.returncode == 0, r.stderr
    assert "door" in r.stdout and "mqtt" in r.stdout and "store: commitlog" in r.stdout

    r = admin(srv, "topics", "--filter", "pay")
    assert r.returncode == 0 and "payments" in r.stdout and "ledger" in r.stdout and "(1 of 1)" in r.stdout
    r = admin(srv, "topics", "--json")
    assert {t["name"] for t in json.loads(r.stdout)["items"]} >= {"payments", "jobs"}

    r = admin(srv, "groups", "--json")
    assert r.returncode == 0 and {g["group"] for g in json.loads(r.stdout)["items"]} >= {"ledger", "workers"}
    r = admin(srv, "group", "ledger")
    assert r.returncode == 0 and "group ledger: lag 0" in r.stdout
    assert admin(srv, "group", "nobody").returncode == 4

    r = admin(srv, "reset", "ledger", "--topic", "payments", "--offset", "0")
    assert r.returncode == 0 and "queue" in r.stdout
    assert json.loads(admin(srv, "group", "ledger", "--json").stdout)["lag"] == 4
    r = admin(srv, "reset", "ledger", "--topic", "payments", "--time", "2000-01-01T00:00:00Z", "--json")
    assert r.returncode == 0 and all(q["offset"] == 0 for q in json.loads(r.stdout)["queues"])
    assert admin(srv, "reset", "ledger", "--topic", "payments", "--time", "yesterday").returncode == 2
    assert admin(srv, "reset", "ledger", "--topic", "nope", "--offset", "0").returncode == 4
    assert admin(srv, "reset", "ledger", "--topic", "payments").returncode == 2  # argparse: --offset or --time

    deadline = time.monotonic() + 20
    while json.loads(admin(srv, "group", "workers", "--json").stdout)["dlq"] != 1:
        assert time.monotonic() < deadline, "no dead letter"
        time.sleep(0.2)
    r = admin(srv, "resend-dlq", "workers")
    assert r.returncode == 0 and "resent 1 dead letters of workers to jobs" in r.stdout

    r = admin(srv, "clients", "--door", "mqtt")
    assert r.returncode == 0 and "meter-1" in r.stdout
    r = admin(srv, "disconnect", "mqtt", "meter-1")
    assert r.returncode == 0 and "disconnected mqtt meter-1" in r.stdout
    dev.loop_stop()
    assert admin(srv, "disconnect", "mqtt", "meter-1").returncode == 4

    r = admin(srv, "messages", "search", "--topic", "payments", "--key", "p-2")
    assert r.returncode == 0 and "http" in r.stdout
    mid = r.stdout.splitlines()[1].split()[0]
    r = admin(srv, "messages", "show", mid, "--as", "json")
    assert r.returncode == 0 and '"amount": 2' in r.stdout and "protocol: http" in r.stdout
    r = admin(srv, "messages", "show", mid, "--as", "hex")
    assert b'{"amount": 2}'.hex() in r.stdout
    assert admin(srv, "messages", "search", "--topic", "payments", "--key", "none").returncode == 4
    assert admin(srv, "messages", "search").returncode == 2

    r = admin(srv, "brokers")
    assert r.returncode == 0 and "broker-a" in r.stdout and "nameservers:" in r.stdout

    down = subprocess.run([sys.executable, "-m", "unimq", "admin", "overview", "--endpoint", "http://127.0.0.1:1"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "cannot reach" in down.stderr
