"""Queries by key and by client-chosen id for messages only the tier holds (issue 17).

Before a sealed segment leaves local disk, its keys and client message ids (the local
IndexFile's entries that point into it) are uploaded as a keys object beside it; a query
by key or by id of a message whose segment retention removed locally finds it there.
Against real S3-compatible servers (moto, ``rclone serve s3``) on 127.0.0.1: through a
real BrokerController and its in-process client, and end to end over HTTP (CloudEvents
found by id) against a `unimq up` whose first segments local retention deleted.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import pytest

from core_broker.model import Message
from core_broker.topic_config import TopicConfig
from gateway.broker_client import LocalBrokerClient

from tier_helpers import (  # noqa: F401 (fixtures)
    S3Server, aws_credentials, manifests, parts, s3, tier_config, tier_up_sets, tiered_broker, wait_for,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("aws_credentials")]


def test_keys_and_client_ids_are_found_in_the_tier(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    cfg = tier_config(tmp_path / "d", s3, bucket, retention_hours=1.0, tier_read_block_bytes=4096)

    async def main() -> None:
        async with tiered_broker(cfg) as bc:
            tier, store = bc.tier, bc.store
            assert tier is not None
            bc.create_topic(TopicConfig("T", queues=2), exist_ok=True)
            bc.create_topic(TopicConfig("U", queues=1), exist_ok=True)
            bodies = [os.urandom(700) for _ in range(300)]

            def write() -> None:
                for i, b in enumerate(bodies):
                    # every key twice in T (i and i + 150), once in U under the same name
                    store.put(Message("T", b, keys=(f"k{i % 150}",), message_id=f"client-{i}", queue_id=i % 2))
                    if i % 10 == 0:
                        store.put(Message("U", b"u" + b, keys=(f"k{i % 150}",)))
                for _ in range(60):  # the last T messages' segment is sealed too
                    store.put(Message("F", os.urandom(700)))

            bc.create_topic(TopicConfig("F", queues=1), exist_ok=True)
            await asyncio.to_thread(write)
            want_key = {k: sorted(bytes(m.body) for m in bc.query_by_key("T", f"k{k}")) for k in (0, 7, 149)}
            assert all(len(v) == 2 for v in want_key.values())
            await asyncio.to_thread(wait_for, lambda: tier.backlog() == (0, 0), 30)
            assert store.run_retention(now=time.time() + 10 * 3600) >= 3
            assert bc.query_by_key("T", "k0") == [] and bc.query_by_id("client-0") is None  # gone locally

            client = LocalBrokerClient(bc, owns=False)
            for k, want in want_key.items():
                got = await client.query_by_key("T", f"k{k}", 0, 2**62, 32)
                assert sorted(bytes(m.body) for m in got) == want, k
                assert all(m.topic == "T" and f"k{k}" in m.keys for m in got)
            u = await bc.query_by_key_async("U", "k0")  # same key, other topic: only its own
            assert sorted(bytes(m.body) for m in u) == sorted([b"u" + bodies[0], b"u" + bodies[150]])
            assert await bc.query_by_key_async("T", "no-such-key") == []
            assert len(await bc.query_by_key_async("T", "k7", max_count=1)) == 1
            for i in (0, 1, 150, 299):
                m = await client.query_by_id(f"client-{i}")
                assert m is not None and bytes(m.body) == bodies[i] and m.message_id == f"client-{i}", i
            assert await bc.query_by_id_async("client-300") is None
            # the keys object is where the answers came from, and it is named by the manifest
            ms = manifests(s3, bucket, store.store_id)
            assert ms and all(m.keys_length > 0 for m in ms.values() if m.first_ts)
            assert all(parts(s3, bucket, store.store_id, m)["keys"] for m in ms.values() if m.keys_length)

    asyncio.run(main())


def test_cloudevents_retired_locally_are_found_by_id_over_http(unimq_server, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    srv = unimq_server(*tier_up_sets(s3, bucket), "--set=http_index_event_ids=true")
    first_segment = Path(srv.data_dir) / "commitlog" / f"{0:020d}"
    with httpx.Client(base_url=srv.url("http", ""), timeout=30) as c:
        assert c.post("/v1/topics", json={"name": "ce", "queues": 1}).status_code in (200, 201)
        for i in range(300):
            r = c.post("/v1/topics/ce/events", content=os.urandom(400), headers={
                "ce-specversion": "1.0", "ce-id": f"evt-{i}", "ce-source": "/sensors/1", "ce-type": "reading",
                "content-type": "application/octet-stream"})
            assert r.status_code in (200, 201), r.text
        wait_for(lambda: not first_segment.exists(), timeout=60)  # uploaded, then retired locally
        for i in (0, 1, 5):
            page = c.get("/v1/topics/ce/events", params={"id": f"evt-{i}"}).json()
            assert [m["properties"].get("ce_id") for m in page["messages"]] == [f"evt-{i}"], (i, page)
        assert c.get("/v1/topics/ce/events", params={"id": "evt-none"}).json() == {"messages": []}
