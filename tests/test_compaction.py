"""Compacted topics through a real `unimq up`: keys overwritten and deleted, compaction forced
over HTTP, the table, pulls from offset 0, delete markers' retention, the doors' answers to a
message without a key, and a SIGKILL in the middle of a compaction.

Waiting: compaction copies only records the commitlog has flushed, so a test asks again (with
a deadline) until a forced compaction has covered what it wrote; nothing asserts how fast.
"""

from __future__ import annotations

import base64
import signal
import threading
import time
from pathlib import Path

import grpc
import httpx
import paho.mqtt.publish as mqtt_publish
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc

from grpc_helpers import raw_message

pytestmark = pytest.mark.timeout(300)

SMALL = ("--set", "store.commitlog_segment_size=2097152", "--set", "store.compaction_check_interval_s=3600",
         "--set", "store.flush_interval_ms=20", "--mqtt-ws-port", "-1")


def _create(c: httpx.Client, name: str, queues: int = 2, **attrs: str) -> None:
    r = c.post("/v1/topics", json={"name": name, "queues": queues, "type": "COMPACTED", "attributes": attrs})
    assert r.status_code == 201, r.text


def _put(c: httpx.Client, topic: str, key: str, body: bytes) -> None:
    r = c.post(f"/v1/topics/{topic}/messages", params={"keys": key}, content=body)
    assert r.status_code == 200, r.text


def _roll(c: httpx.Client, nbytes: int = 2_300_000) -> None:
    """Write another topic past a segment: the compacted topic's records leave the active segment."""
    for _ in range(nbytes // 8000 + 1):
        assert c.post("/v1/topics/filler/messages", content=b"f" * 8000).status_code == 200


def _pull_all(c: httpx.Client, topic: str) -> list[dict]:
    out = []
    for q in c.get(f"/v1/topics/{topic}").json()["queues"]:
        off = 0
        while off < q["max_offset"]:
            r = c.get(f"/v1/topics/{topic}/queues/{q['queue_id']}/messages", params={"offset": off, "max": 1000}).json()
            if not r["messages"]:
                break
            out += r["messages"]
            off = r["next_offset"]
    return out


def _table(c: httpx.Client, topic: str, page: int = 7) -> dict[str, bytes]:
    rows: list[dict] = []
    cursor = None
    while True:
        r = c.get(f"/v1/topics/{topic}/table", params={"max": page, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        rows += r.json()["rows"]
        cursor = r.json()["cursor"]
        if cursor is None:
            break
    keys = [row["key"] for row in rows]
    assert len(keys) == len(set(keys)), "a key came twice in one table read with no write meanwhile"
    return {row["key"]: base64.b64decode(row["body_base64"]) for row in rows}


def _latest(messages: list[dict]) -> dict[str, bytes]:
    """What a reader from the start ends up with: the last value of every key, per queue order."""
    out: dict[str, bytes] = {}
    for m in messages:
        out[m["keys"][0]] = base64.b64decode(m["body_base64"])
    return out


def _compact_until_once_per_key(c: httpx.Client, topic: str, timeout: float = 60.0) -> list[dict]:
    """Force compaction until every key is stored once (all its records flushed and sealed)."""
    deadline = time.monotonic() + timeout
    while True:
        r = c.post(f"/v1/topics/{topic}/compact", timeout=120)
        assert r.status_code == 200, r.text
        got = _pull_all(c, topic)
        keys = [m["keys"][0] for m in got]
        if len(keys) == len(set(keys)):
            return got
        assert time.monotonic() < deadline, f"still {len(keys) - len(set(keys))} older values after compaction"
        time.sleep(0.2)


def test_compaction_keeps_the_latest_value_per_key_and_the_table_reads_it(unimq_server) -> None:
    server = unimq_server(*SMALL)
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        _create(c, "kv", delete_retention_ms="3600000")
        _create(c, "kvd", delete_retention_ms="1")
        expected: dict[str, dict[str, bytes]] = {"kv": {}, "kvd": {}}
        for topic in expected:
            for rnd in range(4):
                for k in range(40):
                    body = f"{topic}-{rnd}-{k}".encode()
                    _put(c, topic, f"key{k}", body)
                    expected[topic][f"key{k}"] = body
            for k in range(0, 40, 8):  # delete markers: an empty body
                _put(c, topic, f"key{k}", b"")
                expected[topic][f"key{k}"] = b""
        before = {t: _pull_all(c, t) for t in expected}
        _roll(c)
        for topic, latest in expected.items():
            got = _compact_until_once_per_key(c, topic)
            by_queue: dict[int, list[int]] = {}
            for m in got:
                by_queue.setdefault(m["queue_id"], []).append(m["queue_offset"])
            for offsets in by_queue.values():
                assert offsets == sorted(offsets) and len(offsets) == len(set(offsets))
            # the records kept are the ones that were there, at the same offsets
            old = {(m["queue_id"], m["queue_offset"]): m["message_id"] for m in before[topic]}
            assert all(old[(m["queue_id"], m["queue_offset"])] == m["message_id"] for m in got)
            live = {k: v for k, v in latest.items() if v}
            if topic == "kv":  # markers kept for their retention (an hour): a late reader sees the deletes
                assert _latest(got) == latest
            else:  # 1 ms: gone with the pass that found them expired
                assert _latest(got) == live
            assert _table(c, topic) == live
        # writes after compaction: the table has them at once, before any pass
        _put(c, "kv", "key1", b"newer")
        _put(c, "kv", "key3", b"")
        _put(c, "kv", "fresh", b"hello")
        want = {k: v for k, v in expected["kv"].items() if v} | {"key1": b"newer", "fresh": b"hello"}
        want.pop("key3")
        assert _table(c, "kv") == want
        # a normal topic has no table; compaction of it is refused
        c.post("/v1/topics", json={"name": "plain", "queues": 1})
        assert c.get("/v1/topics/plain/table").status_code == 400
        assert c.post("/v1/topics/plain/compact").status_code == 400


def test_a_message_without_a_key_is_refused_by_every_door(unimq_server) -> None:
    server = unimq_server(*SMALL)
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        _create(c, "kv", queues=1)
        r = c.post("/v1/topics/kv/messages", content=b"no key")
        assert r.status_code == 400 and r.json()["error"] == "ILLEGAL_MESSAGE_KEY", r.text
        ce = c.post("/v1/topics/kv/events", headers={"ce-specversion": "1.0", "ce-id": "1", "ce-source": "/s",
                                                     "ce-type": "t"}, content=b"x")
        # a CloudEvent has a key only with http_index_event_ids on (its id); off by default
        assert ce.status_code == 400 and ce.json()["error"] == "ILLEGAL_MESSAGE_KEY", ce.text

        async def grpc_send() -> tuple[int, int]:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as ch:
                stub = sgrpc.MessagingServiceStub(ch)
                bare = await stub.SendMessage(spb.SendMessageRequest(messages=[raw_message("kv", b"v")]), timeout=10)
                keyed = raw_message("kv", b"v")
                keyed.system_properties.keys.append("g1")
                ok = await stub.SendMessage(spb.SendMessageRequest(messages=[keyed]), timeout=10)
                return bare.status.code, ok.status.code

        import asyncio

        bare, ok = asyncio.run(grpc_send())
        assert bare == pb.Code.ILLEGAL_MESSAGE_KEY and ok == pb.Code.OK
        # MQTT: the MQTT topic is the key (the latest publish per MQTT topic is kept)
        _create(c, "dev", queues=2)
        for i in range(3):
            for d in ("dev/a/temp", "dev/b/temp"):
                mqtt_publish.single(d, f"{d}={i}", qos=1, hostname="127.0.0.1", port=server.ports["mqtt"])
        assert _table(c, "dev") == {"dev/a/temp": b"dev/a/temp=2", "dev/b/temp": b"dev/b/temp=2"}
        assert _table(c, "kv") == {"g1": b"v"}  # the refused sends stored nothing


def _compacted_files(data_dir: Path) -> list[str]:
    d = data_dir / "compacted" / "big" / "0"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_sigkill_during_compaction_loses_nothing(unimq_server) -> None:
    throttled = (*SMALL, "--set", "store.compaction_max_bytes_per_s=400000", "--set", "store.compaction_map_entries=150")
    server = unimq_server(*throttled)
    expected: dict[str, bytes] = {}
    with httpx.Client(base_url=server.url(), timeout=30) as c:
        _create(c, "big", queues=1)
        for rnd in range(6):
            for k in range(300):
                body = f"{rnd}:{k}:".encode() + bytes([65 + rnd]) * 600
                _put(c, "big", f"k{k}", body)
                expected[f"k{k}"] = body
        _roll(c)
        time.sleep(0.5)  # flushed (20 ms interval)
        answered: list[int] = []

        def compact() -> None:  # killed under it: the request fails, which is the point
            try:
                answered.append(httpx.post(server.url(path="/v1/topics/big/compact"), timeout=300).status_code)
            except httpx.HTTPError:
                pass

        t = threading.Thread(target=compact, daemon=True)
        t.start()
        # wait for a pass that is writing its generation after at least one was switched in
        deadline = time.monotonic() + 120
        while True:
            names = _compacted_files(server.data_dir)
            if "state.json" in names and any(n.endswith(".tmp") for n in names):
                break
            assert not answered, "compaction finished before the kill: slow it down further"
            assert time.monotonic() < deadline, f"no compaction in progress seen: {names}"
            time.sleep(0.02)
    server.stop(signal.SIGKILL)
    t.join(timeout=30)
    assert any(n.endswith(".tmp") for n in names)

    again = unimq_server(*SMALL, data_dir=server.data_dir)
    with httpx.Client(base_url=again.url(), timeout=30) as c:
        assert not any(n.endswith(".tmp") for n in _compacted_files(again.data_dir))  # cleaned at start
        got = _pull_all(c, "big")
        offsets = [m["queue_offset"] for m in got]
        assert offsets == sorted(set(offsets))
        assert _latest(got) == expected  # a reader from the start: the latest value of every key
        assert _table(c, "big", page=64) == expected
        got = _compact_until_once_per_key(c, "big")
        assert _latest(got) == expected and len(got) == len(expected)
        assert _table(c, "big", page=64) == expected
