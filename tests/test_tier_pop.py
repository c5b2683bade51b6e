"""Pops of messages only the tier holds (issue 17).

A consumer group that fell behind local retention, or a new group reading from the start,
pops what local retention removed from the tier: every message once, and one whose
invisible time ends without an ack comes back (a retry link whose origin only the tier
holds), found by the tier's index objects. Against real S3-compatible servers (moto,
``rclone serve s3``) on 127.0.0.1 and a real BrokerController.
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

from tier_helpers import S3Server, aws_credentials, s3, tier_config, tiered_broker, wait_for  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("aws_credentials")]
N = 400


async def pop_all(bc: BrokerController, group: str, invisible_ms: int = 60_000, ack: bool = True,
                  limit: int = 10_000) -> list[bytes]:
    out: list[bytes] = []
    idle = 0
    while idle < 3 and len(out) < limit:
        got = await bc.pop(group, "T", 32, invisible_ms)
        idle = 0 if got else idle + 1
        for p in got:
            out.append(bytes(p.message.body))
            if ack:
                await bc.ack(group, p.receipt_handle)
    return out


def test_groups_behind_local_retention_pop_from_the_tier(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    cfg = tier_config(tmp_path / "d", s3, bucket, retention_hours=1.0, tier_read_block_bytes=16 << 10)

    async def main() -> None:
        async with tiered_broker(cfg, BrokerConfig(max_delivery_attempts=5, retry_backoff_ms=(0,))) as bc:
            tier, store = bc.tier, bc.store
            assert tier is not None
            bc.create_topic(TopicConfig("T", queues=2), exist_ok=True)
            bc.create_topic(TopicConfig("F", queues=1), exist_ok=True)
            bodies = [b"%05d" % i + os.urandom(600) for i in range(N)]

            def write() -> None:
                for i, b in enumerate(bodies):
                    store.put(Message("T", b, queue_id=i % 2))
                for _ in range(100):  # the last T messages' segment is sealed too
                    store.put(Message("F", os.urandom(600)))

            await asyncio.to_thread(write)
            lagging = await bc.pop("lag", "T", 10, 60_000)  # a group that read a little, then fell behind
            for p in lagging:
                await bc.ack("lag", p.receipt_handle)
            await asyncio.to_thread(wait_for, lambda: tier.backlog() == (0, 0), 30)
            assert store.run_retention(now=time.time() + 10 * 3600) >= 3
            assert store.min_offset("T", 0) > 10 and store.min_offset("T", 1) > 10

            rest = await pop_all(bc, "lag")
            got = sorted([bytes(p.message.body) for p in lagging] + rest)
            assert got == sorted(bodies)  # every message once, the retired ones from the tier

            fresh = await pop_all(bc, "fresh")  # a new group reads from the tier's oldest offset
            assert sorted(fresh) == sorted(bodies)
            for q in (0, 1):  # in order per queue
                per_q = [b for b in fresh if int(b[:5]) % 2 == q]
                assert per_q == sorted(per_q)

            # popped from the tier and never acked: revived into the retry queue (a link whose
            # origin only the tier holds) and delivered again, body intact
            first = await bc.pop("redo", "T", 8, 300)
            assert len(first) == 8 and all(store.phys_at("T", p.message.queue_id, p.message.queue_offset) is None
                                           for p in first)
            want = sorted(bytes(p.message.body) for p in first)
            again: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(again) < 8 and time.monotonic() < deadline:
                for p in await bc.pop("redo", "T", 32, 60_000):
                    if p.delivery_attempt > 1:
                        again.append(bytes(p.message.body))
                    await bc.ack("redo", p.receipt_handle)
                await asyncio.sleep(0.05)
            assert sorted(again) == want

    asyncio.run(main())
