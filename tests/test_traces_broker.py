"""Message traces of what the broker does by itself, against a real `unimq up` over HTTP: a
popped message never acked comes back when its invisible time runs out (``retried``, recorded
by the broker with the attempt that expired) and after ``max_delivery_attempts`` goes to the
group's dead-letter topic (``dead_lettered``, naming it); a message of an untraced topic put
through the same gets no trace at all.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from polling import wait_for


def test_expired_pops_are_retried_then_dead_lettered_in_the_trace(unimq_server: Any) -> None:
    srv = unimq_server("--set=broker.max_delivery_attempts=3", "--set=broker.retry_backoff_ms=[100]")
    with httpx.Client(base_url=srv.url(), timeout=20) as h:
        assert h.post("/v1/topics", json={"name": "jobs", "queues": 1,
                                          "attributes": {"trace_enabled": "true"}}).status_code == 201
        assert h.post("/v1/topics", json={"name": "chores", "queues": 1}).status_code == 201
        mid = h.post("/v1/topics/jobs/messages", content=b"job").json()["message_id"]
        quiet = h.post("/v1/topics/chores/messages", content=b"chore").json()["message_id"]

        # popped and never acked, with a short invisible time: three deliveries of each
        attempts: dict[str, list[int]] = {mid: [], quiet: []}
        deadline = time.monotonic() + 60
        while min(len(a) for a in attempts.values()) < 3:
            assert time.monotonic() < deadline, f"deliveries so far: {attempts}"
            for topic in ("jobs", "chores"):
                got = h.post(f"/v1/topics/{topic}/groups/workers/pop",
                             params={"max": 1, "invisible_s": 0.3, "wait_s": 1}).json()["messages"]
                for m in got:
                    attempts[m["message_id"]].append(m["delivery_attempt"])
        assert attempts == {mid: [1, 2, 3], quiet: [1, 2, 3]}

        def dead_lettered() -> list[dict[str, Any]] | None:
            t = h.get(f"/v1/messages/{mid}/trace").json()
            return t if "dead_lettered" in [e["event"] for e in t.get("events", [])] else None

        t = wait_for(dead_lettered, what="the dead_lettered event")
        ev = t["events"]
        assert [e["event"] for e in ev] == ["stored", "delivered", "retried", "delivered", "retried", "delivered",
                                            "dead_lettered"]
        assert [e["attempt"] for e in ev if e["event"] == "delivered"] == [1, 2, 3]
        retried = [e for e in ev if e["event"] == "retried"]
        assert [e["attempt"] for e in retried] == [1, 2]
        assert all(e["door"] == "broker" and e["reason"] == "invisible time expired" and e["group"] == "workers"
                   and e["broker"] and e["topic"] == "jobs" for e in retried)
        dl = ev[-1]
        assert dl["door"] == "broker" and dl["dlq"] == "%DLQ%workers" and dl["attempts"] == 3
        assert t["doors"] == ["http"]  # the broker is not a door
        # both messages really are in the group's dead-letter topic; the untraced one has no trace
        wait_for(lambda: h.get("/v1/admin/groups/workers").json().get("dlq") == 2, what="two dead letters")
        r = h.get(f"/v1/messages/{quiet}/trace")
        assert r.status_code == 404 and r.json()["error"] == "NOT_TRACED"
