"""The HTTP door's /v1 API against a real `unimq up`, with httpx and curl as clients.

Topic admin, plain messages, pull by offset, pop / ack / change-invisible with
long polling, the exact JSON shapes other clients (the Spark reader) rely on,
and bad input: every mistake is a 4xx ``{"error", "message"}`` and the server
keeps serving.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from http_helpers import CE_BATCH, CE_JSON, start_server

pytestmark = pytest.mark.timeout(120)

MESSAGE_KEYS = {
    "message_id", "topic", "queue_id", "queue_offset", "tag", "keys", "message_group", "properties", "protocol",
    "born_timestamp", "store_timestamp", "delivery_attempt", "body_base64",
}
SEND_KEYS = {"message_id", "topic", "queue_id", "queue_offset"}


def _is_error(resp: httpx.Response, status: int, code: str | None = None) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert {"error", "message"} <= set(body), body
    assert isinstance(body["error"], str) and isinstance(body["message"], str) and body["message"]
    if code is not None:
        assert body["error"] == code, body
    return body


async def test_topic_admin(unimq_server, tmp_path: Path) -> None:
    server = start_server(unimq_server, tmp_path)
    async with httpx.AsyncClient(base_url=server.url("http", "")) as c:
        r = await c.post("/v1/topics", json={"name": "orders", "queues": 4, "type": "FIFO"})
        assert r.status_code == 201, r.text
        assert r.json() == {
            "name": "orders",
            "type": "FIFO",
            "queues": [{"queue_id": q, "min_offset": 0, "max_offset": 0} for q in range(4)],
        }
        r = await c.post("/v1/topics", json={"name": "orders", "queues": 4, "type": "FIFO"})
        assert r.status_code == 200 and r.json()["type"] == "FIFO"
        _is_error(await c.post("/v1/topics", json={"name": "orders", "type": "DELAY"}), 409, "TOPIC_EXISTS")
        r = await c.post("/v1/topics", json={"name": "plain"})
        assert r.status_code == 201 and r.json()["type"] == "NORMAL" and len(r.json()["queues"]) == 8

        listed = (await c.get("/v1/topics")).json()
        assert {t["name"] for t in listed} >= {"orders", "plain"}
        assert all(set(t) == {"name", "type", "queues"} for t in listed)
        assert not any(t["name"].startswith("%") for t in listed)

        r = await c.get("/v1/topics/orders")
        assert r.status_code == 200 and r.json()["name"] == "orders"

        for bad in ({"queues": 2}, {"name": ""}, {"name": "x", "queues": 0}, {"name": "x", "queues": 5000},
                    {"name": "x", "type": "PRIORITY"}, {"name": "%sys"}, {"name": "a\u0001b"}):
            _is_error(await c.post("/v1/topics", json=bad), 400)
        _is_error(await c.post("/v1/topics", content=b"{not json", headers={"content-type": "application/json"}), 400)

        r = await c.delete("/v1/topics/plain")
        assert r.status_code == 204
        _is_error(await c.get("/v1/topics/plain"), 404, "TOPIC_NOT_FOUND")
        _is_error(await c.delete("/v1/topics/plain"), 404, "TOPIC_NOT_FOUND")


async def test_plain_messages_and_pull_by_offset(unimq_server, tmp_path: Path) -> None:
    server = start_server(unimq_server, tmp_path)
    async with httpx.AsyncClient(base_url=server.url("http", "")) as c:
        assert (await c.post("/v1/topics", json={"name": "t", "queues": 1})).status_code == 201
        sent = []
        for i in range(5):
            r = await c.post(
                "/v1/topics/t/messages",
                params={"tag": "TagA", "keys": "k1,k2", "prop.color": "red"},
                headers={"unimq-prop-Size": str(i), "content-type": "application/octet-stream"},
                content=bytes([i, 0, 255]),
            )
            assert r.status_code == 200, r.text
            assert set(r.json()) == SEND_KEYS
            sent.append(r.json())
        assert [s["queue_offset"] for s in sent] == [0, 1, 2, 3, 4]
        r = await c.post("/v1/topics/t/messages", headers={"unimq-tag": "TagB", "unimq-keys": "x",
                                                           "unimq-message-group": "g1"}, content=b"hdr")
        assert r.status_code == 200

        r = await c.get("/v1/topics/t/queues/0/messages", params={"offset": 0, "max": 3})
        page = r.json()
        assert set(page) == {"messages", "next_offset", "min_offset", "max_offset"}
        assert (page["next_offset"], page["min_offset"], page["max_offset"]) == (3, 0, 6)
        m = page["messages"][0]
        assert set(m) == MESSAGE_KEYS, m
        assert m["message_id"] == sent[0]["message_id"]
        assert (m["topic"], m["queue_id"], m["queue_offset"]) == ("t", 0, 0)
        assert m["tag"] == "TagA" and m["keys"] == ["k1", "k2"] and m["message_group"] is None
        assert m["properties"] == {"color": "red", "size": "0", "content_type": "application/octet-stream"}
        assert m["protocol"] == "http" and m["delivery_attempt"] == 1
        assert isinstance(m["born_timestamp"], int) and m["store_timestamp"] >= m["born_timestamp"] > 0
        assert base64.b64decode(m["body_base64"]) == bytes([0, 0, 255])

        page = (await c.get("/v1/topics/t/queues/0/messages", params={"offset": 3, "max": 100})).json()
        assert [x["queue_offset"] for x in page["messages"]] == [3, 4, 5] and page["next_offset"] == 6
        last = page["messages"][-1]
        assert (last["tag"], last["keys"], last["message_group"]) == ("TagB", ["x"], "g1")
        page = (await c.get("/v1/topics/t/queues/0/messages", params={"offset": 6})).json()
        assert page["messages"] == [] and page["next_offset"] == 6

        # a tag filter on the server
        page = (await c.get("/v1/topics/t/queues/0/messages", params={"offset": 0, "tag": "TagB"})).json()
        assert [x["tag"] for x in page["messages"]] == ["TagB"]

        # pull as CloudEvents
        r = await c.get("/v1/topics/t/queues/0/messages", params={"offset": 0, "max": 2}, headers={"accept": CE_BATCH})
        assert r.headers["content-type"].startswith(CE_BATCH)
        events = r.json()
        assert len(events) == 2 and events[0]["specversion"] == "1.0" and events[0]["id"] == sent[0]["message_id"]

        # a delay message is not visible before its time
        r = await c.post("/v1/topics/t/messages", params={"delay_ms": 60_000}, content=b"later")
        assert r.status_code == 200
        page = (await c.get("/v1/topics/t/queues/0/messages", params={"offset": 6})).json()
        assert page["messages"] == []

        _is_error(await c.get("/v1/topics/nope/queues/0/messages"), 404, "TOPIC_NOT_FOUND")
        _is_error(await c.get("/v1/topics/t/queues/7/messages"), 400)
        _is_error(await c.get("/v1/topics/t/queues/0/messages", params={"offset": -1}), 400)
        _is_error(await c.get("/v1/topics/t/queues/0/messages", params={"sql": "a = = 1"}), 400)


async def test_pop_ack_invisible_and_long_polling(unimq_server, tmp_path: Path) -> None:
    server = start_server(unimq_server, tmp_path)
    async with httpx.AsyncClient(base_url=server.url("http", ""), timeout=30) as c:
        assert (await c.post("/v1/topics", json={"name": "jobs", "queues": 2})).status_code == 201
        r = await c.post("/v1/topics/jobs/groups/workers/pop", params={"max": 10})
        assert r.status_code == 200 and r.json() == {"messages": []}

        # a long poll parked before the message exists gets it when it arrives
        poll = asyncio.create_task(c.post("/v1/topics/jobs/groups/workers/pop", params={"max": 10, "wait_s": 20}))
        await asyncio.sleep(0.3)
        assert not poll.done()
        sent = (await c.post("/v1/topics/jobs/messages", content=b"job-1")).json()
        r = await asyncio.wait_for(poll, 25)
        msgs = r.json()["messages"]
        assert len(msgs) == 1
        m = msgs[0]
        assert set(m) == MESSAGE_KEYS | {"receipt_handle"}
        assert m["message_id"] == sent["message_id"] and m["delivery_attempt"] == 1
        assert base64.b64decode(m["body_base64"]) == b"job-1"

        # hidden from the group while invisible; another group sees it
        assert (await c.post("/v1/topics/jobs/groups/workers/pop")).json() == {"messages": []}
        other = (await c.post("/v1/topics/jobs/groups/auditors/pop")).json()["messages"]
        assert [x["message_id"] for x in other] == [sent["message_id"]]

        # release it at once (invisible 0): it comes back with its attempt counted
        r = await c.post("/v1/topics/jobs/groups/workers/invisible",
                         json={"receipt_handle": m["receipt_handle"], "invisible_s": 0})
        assert r.status_code == 200 and set(r.json()) == {"receipt_handle"}
        assert r.json()["receipt_handle"] != m["receipt_handle"]
        again = (await c.post("/v1/topics/jobs/groups/workers/pop", params={"wait_s": 10})).json()["messages"]
        assert len(again) == 1 and again[0]["message_id"] == m["message_id"] and again[0]["delivery_attempt"] == 2

        # the old handle is dead; the new one acks
        _is_error(await c.post("/v1/topics/jobs/groups/workers/ack", json={"receipt_handles": [m["receipt_handle"]]}),
                  400, "INVALID_RECEIPT_HANDLE")
        r = await c.post("/v1/topics/jobs/groups/workers/ack", json={"receipt_handles": [again[0]["receipt_handle"]]})
        assert r.status_code == 200 and r.json() == {"acked": 1}
        _is_error(await c.post("/v1/topics/jobs/groups/workers/ack",
                               json={"receipt_handles": [again[0]["receipt_handle"]]}), 400, "INVALID_RECEIPT_HANDLE")
        assert (await c.post("/v1/topics/jobs/groups/workers/pop")).json() == {"messages": []}

        # many at once, acked in one call
        for i in range(7):
            await c.post("/v1/topics/jobs/messages", content=f"m{i}".encode())
        got = (await c.post("/v1/topics/jobs/groups/workers/pop", params={"max": 32, "invisible_s": 60})).json()
        handles = [x["receipt_handle"] for x in got["messages"]]
        assert len(handles) == 7
        r = await c.post("/v1/topics/jobs/groups/workers/ack", json={"receipt_handles": handles})
        assert r.json() == {"acked": 7}

        # pop as CloudEvents: each carries its receipt handle as an extension
        await c.post("/v1/topics/jobs/messages", content=b"ce")
        r = await c.post("/v1/topics/jobs/groups/workers/pop", headers={"accept": CE_BATCH})
        events = r.json()
        assert len(events) == 1 and events[0]["specversion"] == "1.0" and events[0]["deliveryattempt"] == "1"
        r = await c.post("/v1/topics/jobs/groups/workers/ack", json={"receipt_handles": [events[0]["receipthandle"]]})
        assert r.json() == {"acked": 1}

        # bad receipt handles and parameters
        _is_error(await c.post("/v1/topics/jobs/groups/workers/ack", json={"receipt_handles": ["garbage"]}), 400,
                  "INVALID_RECEIPT_HANDLE")
        _is_error(await c.post("/v1/topics/jobs/groups/workers/invisible",
                               json={"receipt_handle": "1.x.y.0.0.1.1", "invisible_s": 5}), 400)
        _is_error(await c.post("/v1/topics/jobs/groups/workers/ack", json={"receipt_handles": []}), 400)
        _is_error(await c.post("/v1/topics/jobs/groups/workers/ack", content=b"[", headers={"content-type": JSONCT}),
                  400)
        _is_error(await c.post("/v1/topics/jobs/groups/workers/pop", params={"max": 0}), 400)
        _is_error(await c.post("/v1/topics/jobs/groups/workers/pop", params={"wait_s": 99}), 400)
        _is_error(await c.post("/v1/topics/jobs/groups/%25DLQ/pop"), 400)
        _is_error(await c.post("/v1/topics/jobs/groups/a%01b/pop"), 400)
        _is_error(await c.post("/v1/topics/nope/groups/workers/pop"), 404, "TOPIC_NOT_FOUND")
        assert (await c.get("/healthz")).json() == {"status": "ok"}


JSONCT = "application/json"


async def test_bad_input_is_4xx_and_the_server_keeps_serving(unimq_server, tmp_path: Path) -> None:
    server = start_server(unimq_server, tmp_path)
    ok_headers = {"ce-id": "1", "ce-source": "/s", "ce-type": "t", "ce-specversion": "1.0"}
    async with httpx.AsyncClient(base_url=server.url("http", "")) as c:
        ev = "/v1/topics/bad/events"
        b = _is_error(await c.post(ev, content=b"{nope", headers={"content-type": CE_JSON}), 400, "INVALID_CLOUDEVENT")
        assert "invalid JSON" in b["message"]
        b = _is_error(await c.post(ev, json={"specversion": "1.0", "id": "1", "type": "t"},
                                   headers={"content-type": CE_JSON}), 400, "INVALID_CLOUDEVENT")
        assert "source" in b["message"]
        b = _is_error(await c.post(ev, content=json.dumps({"specversion": "0.3", "id": "1", "source": "/s", "type": "t"}),
                                   headers={"content-type": CE_JSON}), 400, "INVALID_CLOUDEVENT")
        assert "specversion" in b["message"]
        _is_error(await c.post(ev, content=b'{"specversion":"1.0","id":"","source":"/s","type":"t"}',
                               headers={"content-type": CE_JSON}), 400, "INVALID_CLOUDEVENT")
        _is_error(await c.post(ev, content=b'{"specversion":"1.0","id":"1","source":"/s","type":"t","time":"yesterday"}',
                               headers={"content-type": CE_JSON}), 400, "INVALID_CLOUDEVENT")
        _is_error(await c.post(ev, content=b'{"specversion":"1.0","id":"1","source":"/s","type":"t","Bad_Ext":1}',
                               headers={"content-type": CE_JSON}), 400, "INVALID_CLOUDEVENT")
        _is_error(await c.post(ev, content=b'{"specversion":"1.0","id":"1","source":"/s","type":"t","data_base64":"!!"}',
                               headers={"content-type": CE_JSON}), 400, "INVALID_CLOUDEVENT")
        _is_error(await c.post(ev, content=b'[{"specversion":"1.0","id":"1","source":"/s","type":"t"}, 5]',
                               headers={"content-type": CE_BATCH}), 400, "INVALID_CLOUDEVENT")
        _is_error(await c.post(ev, content=b'{"a":1}', headers={"content-type": CE_BATCH}), 400, "INVALID_CLOUDEVENT")
        _is_error(await c.post(ev, content=b"\xff\xfe", headers={"content-type": CE_JSON}), 400, "INVALID_CLOUDEVENT")
        # binary mode: a required header missing, a wrong specversion, a bad time
        h = dict(ok_headers)
        del h["ce-type"]
        b = _is_error(await c.post(ev, content=b"x", headers=h), 400, "INVALID_CLOUDEVENT")
        assert "type" in b["message"]
        _is_error(await c.post(ev, content=b"x", headers={**ok_headers, "ce-specversion": "2.0"}), 400)
        _is_error(await c.post(ev, content=b"x", headers={**ok_headers, "ce-time": "soon"}), 400)
        _is_error(await c.post(ev, content=b"x", headers={"content-type": "application/json"}), 400)
        _is_error(await c.post(ev, content=b"x", headers={"content-type": "application/cloudevents+avro"}), 415,
                  "UNSUPPORTED_MEDIA_TYPE")
        # bodies over the limit (64 KiB in the test config): with a length, and chunked
        big = b"x" * 70_000
        _is_error(await c.post(ev, content=big, headers=ok_headers), 413, "PAYLOAD_TOO_LARGE")

        async def chunks():
            for _ in range(10):
                yield b"y" * 10_000

        _is_error(await c.post("/v1/topics/bad/messages", content=chunks()), 413, "PAYLOAD_TOO_LARGE")
        # routes and methods that do not exist
        _is_error(await c.get("/v2/whatever"), 404, "NOT_FOUND")
        _is_error(await c.put("/v1/topics"), 405, "METHOD_NOT_ALLOWED")
        # a FIFO message group sent to a TRANSACTION topic is a type conflict
        await c.post("/v1/topics", json={"name": "tx", "type": "TRANSACTION"})
        _is_error(await c.post("/v1/topics/tx/messages", content=b"x"), 400)
        # still serving, and the good request goes through
        r = await c.post(ev, content=b"fine", headers=ok_headers)
        assert r.status_code == 200 and set(r.json()) == SEND_KEYS
        assert (await c.get("/healthz")).status_code == 200
    assert "Traceback" not in server.stderr()


def test_curl(unimq_server, tmp_path: Path) -> None:
    """Plain curl (a real client nobody here wrote) posting each mode and reading back."""
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed (Debian package curl, in the Makefile's APT_PACKAGES)")
    server = start_server(unimq_server, tmp_path)
    base = server.url("http", "")

    def run(*args: str) -> tuple[int, str]:
        out = subprocess.run([curl, "-sS", "-w", "\n%{http_code}", *args], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        body, _, code = out.stdout.rpartition("\n")
        return int(code), body

    code, body = run("-X", "POST", f"{base}/v1/topics", "-H", "content-type: application/json",
                     "-d", '{"name": "curl", "queues": 1}')
    assert code == 201, body
    code, body = run("-X", "POST", f"{base}/v1/topics/curl/events", "-H", "ce-specversion: 1.0", "-H", "ce-id: c1",
                     "-H", "ce-source: /curl", "-H", "ce-type: com.example.curl", "-H", "content-type: text/plain",
                     "--data-binary", "hello from curl")
    assert code == 200 and json.loads(body)["queue_offset"] == 0
    payload = tmp_path / "ev.json"
    payload.write_text(json.dumps({"specversion": "1.0", "id": "c2", "source": "/curl", "type": "com.example.curl",
                                   "data": {"n": 2}}))
    code, body = run("-X", "POST", f"{base}/v1/topics/curl/events", "-H", f"content-type: {CE_JSON}",
                     "--data-binary", f"@{payload}")
    assert code == 200 and json.loads(body)["queue_offset"] == 1
    code, body = run("-X", "POST", f"{base}/v1/topics/curl/messages?tag=T", "--data-binary", "plain")
    assert code == 200
    code, body = run(f"{base}/v1/topics/curl/queues/0/messages?offset=0&max=10")
    msgs = json.loads(body)["messages"]
    assert [base64.b64decode(m["body_base64"]) for m in msgs] == [b"hello from curl", b'{"n":2}', b"plain"]
    assert [m["protocol"] for m in msgs] == ["cloudevents", "cloudevents", "http"]
    code, body = run("-X", "POST", f"{base}/v1/topics/curl/events", "-H", f"content-type: {CE_JSON}", "-d", "{")
    assert code == 400 and json.loads(body)["error"] == "INVALID_CLOUDEVENT"
    code, body = run(f"{base}/v1/topics/curl")
    assert code == 200 and json.loads(body)["queues"] == [{"queue_id": 0, "min_offset": 0, "max_offset": 3}]
