"""Push subscriptions: a real webhook server on 127.0.0.1 receives CloudEvents from `unimq up`.

Binary and structured delivery, filters, retries after 500s, the dead-letter
topic after the maximum attempts, and subscriptions that survive a restart.
No timing assertions: the tests wait (bounded) for outcomes, never measure them.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from cloudevents.core.bindings import http as ce_http
from prometheus_client.parser import text_string_to_metric_families

from http_helpers import CE_JSON, Webhook, start_server, until

pytestmark = pytest.mark.timeout(150)


async def _push_stats(c: httpx.AsyncClient, sid: str) -> dict[str, float]:
    text = (await c.get("/metrics")).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "unimq_push_deliveries":
            for s in fam.samples:
                if s.labels.get("subscription") == sid:
                    out[s.labels["outcome"]] = s.value
    return out


async def _ce(c: httpx.AsyncClient, topic: str, eid: str, etype: str, subject: str | None = None, data: bytes = b"{}"):
    headers = {"ce-specversion": "1.0", "ce-id": eid, "ce-source": "/test", "ce-type": etype,
               "content-type": "application/json"}
    if subject:
        headers["ce-subject"] = subject
    r = await c.post(f"/v1/topics/{topic}/events", headers=headers, content=data)
    assert r.status_code == 200, r.text


async def test_binary_push_with_filters_and_retries(unimq_server, tmp_path: Path) -> None:
    server = start_server(unimq_server, tmp_path)
    async with Webhook(fail_first=2) as hook, httpx.AsyncClient(base_url=server.url("http", ""), timeout=30) as c:
        await c.post("/v1/topics", json={"name": "orders", "queues": 2})
        r = await c.post("/v1/subscriptions", json={
            "topic": "orders", "sink": hook.url, "initial_backoff_ms": 50, "max_attempts": 5,
            "filters": [{"prefix": {"type": "com.example."}}, {"not": {"exact": {"subject": "skip"}}}],
        })
        assert r.status_code == 201, r.text
        sub = r.json()
        sid = sub["id"]
        assert sub["group"] == f"push-{sid}" and sub["mode"] == "binary"
        await _ce(c, "orders", "e-other", "org.other.thing")
        await _ce(c, "orders", "e-skip", "com.example.order", subject="skip")
        await _ce(c, "orders", "e-1", "com.example.order", subject="eu", data=b'{"n": 1}')
        await until(lambda: 200 in hook.answers, 60, "a successful delivery")
        stats = await until(lambda: _stats_done(c, sid), 30, "the filtered events to be acked")
        assert stats.get("delivered") == 1 and stats.get("failed_attempt") == 2 and stats.get("filtered") == 2
        assert hook.answers == [500, 500, 200]
        for headers, body in hook.requests:  # the same event each time, a valid binary-mode CloudEvent
            ev = ce_http.from_binary_event(ce_http.HTTPMessage(headers, body))
            assert (ev.get_id(), ev.get_type(), ev.get_subject()) == ("e-1", "com.example.order", "eu")
            assert ev.get_data() == {"n": 1} and headers["content-type"] == "application/json"
        # everything was acked: the group has no backlog
        text = (await c.get("/metrics")).text
        lag = [s for f in text_string_to_metric_families(text) if f.name == "unimq_consumer_lag_messages"
               for s in f.samples if s.labels["group"] == sub["group"]]
        assert lag and all(s.value == 0 for s in lag)


async def _stats_done(c: httpx.AsyncClient, sid: str) -> dict[str, float] | None:
    s = await _push_stats(c, sid)
    return s if s.get("filtered") == 2 and s.get("delivered") == 1 else None


async def test_dead_letter_after_max_attempts_and_structured_mode(unimq_server, tmp_path: Path) -> None:
    server = start_server(unimq_server, tmp_path)
    async with Webhook(always_fail=True) as bad, Webhook() as good, \
            httpx.AsyncClient(base_url=server.url("http", ""), timeout=30) as c:
        r = await c.post("/v1/subscriptions", json={
            "topic": "payments", "sink": bad.url, "group": "hooks", "max_attempts": 3, "initial_backoff_ms": 20,
            "max_backoff_ms": 100,
        })
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        r = await c.post("/v1/subscriptions", json={"topic": "payments", "sink": good.url, "mode": "structured"})
        assert r.status_code == 201, r.text
        await _ce(c, "payments", "p-1", "com.example.payment", data=b'{"amount": 5}')
        # a plain (non-CloudEvents) message on the same topic is delivered as a CloudEvent too
        r = await c.post("/v1/topics/payments/messages", params={"tag": "refund"}, content=b"plain body",
                         headers={"content-type": "text/plain"})
        assert r.status_code == 200
        plain_id = r.json()["message_id"]

        await until(lambda: len(good.requests) >= 2, 60, "two structured deliveries")
        events = {}
        for headers, body in good.requests:
            assert headers["content-type"] == CE_JSON
            ev = ce_http.from_structured_event(ce_http.HTTPMessage(headers, body))
            events[ev.get_id()] = ev
        assert events["p-1"].get_data() == {"amount": 5}
        assert events[plain_id].get_type() == "io.unimq.http.message" and events[plain_id].get_subject() == "refund"
        assert events[plain_id].get_data() == "plain body"

        s = await until(lambda: _dead(c, sid), 60, "both messages dead-lettered")
        assert s["failed_attempt"] == 6 and len(bad.requests) == 6
        # the group's dead-letter topic holds them, consumable like any topic
        r = await c.post("/v1/topics/%25DLQ%25hooks/groups/inspect/pop", params={"max": 10})
        assert r.status_code == 200, r.text
        dead = r.json()["messages"]
        assert len(dead) == 2 and plain_id in {m["message_id"] for m in dead}
        assert {m["properties"].get("ce_id") for m in dead} == {"p-1", None}


async def _dead(c: httpx.AsyncClient, sid: str) -> dict[str, float] | None:
    s = await _push_stats(c, sid)
    return s if s.get("dead_lettered") == 2 else None


async def test_subscriptions_crud_validation_and_restart(unimq_server, tmp_path: Path) -> None:
    server = start_server(unimq_server, tmp_path)
    data_dir = server.data_dir
    async with httpx.AsyncClient(base_url=server.url("http", ""), timeout=30) as c:
        for bad in (
            {"topic": "t"},
            {"topic": "t", "sink": "ftp://127.0.0.1/x"},
            {"topic": "t", "sink": "http://10.9.8.7/hook"},  # not in http_push_allowed_hosts: never contacted
            {"topic": "t", "sink": "http://127.0.0.1:1/x", "filters": [{"sql": "type = 'x'"}]},
            {"topic": "t", "sink": "http://127.0.0.1:1/x", "filters": [{"exact": "type"}]},
            {"topic": "t", "sink": "http://127.0.0.1:1/x", "filters": [{"exact": {"a": 1}, "prefix": {"a": "b"}}]},
            {"topic": "t", "sink": "http://127.0.0.1:1/x", "mode": "carrier-pigeon"},
            {"topic": "t", "sink": "http://127.0.0.1:1/x", "max_attempts": 0},
            {"topic": "t", "sink": "http://127.0.0.1:1/x", "group": "%DLQ%x"},
            {"topic": "t", "sink": "http://127.0.0.1:1/x", "initial_backoff_ms": 500, "max_backoff_ms": 10},
            {"topic": "t", "sink": "http://127.0.0.1:1/x", "surprise": True},
        ):
            r = await c.post("/v1/subscriptions", json=bad)
            assert r.status_code == 400, (bad, r.text)
            assert set(r.json()) >= {"error", "message"}
        assert (await c.get("/v1/subscriptions")).json() == []
        r = await c.get("/v1/subscriptions/nope")
        assert r.status_code == 404 and r.json()["error"] == "SUBSCRIPTION_NOT_FOUND"

    async with Webhook() as hook:
        async with httpx.AsyncClient(base_url=server.url("http", ""), timeout=30) as c:
            r = await c.post("/v1/subscriptions", json={"topic": "durable", "sink": hook.url,
                                                        "filters": [{"suffix": {"type": ".keep"}}]})
            sub = r.json()
            gone = (await c.post("/v1/subscriptions", json={"topic": "durable", "sink": hook.url})).json()
            assert r.status_code == 201 and (await c.get(f"/v1/subscriptions/{sub['id']}")).json() == sub
            assert (await c.delete(f"/v1/subscriptions/{gone['id']}")).status_code == 204
            assert (await c.delete(f"/v1/subscriptions/{gone['id']}")).status_code == 404
            assert [s["id"] for s in (await c.get("/v1/subscriptions")).json()] == [sub["id"]]
        assert server.stop() == 0, server.stderr()

        again = start_server(unimq_server, tmp_path, data_dir=data_dir)
        async with httpx.AsyncClient(base_url=again.url("http", ""), timeout=30) as c:
            assert (await c.get("/v1/subscriptions")).json() == [sub]
            await _ce(c, "durable", "d-1", "com.example.keep", data=json.dumps({"after": "restart"}).encode())
            await until(lambda: hook.requests, 60, "delivery after the restart")
            headers, body = hook.requests[0]
            ev = ce_http.from_binary_event(ce_http.HTTPMessage(headers, body))
            assert ev.get_id() == "d-1" and ev.get_data() == {"after": "restart"}
            assert len(hook.requests) == 1  # the deleted subscription delivers nothing
