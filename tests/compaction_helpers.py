"""Helpers of the compacted-topic tests (test_compaction.py, test_spark_compacted.py): a
`unimq up` with small segments, writes by key over HTTP, and reads of what compaction kept.

Waiting: compaction copies only records the commitlog has flushed, so
:func:`compact_until_once_per_key` asks again (with a deadline) until a forced compaction covered
what a test wrote; nothing asserts how fast.
"""

from __future__ import annotations

import base64
import time

import httpx

SMALL = ("--set", "store.commitlog_segment_size=2097152", "--set", "store.compaction_check_interval_s=3600",
         "--set", "store.flush_interval_ms=20", "--mqtt-ws-port", "-1")


def create(c: httpx.Client, name: str, queues: int = 2, **attrs: str) -> None:
    r = c.post("/v1/topics", json={"name": name, "queues": queues, "type": "COMPACTED", "attributes": attrs})
    assert r.status_code == 201, r.text


def put(c: httpx.Client, topic: str, key: str, body: bytes) -> None:
    r = c.post(f"/v1/topics/{topic}/messages", params={"keys": key}, content=body)
    assert r.status_code == 200, r.text


def roll(c: httpx.Client, nbytes: int = 2_300_000) -> None:
    """Write another topic past a segment: the compacted topic's records leave the active segment."""
    for _ in range(nbytes // 8000 + 1):
        assert c.post("/v1/topics/filler/messages", content=b"f" * 8000).status_code == 200


def pull_all(c: httpx.Client, topic: str) -> list[dict]:
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


def read_table(c: httpx.Client, topic: str, page: int = 7) -> dict[str, bytes]:
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


def latest_of(messages: list[dict]) -> dict[str, bytes]:
    """What a reader from the start ends up with: the last value of every key, per queue order."""
    out: dict[str, bytes] = {}
    for m in messages:
        out[m["keys"][0]] = base64.b64decode(m["body_base64"])
    return out


def compact_until_once_per_key(c: httpx.Client, topic: str, timeout: float = 60.0) -> list[dict]:
    """Force compaction until every key is stored once (all its records flushed and sealed)."""
    deadline = time.monotonic() + timeout
    while True:
        r = c.post(f"/v1/topics/{topic}/compact", timeout=120)
        assert r.status_code == 200, r.text
        got = pull_all(c, topic)
        keys = [m["keys"][0] for m in got]
        if len(keys) == len(set(keys)):
            return got
        assert time.monotonic() < deadline, f"still {len(keys) - len(set(keys))} older values after compaction"
        time.sleep(0.2)
