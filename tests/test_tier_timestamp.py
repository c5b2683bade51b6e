"""Offsets by time, and messages by server id, for data only the tier holds (issue 17).

RocketMQ's "consume from a time" and Spark's reads from a timestamp ask a queue
for its first offset stored at or after a time. Once retention removed a
queue's first segments locally, the answer may lie in the tier: it must be the
one the local search gave before retention, for every time, found on the tier's
read workers (and with no GET at all for a time newer than the tier's data).
Against real S3-compatible servers (moto, ``rclone serve s3``) on 127.0.0.1 and a
real BrokerController, through the broker and the in-process broker client.
A server-assigned message id names its record's offset, so a query by such an
id of a message gone from local disk is one record read from the tier.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from core_broker.broker_controller import BrokerController
from core_broker.config import BrokerConfig
from core_broker.model import Message
from core_broker.topic_config import TopicConfig
from gateway.broker_client import LocalBrokerClient

from tier_helpers import S3Server, aws_credentials, s3, tier_config, wait_for  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("aws_credentials")]


def test_offset_for_timestamp_finds_offsets_only_in_the_tier(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    cfg = tier_config(tmp_path / "d", s3, bucket, retention_hours=1.0, tier_read_block_bytes=16 << 10)

    async def main() -> None:
        bc = BrokerController(cfg, BrokerConfig())
        await bc.start()
        tier, store = bc.tier, bc.store
        assert tier is not None
        try:
            bc.create_topic(TopicConfig("T", queues=2), exist_ok=True)
            bc.create_topic(TopicConfig("F", queues=1), exist_ok=True)

            def write() -> None:
                for i in range(400):
                    store.put(Message("T", os.urandom(400), queue_id=i % 2))
                    if i % 25 == 0:
                        time.sleep(0.003)  # several distinct store times per segment
                for _ in range(100):  # the last T messages' segment is sealed too
                    store.put(Message("F", os.urandom(400)))

            await asyncio.to_thread(write)
            stamps = sorted({m.store_timestamp_ms for q in (0, 1) for m in store.get("T", q, 0, 1000).messages})
            times = [0, *stamps, *(t + 1 for t in stamps), stamps[-1] + 10**6]
            before = {(q, t): bc.query_offset("T", q, "timestamp", t) for q in (0, 1) for t in times}
            assert before[(0, 0)] == 0 and before[(0, stamps[-1] + 10**6)] == 200
            await asyncio.to_thread(wait_for, lambda: tier.backlog() == (0, 0), 30)
            assert store.run_retention(now=time.time() + 10 * 3600) >= 3
            assert store.min_offset("T", 0) > 0 and store.min_offset("T", 1) > 0
            assert bc.query_offset("T", 0, "timestamp", 0) > 0  # the local search alone misses the tier

            client = LocalBrokerClient(bc, owns=False)
            for (q, t), want in before.items():
                assert await bc.query_offset_async("T", q, "timestamp", t) == want, (q, t)
            for (q, t), want in list(before.items())[::7]:
                assert await client.query_offset(bc.name, "T", q, "timestamp", t) == want, (q, t)
            gets = tier.reader.gets
            assert await bc.query_offset_async("T", 0, "timestamp", stamps[-1] + 10**6) == 200
            assert tier.reader.gets == gets  # newer than the tier: manifests answer, no GET
        finally:
            await bc.stop()

    asyncio.run(main())


def test_query_by_server_id_reads_the_tier(tmp_path: Path, s3: S3Server) -> None:
    """A server-assigned id names its record's commitlog offset: found in the tier once local
    retention removed it, through the broker and the in-process broker client."""
    bucket = s3.new_bucket()
    cfg = tier_config(tmp_path / "d", s3, bucket, retention_hours=1.0)

    async def main() -> None:
        bc = BrokerController(cfg, BrokerConfig())
        await bc.start()
        tier, store = bc.tier, bc.store
        assert tier is not None
        try:
            bc.create_topic(TopicConfig("T", queues=1), exist_ok=True)
            bodies = [os.urandom(800) for _ in range(300)]
            ids = [(await asyncio.to_thread(store.put, Message("T", b, keys=(f"k{i}",)))).message_id
                   for i, b in enumerate(bodies)]
            before = {i: bc.query_by_id(ids[i]) for i in range(0, 300, 13)}
            assert all(m is not None for m in before.values())
            await asyncio.to_thread(wait_for, lambda: tier.backlog() == (0, 0), 30)
            assert store.run_retention(now=time.time() + 10 * 3600) >= 3
            assert bc.query_by_id(ids[0]) is None  # not on local disk any more
            client = LocalBrokerClient(bc, owns=False)
            for i, want in before.items():
                got = await client.query_by_id(ids[i])
                assert got is not None and (got.message_id, bytes(got.body), got.keys, got.topic) == (
                    want.message_id, bodies[i], want.keys, "T"), i
            bad = ids[0][:-1] + ("1" if ids[0][-1] != "1" else "2")  # not a record boundary
            assert await bc.query_by_id_async(bad) is None
            assert await bc.query_by_id_async("nonsense") is None
        finally:
            await bc.stop()

    asyncio.run(main())
