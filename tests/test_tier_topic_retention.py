"""Per-topic tier retention (issue 17): the topic attribute ``tier_retention_hours``.

Segments mix topics, so a segment leaves the tier only once every topic with
messages in it has expired there: a topic kept for ever keeps every segment it
has a message in, and the short-lived topic's messages in those segments stay
readable; segments of the short-lived topic alone go, holes and all, and a pull
skips the holes. Against real S3-compatible servers (moto, ``rclone serve s3``)
on 127.0.0.1 and a real BrokerController.
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
from core_broker.tier.expiry import topic_hours
from core_broker.topic_config import TopicConfig

from test_tier_read import pull_all, view
from tier_helpers import S3Server, aws_credentials, manifests, s3, tier_config, wait_for  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("aws_credentials")]


async def pull_skipping_holes(bc: BrokerController, topic: str) -> list[tuple]:
    out: list[tuple] = []
    off = bc.query_offset(topic, 0, "begin")
    while True:
        r = await bc.pull(topic, 0, off, 32)
        if r.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE):
            return out
        assert r.status in (GetStatus.FOUND, GetStatus.OFFSET_MOVED), r
        assert r.next_offset > off
        out += [view(m) for m in r.messages]
        off = r.next_offset


@pytest.mark.parametrize("global_hours", [0.0, 2.0], ids=["global-forever", "global-2h"])
def test_a_segment_leaves_the_tier_only_when_every_topic_in_it_expired(
    tmp_path: Path, s3: S3Server, global_hours: float
) -> None:
    bucket = s3.new_bucket()
    cfg = tier_config(tmp_path / "d", s3, bucket, retention_hours=1.0, tier_retention_hours=global_hours)

    async def main() -> None:
        bc = BrokerController(cfg, BrokerConfig())
        await bc.start()
        tier, store = bc.tier, bc.store
        assert tier is not None
        try:
            bc.create_topic(TopicConfig("short", queues=1, attributes={"tier_retention_hours": "2"}), exist_ok=True)
            # kept for ever: by the global setting, or by its own attribute over a global 2 h
            keep_attrs = {} if global_hours == 0 else {"tier_retention_hours": "0"}
            bc.create_topic(TopicConfig("keep", queues=1, attributes=keep_attrs), exist_ok=True)

            def write() -> None:
                for phase, topics in enumerate((["short"], ["short", "keep"], ["short"], ["keep"], ["short"])):
                    for i in range(150):
                        store.put(Message(topics[i % len(topics)], os.urandom(600), keys=(f"{phase}-{i}",)))

            await asyncio.to_thread(write)
            short_before = await pull_all(bc, "short", 0)
            keep_before = await pull_all(bc, "keep", 0)
            await asyncio.to_thread(wait_for, lambda: tier.backlog() == (0, 0), 30)
            before = manifests(s3, bucket, store.store_id)
            topics = {b: {q[0] for q in m.queues} for b, m in before.items()}
            only_short = {b for b, ts in topics.items() if ts == {"short"}}
            assert len(only_short) >= 2 and len(before) - len(only_short) >= 2
            # what goes: segments all of whose topics expire (system topics have the global setting)
            going = {b for b, ts in topics.items() if all(tier.topic_retention_hours(t) > 0 for t in ts)}
            assert only_short <= going and not any("keep" in topics[b] for b in going)

            assert tier.run_expiry(now=time.time() + 1.5 * 3600) == 0  # nothing expired yet
            assert tier.run_expiry(now=time.time() + 3 * 3600) == len(going)
            after = manifests(s3, bucket, store.store_id)
            assert set(after) == set(before) - going  # every segment "keep" has a message in stays
            assert not [k for k in s3.keys(bucket) if any(f"{b:020d}" in k for b in going)]
            assert tier.run_expiry(now=time.time() + 1000 * 3600) == 0  # "keep" is kept for ever

            assert store.run_retention(now=time.time() + 10 * 3600) > 0  # local copies go too
            assert await pull_all(bc, "keep", 0) == keep_before  # byte for byte from offset 0
            kept = {qo for m in after.values() for t, _q, first, end, *_ in m.queues if t == "short"
                    for qo in range(first, end)}
            kept |= set(range(store.min_offset("short", 0), store.max_offset("short", 0)))
            got = await pull_skipping_holes(bc, "short")
            assert got == [v for v in short_before if v[2] in kept]  # holes skipped, the rest exact
            assert len(got) < len(short_before)
        finally:
            await bc.stop()

    asyncio.run(main())


def test_topic_hours_reads_the_attribute() -> None:
    assert topic_hours(None, 5.0, 1.0) == 5.0
    assert topic_hours({"tier_retention_hours": "24"}, 0.0, 1.0) == 24.0
    assert topic_hours({"tier_retention_hours": "0"}, 5.0, 1.0) == 0.0
    assert topic_hours({"tier_retention_hours": "0.5"}, 5.0, 1.0) == 1.0  # never under local retention
    assert topic_hours({"tier_retention_hours": "soon"}, 5.0, 1.0) == 5.0
    assert topic_hours({"tier_retention_hours": "-1"}, 5.0, 1.0) == 5.0


def test_a_topic_gets_its_tier_retention_over_http(unimq_server) -> None:
    """`POST /v1/topics` with `attributes` keeps them with the new topic (topics.json);
    a tier retention that is not hours >= 0 is refused."""
    import json

    import httpx

    srv = unimq_server('--set=doors=["http"]')
    with httpx.Client(base_url=srv.url("http", ""), timeout=30) as c:
        r = c.post("/v1/topics", json={"name": "audit", "queues": 1, "attributes": {"tier_retention_hours": "8760"}})
        assert r.status_code == 201, r.text
        for bad in ("-1", "forever", "nan"):
            r = c.post("/v1/topics", json={"name": f"x{bad}", "attributes": {"tier_retention_hours": bad}})
            assert r.status_code == 400, (bad, r.text)
    topics = json.loads((Path(srv.data_dir) / "config" / "topics.json").read_text())
    assert topics["audit"]["attributes"] == {"tier_retention_hours": "8760"}
    assert not [t for t in topics if t.startswith("x")]
