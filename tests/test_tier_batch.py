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
from core_broker.config import BrokerConfig, StoreConfig
from core_broker.model import FilterExpression, GetStatus, Message
from core_broker.tier.layout import Manifest
from core_broker.topic_config import TopicConfig
from gateway.batch_codec import batch_record, expand, expand_all

from tier_helpers import S3Server, aws_credentials, s3, tier_config, tiered_broker, wait_for  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("aws_credentials")]


async def pull_from(bc: BrokerController, topic: str, qid: int, off: int, ids: list[tuple[str, int]] | None = None,
                    flt: FilterExpression | None = None) -> list[tuple[int, bytes]]:
    """(queue offset, body) of every message from ``off`` on, batches unpacked as a door does
    (their message ids and store timestamps appended to ``ids``)."""
    out: list[tuple[int, bytes]] = []
    while True:
        r = await bc.pull(topic, qid, off, 7, flt)
        if r.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE):
            return out
        assert r.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE), r
        assert r.next_offset > off
        got = expand_all(r.messages)
        out += [(m.queue_offset, bytes(m.body)) for m in got]
        if ids is not None:
            ids += [(m.message_id, m.store_timestamp_ms) for m in got]
        off = r.next_offset


def config(tmp_path: Path, s3: S3Server) -> StoreConfig:
    return tier_config(tmp_path / "d", s3, s3.new_bucket(), retention_hours=1.0, tier_read_block_bytes=16 << 10)


async def retire(bc: BrokerController) -> int:
    """Wait until every sealed segment is in the tier, then let local retention delete them."""
    tier = bc.tier
    assert tier is not None
    await asyncio.to_thread(wait_for, lambda: tier.backlog() == (0, 0), 30)
    return bc.store.run_retention(now=time.time() + 10 * 3600)


def write(bc: BrokerController, n_batches: int) -> list[bytes]:
    """Batches of 1 to 12 messages (and single messages) into queue 0 of the batch topic ``B``,
    plain messages into ``P``: many small segments, each with both kinds of queue."""
    bc.create_topic(TopicConfig("B", queues=1, attributes={"batch": "true"}), exist_ok=True)
    bc.create_topic(TopicConfig("P", queues=1), exist_ok=True)
    bodies: list[bytes] = []
    for i in range(n_batches):
        size = 1 + i % 12
        msgs = [Message("B", os.urandom(200 + (i * 7 + j) % 300), tag="ab"[i % 2]) for j in range(size)]
        if i % 5 == 4:
            bc.store.put(Message("B", msgs[0].body))  # a plain message on a batch topic: count 1
            bodies.append(msgs[0].body)
        else:
            bc.store.put(batch_record("B", msgs, "zstd" if i % 2 else "none"))
            bodies += [m.body for m in msgs]
        bc.store.put(Message("P", os.urandom(400)))
    return bodies


def test_batch_topic_segments_upload_and_read_back_from_the_tier(tmp_path: Path, s3: S3Server) -> None:
    async def main() -> None:
        async with tiered_broker(config(tmp_path, s3)) as bc:
            tier = bc.tier
            assert tier is not None
            bodies = await asyncio.to_thread(write, bc, 150)
            want = list(enumerate(bodies))
            ids: list[tuple[str, int]] = []
            assert await pull_from(bc, "B", 0, 0, ids) == want
            plain = await pull_from(bc, "P", 0, 0)
            tagged = await pull_from(bc, "B", 0, 0, flt=FilterExpression("a"))
            assert 0 < len(tagged) < len(want)
            removed = await retire(bc)
            batch_queues = [q for m in tier.uploader.manifests() for q in m.queues if q[0] == "B"]
            assert batch_queues and all(q[5] == 32 for q in batch_queues)
            assert removed >= 5 and bc.store.min_offset("B", 0) > 0 and bc.store.min_offset("P", 0) > 0
            assert bc.query_offset("B", 0, "begin") == 0
            gets = tier.reader.gets
            assert await pull_from(bc, "B", 0, 0) == want
            assert tier.reader.gets > gets  # read from the tier
            assert await pull_from(bc, "P", 0, 0) == plain
            assert await pull_from(bc, "B", 0, 0, flt=FilterExpression("a")) == tagged
            # every offset, inside a batch too, starts a pull at that very message
            for off in range(0, bc.store.min_offset("B", 0) + 3):
                r = await bc.pull("B", 0, off, 1, None)
                assert r.status == GetStatus.FOUND and r.next_offset == off + 1, (off, r)
                got = expand_all(r.messages)
                assert [(m.queue_offset, bytes(m.body)) for m in got] == [want[off]]
            # query by id: a server id names its record's offset + the message's index in the batch
            local_min = bc.store.min_offset("B", 0)
            assert bc.query_by_id(ids[3][0]) is None  # gone locally
            for off in range(0, local_min):
                m = await bc.query_by_id_async(ids[off][0])
                assert m is not None, off
                assert (m.queue_offset, bytes(expand(m).body), expand(m).message_id) == (*want[off], ids[off][0])
            # by time: the first offset stored at or after a time (a batch's offsets share its record's)
            for off in range(0, local_min, 7):
                ts = ids[off][1]
                expect = min(o for o, (_, t) in enumerate(ids) if t >= ts)
                assert await bc.query_offset_async("B", 0, "timestamp", ts) == expect, off

    asyncio.run(main())


@pytest.mark.parametrize("retired", [True, False], ids=["from-tier", "local"])
def test_batch_messages_pop_and_come_back_after_their_invisible_time(tmp_path: Path, s3: S3Server, retired: bool) -> None:
    """A group pops a batch topic one message per offset (behind local retention: from the
    tier); those it never acks are revived into the retry queue as links naming their index in
    the batch (looked up in the tier when only it holds the entry; a batch of one message names
    index 0, a plain message none), and delivered again: the same messages, not others."""
    async def main() -> None:
        async with tiered_broker(config(tmp_path, s3), BrokerConfig(max_delivery_attempts=5, retry_backoff_ms=(0,))) as bc:
            bodies = await asyncio.to_thread(write, bc, 100)
            if retired:
                assert await retire(bc) >= 3
                assert bc.store.min_offset("B", 0) > 20

            first = await bc.pop("redo", "B", 16, 300)
            got = [(p.message.queue_offset, bytes(expand(p.message).body)) for p in first]
            assert got == list(enumerate(bodies))[:16]
            want = sorted(b for _, b in got)
            again: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(again) < 16 and time.monotonic() < deadline:
                for p in await bc.pop("redo", "B", 32, 60_000):
                    if p.delivery_attempt > 1:
                        again.append(bytes(expand(p.message).body))
                    await bc.ack("redo", p.receipt_handle)
                await asyncio.sleep(0.05)
            assert sorted(again) == want

    asyncio.run(main())


def test_a_manifest_from_before_batch_topics_reads_as_classic_entries() -> None:
    """Manifests uploaded before queues named their entry size stay readable: 20-byte entries."""
    old = b'{"base":0,"length":10,"size":64,"sha256":"x","index_length":40,"first_ts":1,"last_ts":2,' \
          b'"queues":[["T",0,5,7,0]],"keys_length":0,"version":2}'
    assert Manifest.decode(old).queues == [["T", 0, 5, 7, 0, 20]]
    m = Manifest.decode(old)
    m.queues = [["B", 1, 0, 9, 0, 32]]
    assert Manifest.decode(m.encode()).queues == [["B", 1, 0, 9, 0, 32]]
