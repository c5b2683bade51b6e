"""Restart with an empty local disk: the tier is the log's past (issue 17).

A broker with the tier on writes, its segments are uploaded, it stops (cleanly here;
`unimq up` killed with SIGKILL in the last test here), and everything in its
folder except what the README says must stay (``store_id`` and ``config/``) is
deleted. Started again, it reads where the tier ends from the manifests, serves every
message from the tier (pull, pop, query by key and by id, the journal's state), and new
writes continue after the tier's offsets, never reusing one: in the commitlog (the
tier's objects are named by it) nor in any queue (consumers hold those). Against real
S3-compatible servers (moto, ``rclone serve s3``) on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
from pathlib import Path

import httpx
import pytest

from core_broker.broker_controller import BrokerController
from core_broker.config import BrokerConfig
from core_broker.errors import TierUnreadableError
from core_broker.model import GetStatus, Message
from core_broker.topic_config import TopicConfig

from tier_helpers import (  # noqa: F401 (fixtures)
    S3Server, aws_credentials, s3, tier_config, tier_up_sets, tiered_broker, wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("aws_credentials")]
N = 300
KEEP = {"store_id", "config"}  # what the README says must survive


def wipe_local_disk(data: Path) -> None:
    """Delete everything in the store's folder but what must stay."""
    for p in data.iterdir():
        if p.name in KEEP:
            continue
        shutil.rmtree(p) if p.is_dir() else p.unlink()


async def read_queue(bc: BrokerController, topic: str, qid: int, start: int = 0) -> list:
    out, off = [], start
    while True:
        r = await bc.pull(topic, qid, off, 64)
        if not r.messages:
            assert r.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE), r.status
            return out
        out += r.messages
        off = r.next_offset


def test_empty_local_disk_reads_the_tier_and_continues_after_it(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    data = tmp_path / "d"
    cfg = tier_config(data, s3, bucket, tier_read_block_bytes=16 << 10)
    bodies = [b"%05d" % i + os.urandom(500 + i % 300) for i in range(N)]

    async def first_life() -> tuple[list[str], int]:
        async with tiered_broker(cfg) as bc:
            tier, store = bc.tier, bc.store
            assert tier is not None
            bc.create_topic(TopicConfig("T", queues=2), exist_ok=True)
            bc.create_topic(TopicConfig("F", queues=1), exist_ok=True)

            def write() -> tuple[list[str], int]:
                ids, last = [], 0
                for i, b in enumerate(bodies):
                    r = store.put(Message("T", b, queue_id=i % 2, keys=(f"k{i}",)))
                    ids.append(r.message_id)
                    last = r.commitlog_offset
                seg = cfg.commitlog_segment_size
                while store.commitlog.write_pos // seg == last // seg:  # seal the last T message's segment
                    store.put(Message("F", os.urandom(700)))
                return ids, store.commitlog.write_pos

            ids, end = await asyncio.to_thread(write)
            # a group pops and acks some: its cursor and acks are in the journal (and the tier)
            popped = await bc.pop("g", "T", 10, 60_000)
            for p in popped:
                await bc.ack("g", p.receipt_handle)
            await asyncio.to_thread(wait_for, lambda: tier.backlog() == (0, 0), 30)
            return ids, end

    ids, old_end = asyncio.run(first_life())
    wipe_local_disk(data)
    assert sorted(p.name for p in data.iterdir()) == sorted(KEEP)

    async def second_life() -> None:
        async with tiered_broker(cfg) as bc:
            store, tier = bc.store, bc.tier
            assert tier is not None
            in_tier = tier.uploader.manifests()
            tier_end = in_tier[-1].base + in_tier[-1].size
            assert store.commitlog.write_pos == tier_end  # the log continues after the tier's last segment
            assert tier_end <= old_end
            got = [await read_queue(bc, "T", q) for q in (0, 1)]
            for q in (0, 1):
                assert [m.queue_offset for m in got[q]] == list(range(len(got[q])))
                assert [bytes(m.body) for m in got[q]] == bodies[q::2]  # byte for byte, from the tier
                assert [m.message_id for m in got[q]] == ids[q::2]
            assert (await bc.query_by_key_async("T", "k7"))[0].body == bodies[7]
            assert bytes((await bc.query_by_id_async(ids[123])).body) == bodies[123]
            # a new group pops everything from the tier; the group of the first life goes on
            # after what it acked (its cursor survived in config/, its journal in the tier)
            fresh: list[bytes] = []
            while len(fresh) < N:
                got_p = await bc.pop("fresh", "T", 32, 60_000)
                assert got_p, len(fresh)
                for p in got_p:
                    fresh.append(bytes(p.message.body))
                    await bc.ack("fresh", p.receipt_handle)
            assert sorted(fresh) == sorted(bodies)
            rest = []
            while got_p := await bc.pop("g", "T", 32, 60_000):
                rest += [bytes(p.message.body) for p in got_p]
                for p in got_p:
                    await bc.ack("g", p.receipt_handle)
            assert len(rest) == N - 10 and set(rest) < set(bodies)

            # new writes: after the tier's offsets, in the log and in every queue
            more = [os.urandom(400) for _ in range(20)]
            for i, b in enumerate(more):
                r = await asyncio.to_thread(store.put, Message("T", b, queue_id=i % 2))
                assert r.commitlog_offset >= tier_end
                assert r.queue_offset == N // 2 + i // 2
            for q in (0, 1):
                assert [bytes(m.body) for m in await read_queue(bc, "T", q)] == bodies[q::2] + more[q::2]
            assert store.max_offset("F", 0) > 0 and store.min_offset("F", 0) == store.max_offset("F", 0)

    asyncio.run(second_life())

    async def third_life() -> None:  # local disk kept now: the queues' starts survive a restart
        async with tiered_broker(cfg) as bc:
            f_end = bc.store.max_offset("F", 0)
            assert f_end > 0 and bc.store.min_offset("F", 0) == f_end  # F got no new write: still after the tier
            r = await asyncio.to_thread(bc.store.put, Message("F", b"after"))
            assert r.queue_offset == f_end
            assert len(await read_queue(bc, "T", 0)) == N // 2 + 10

    asyncio.run(third_life())


def test_empty_local_disk_and_no_tier_refuses_to_start(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    data = tmp_path / "d"
    cfg = tier_config(data, s3, bucket)

    async def life() -> None:
        async with tiered_broker(cfg) as bc:
            await asyncio.to_thread(bc.store.put, Message("T", b"x"))

    asyncio.run(life())
    wipe_local_disk(data)
    s3.stop()

    async def restart() -> None:
        bc = BrokerController(cfg, BrokerConfig())
        with pytest.raises(TierUnreadableError):
            await bc.start()
        assert not bc.store.running

    asyncio.run(restart())


def backlog_segments(c: httpx.Client) -> int:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("unimq_tier_backlog_segments"):
            return int(float(line.split()[-1]))
    raise AssertionError("no unimq_tier_backlog_segments on /metrics")


def read_http(c: httpx.Client, start: int, n: int) -> list[dict]:
    got, off = [], start
    while len(got) < n:
        page = c.get("/v1/topics/cold/queues/0/messages", params={"offset": off, "max": 100}).json()
        assert page["messages"], page
        got += page["messages"]
        off = page["next_offset"]
    return got


def test_unimq_up_killed_and_started_on_an_empty_disk_serves_the_tier_over_http(
    unimq_server, s3: S3Server
) -> None:
    bucket = s3.new_bucket()
    sets = tier_up_sets(s3, bucket)
    srv = unimq_server(*sets)
    data = Path(srv.data_dir)
    bodies = [os.urandom(200 + i) for i in range(N)]
    with httpx.Client(base_url=srv.url("http", ""), timeout=30) as c:
        assert c.post("/v1/topics", json={"name": "cold", "queues": 1}).status_code in (200, 201)
        assert c.post("/v1/topics", json={"name": "filler", "queues": 1}).status_code in (200, 201)
        ids = []
        for i, b in enumerate(bodies):
            r = c.post(f"/v1/topics/cold/messages?keys=k{i}", content=b)
            assert r.status_code in (200, 201), r.text
            ids.append(r.json()["message_id"])

        def phys(message_id: str) -> int:  # a server id ends with its record's commitlog offset
            return int(message_id[-16:], 16)

        seg = 65536
        while True:  # seal the segment of the last cold message: only sealed segments go up
            r = c.post("/v1/topics/filler/messages", content=os.urandom(2000))
            if phys(r.json()["message_id"]) // seg > phys(ids[-1]) // seg:
                break
        wait_for(lambda: backlog_segments(c) == 0, timeout=30)
    assert srv.stop(signal.SIGKILL) == -signal.SIGKILL
    wipe_local_disk(data)

    srv = unimq_server(*sets, data_dir=data)
    with httpx.Client(base_url=srv.url("http", ""), timeout=30) as c:
        got = read_http(c, 0, N)
        assert [m["queue_offset"] for m in got] == list(range(N))
        assert [base64.b64decode(m["body_base64"]) for m in got] == bodies
        assert [m["message_id"] for m in got] == ids
        pa = pytest.importorskip("pyarrow")  # the Spark source's pages
        r = c.get("/v1/topics/cold/queues/0/messages", params={"offset": 0, "max": 100, "format": "arrow"})
        assert r.status_code == 200, r.text
        table = pa.ipc.open_stream(r.content).read_all()
        assert table.column("body").to_pylist() == bodies[: table.num_rows] and table.num_rows > 0

        more = [os.urandom(300) for _ in range(20)]
        for i, b in enumerate(more):
            r = c.post("/v1/topics/cold/messages", content=b)
            assert r.json()["queue_offset"] == N + i  # no offset given twice
            assert phys(r.json()["message_id"]) >= phys(ids[-1])
        got = read_http(c, 0, N + len(more))
        assert [base64.b64decode(m["body_base64"]) for m in got] == bodies + more
    assert srv.stop(signal.SIGTERM) == 0, srv.stderr()
