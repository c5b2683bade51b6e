"""Cold reads (issue 17): a pull of offsets whose segments left the local disk reads the tier.

Against a real S3-compatible server (moto) on 127.0.0.1 and a real BrokerController:
messages are written across many small segments, uploaded, deleted locally by
retention, then pulled from offset 0; every message must come back exactly as a
local pull gave it before retention (body byte for byte, id, keys, tag,
properties, offsets), links resolved, filters applied, through the tier's own
read workers and a cache that stays within its bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import pytest

from core_broker.broker_controller import BrokerController
from core_broker.config import BrokerConfig
from core_broker.model import FilterExpression, GetStatus, Message, StoredMessage
from core_broker.tier import layout
from core_broker.topic_config import TopicConfig

from tier_helpers import (  # noqa: F401 (fixtures)
    S3Server, aws_credentials, manifests, parts, s3, tier_config, tiered_broker, wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("aws_credentials")]


def view(m: StoredMessage) -> tuple:
    return (
        m.topic, m.queue_id, m.queue_offset, m.message_id, bytes(m.body), m.tag, m.keys, m.properties,
        m.born_timestamp_ms, m.store_timestamp_ms, m.reconsume_times,
    )


async def pull_all(bc: BrokerController, topic: str, qid: int, flt: FilterExpression | None = None) -> list[tuple]:
    out: list[tuple] = []
    off = bc.query_offset(topic, qid, "begin")
    while True:
        r = await bc.pull(topic, qid, off, 32, flt)
        if r.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE):
            return out
        assert r.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE), r
        assert r.next_offset > off
        out += [view(m) for m in r.messages]
        off = r.next_offset


def write(bc: BrokerController, n: int) -> None:
    store = bc.store
    origins = []
    for i in range(n):
        r = store.put(Message(
            "T", os.urandom(300 + i % 700), tag="ab"[i % 2], keys=(f"k{i}",),
            properties={"i": str(i), "p": "x" * (i % 5)}, queue_id=i % 2,
        ))
        if i < 20:
            origins.append(r.commitlog_offset)
    for o in origins:  # links (as a retry or a timer writes them): body stored once, in the tier too
        store.put_link(o, "L", 0, properties={"linked": "yes"})
    for i in range(n):  # push the links' segment out too
        store.put(Message("F", os.urandom(500)))


@pytest.mark.parametrize("cache", [64 << 10, 64 << 20], ids=["small-cache", "large-cache"])
def test_pull_reads_every_retired_message_back_from_the_tier(tmp_path: Path, s3: S3Server, cache: int) -> None:
    bucket = s3.new_bucket()
    cfg = tier_config(
        tmp_path / "d", s3, bucket, retention_hours=1.0, tier_read_block_bytes=16 << 10, tier_read_cache_bytes=cache,
    )

    async def main() -> None:
        bc = BrokerController(cfg, BrokerConfig())
        await bc.start()
        tier = bc.tier
        assert tier is not None
        try:
            for name, queues in (("T", 2), ("L", 1), ("F", 1)):
                bc.create_topic(TopicConfig(name, queues=queues), exist_ok=True)
            await asyncio.to_thread(write, bc, 600)
            before = {q: await pull_all(bc, "T", q) for q in (0, 1)}
            links_before = await pull_all(bc, "L", 0)
            tagged_before = await pull_all(bc, "T", 0, FilterExpression("a"))
            assert len(before[0]) == len(before[1]) == 300 and len(links_before) == 20
            assert links_before[0][7]["linked"] == "yes"
            await asyncio.to_thread(wait_for, lambda: tier.backlog() == (0, 0), 30)
            removed = bc.store.run_retention(now=time.time() + 10 * 3600)
            assert removed >= 10 and bc.store.min_offset("T", 0) > 0 and bc.store.min_offset("L", 0) > 0
            assert bc.query_offset("T", 0, "begin") == 0

            seen_threads: set[str] = set()
            get_range = tier.objects.get_range

            def recording(*a, **kw):  # observe where ranged GETs run (the client itself is real)
                seen_threads.add(threading.current_thread().name)
                return get_range(*a, **kw)

            tier.objects.get_range = recording  # type: ignore[method-assign]
            loop_ticks = 0

            async def ticker() -> None:  # the event loop keeps running while cold reads wait
                nonlocal loop_ticks
                while True:
                    loop_ticks += 1
                    await asyncio.sleep(0.001)

            t = asyncio.create_task(ticker())
            after = {q: await pull_all(bc, "T", q) for q in (0, 1)}
            t.cancel()
            assert after == before
            assert await pull_all(bc, "L", 0) == links_before
            assert await pull_all(bc, "T", 0, FilterExpression("a")) == tagged_before
            assert seen_threads and all(n.startswith("unimq-tier-read") for n in seen_threads), seen_threads
            assert loop_ticks > 0
            c = tier.reader.cache
            assert c.size <= c.capacity
            if cache > 1 << 20:  # everything fits: a second pass makes no GET
                gets = tier.reader.gets
                assert await pull_all(bc, "T", 1) == before[1]
                assert tier.reader.gets == gets
        finally:
            await bc.stop()

    asyncio.run(main())


def as_version_2(s3: S3Server, bucket: str, store_id: str) -> int:
    """Rewrite the tier as a broker before inline index and keys left it: per segment a segment
    object of the records only, index and keys objects beside it, a version 2 manifest."""
    n = 0
    for base, m in manifests(s3, bucket, store_id).items():
        if not m.inline:
            continue
        got = parts(s3, bucket, store_id, m)
        put = s3.client.put_object
        put(Bucket=bucket, Key=f"t/{layout.segment_key(store_id, base)}", Body=got["segment"])
        put(Bucket=bucket, Key=f"t/{layout.index_key(store_id, base)}", Body=got["index"])
        if m.keys_length:
            put(Bucket=bucket, Key=f"t/{layout.keys_key(store_id, base)}", Body=got["keys"])
        old = json.loads(m.encode())
        del old["inline"]
        old["version"] = 2
        put(Bucket=bucket, Key=f"t/{layout.manifest_key(store_id, base)}", Body=json.dumps(old).encode())
        n += 1
    return n


def test_a_tier_written_with_separate_index_and_keys_objects_still_reads(tmp_path: Path, s3: S3Server) -> None:
    """Manifests of version 2 (index and keys objects of their own, as every tier was before
    version 3 put them after the records): pulls and queries by key read them as before."""
    bucket = s3.new_bucket()
    cfg = tier_config(tmp_path / "d", s3, bucket, retention_hours=1.0, tier_read_block_bytes=4096)

    async def main() -> None:
        async with tiered_broker(cfg) as bc:
            tier = bc.tier
            assert tier is not None
            for name, queues in (("T", 2), ("L", 1), ("F", 1)):
                bc.create_topic(TopicConfig(name, queues=queues), exist_ok=True)
            await asyncio.to_thread(write, bc, 300)
            before = {q: await pull_all(bc, "T", q) for q in (0, 1)}
            await asyncio.to_thread(wait_for, lambda: tier.backlog() == (0, 0), 30)
            store_id = bc.store.store_id
        assert as_version_2(s3, bucket, store_id) >= 3
        async with tiered_broker(cfg) as bc:
            tier = bc.tier
            assert tier is not None and await asyncio.to_thread(tier.uploader.wait_listed, 30)
            assert all(not m.inline and m.version == 2 for m in tier.uploader.manifests())
            assert bc.store.run_retention(now=time.time() + 10 * 3600) >= 3 and bc.store.min_offset("T", 0) > 0
            assert {q: await pull_all(bc, "T", q) for q in (0, 1)} == before
            got = await bc.query_by_key_async("T", "k7")
            assert [bytes(m.body) for m in got] == [before[1][3][4]]  # message 7: queue 1, offset 3

    asyncio.run(main())


def test_a_cold_sequential_read_makes_one_get_per_single_block_segment(tmp_path: Path, s3: S3Server) -> None:
    """A segment whose records fit one block and whose index is inline: its index's first block
    and its records come in one GET, and the reader still gets every message byte for byte."""
    from core_broker.message_store import MessageStore
    from core_broker.tier import TierService

    cfg = tier_config(tmp_path / "d", s3, s3.new_bucket(), retention_hours=1.0, tier_read_block_bytes=128 << 10,
                      tier_read_ahead_bytes=0)
    store = MessageStore(cfg)
    store.start()
    tier = store.tier = TierService(store)
    tier.start()
    try:
        bodies = [os.urandom(200 + i % 300) for i in range(1500)]
        for b in bodies:
            store.put(Message("S", b))
        wait_for(lambda: tier.backlog() == (0, 0), 30)
        store.run_retention(now=time.time() + 10 * 3600)
        cold = store.min_offset("S", 0)
        ms = manifests(s3, cfg.tier_bucket, store.store_id)
        retired = [m for m in ms.values() if m.base + m.length <= store.commitlog.min_offset]
        assert cold > 100 and retired and all(m.inline and m.size <= 128 << 10 for m in retired)
        got: list[bytes] = []
        off = 0
        while off < cold:
            r = tier.reader.get("S", 0, off, 64)
            assert r is not None and r.status == GetStatus.FOUND
            got += [bytes(m.body) for m in r.messages]
            off = r.next_offset
        assert got == bodies[:cold]
        assert tier.reader.gets == len(retired)  # not two (index, then records) per segment
    finally:
        tier.stop()
        store.shutdown()
