"""Batch topics (issue 18) with the tier (issue 17): a segment holding batch records is uploaded
with its batch queues' entries as they are (32 bytes, one per record), and once local retention
deleted it a pull reads every message back from the tier, from any offset, inside a batch too.

Against a real S3-compatible server on 127.0.0.1 and a real BrokerController. Before the
segment index knew batch queues, the uploader looped on their entries and never confirmed a
segment: the wait for an empty backlog below fails (and ``tier.stop`` would hang: pytest-timeout).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from core_broker.broker_controller import BrokerController
from core_broker.config import BrokerConfig
from core_broker.model import GetStatus, Message
from core_broker.topic_config import TopicConfig
from gateway.batch_codec import batch_record, expand_all

from tier_helpers import S3Server, aws_credentials, s3, tier_config, wait_for  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("aws_credentials")]


async def pull_from(bc: BrokerController, topic: str, qid: int, off: int) -> list[tuple[int, bytes]]:
    """(queue offset, body) of every message from ``off`` on, batches unpacked as a door does."""
    out: list[tuple[int, bytes]] = []
    while True:
        r = await bc.pull(topic, qid, off, 7, None)
        if r.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE):
            return out
        assert r.status == GetStatus.FOUND, r
        assert r.next_offset > off
        out += [(m.queue_offset, bytes(m.body)) for m in expand_all(r.messages)]
        off = r.next_offset


def write(bc: BrokerController, n_batches: int) -> list[bytes]:
    """Batches of 1 to 12 messages (and single messages) into queue 0 of ``B``, plain messages
    into ``P``: many small segments, each with both kinds of queue."""
    bodies: list[bytes] = []
    for i in range(n_batches):
        size = 1 + i % 12
        msgs = [Message("B", os.urandom(200 + (i * 7 + j) % 300)) for j in range(size)]
        if i % 5 == 4:
            bc.store.put(Message("B", msgs[0].body))  # a plain message on a batch topic: count 1
            bodies.append(msgs[0].body)
        else:
            bc.store.put(batch_record("B", msgs, "zstd" if i % 2 else "none"))
            bodies += [m.body for m in msgs]
        bc.store.put(Message("P", os.urandom(400)))
    return bodies


def test_batch_topic_segments_upload_and_read_back_from_the_tier(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    cfg = tier_config(tmp_path / "d", s3, bucket, retention_hours=1.0, tier_read_block_bytes=16 << 10)

    async def main() -> None:
        bc = BrokerController(cfg, BrokerConfig())
        await bc.start()
        tier = bc.tier
        assert tier is not None
        try:
            bc.create_topic(TopicConfig("B", queues=1, attributes={"batch": "true"}), exist_ok=True)
            bc.create_topic(TopicConfig("P", queues=1), exist_ok=True)
            bodies = await asyncio.to_thread(write, bc, 150)
            want = list(enumerate(bodies))
            assert await pull_from(bc, "B", 0, 0) == want
            plain = await pull_from(bc, "P", 0, 0)
            await asyncio.to_thread(wait_for, lambda: tier.backlog() == (0, 0), 30)
            batch_queues = [q for m in tier.uploader.manifests() for q in m.queues if q[0] == "B"]
            assert batch_queues and all(q[5] == 32 for q in batch_queues)
            removed = bc.store.run_retention(now=time.time() + 10 * 3600)
            assert removed >= 5 and bc.store.min_offset("B", 0) > 0 and bc.store.min_offset("P", 0) > 0
            assert bc.query_offset("B", 0, "begin") == 0
            gets = tier.reader.gets
            assert await pull_from(bc, "B", 0, 0) == want
            assert tier.reader.gets > gets  # read from the tier
            assert await pull_from(bc, "P", 0, 0) == plain
            # every offset, inside a batch too, starts a pull at that very message
            for off in range(0, bc.store.min_offset("B", 0) + 3):
                r = await bc.pull("B", 0, off, 1, None)
                assert r.status == GetStatus.FOUND and r.next_offset == off + 1, (off, r)
                got = expand_all(r.messages)
                assert [(m.queue_offset, bytes(m.body)) for m in got] == [want[off]]
        finally:
            await bc.stop()

    asyncio.run(main())
