"""Replicated broker groups under faults, real processes on 127.0.0.1 (issue 16).

The group of tests/test_replication.py (controller, nameserver, three brokers with two
acknowledging under sync flush, a gateway). Here: the broker state that is not a message
(a topic, a committed consumer offset, the doors' durable entries) on the new master after
a SIGKILL failover; a stalled replica leaving the in-sync set and rejoining; a deposed
master's unacknowledged tail cut when it comes back, with SIGKILLs during that rejoin.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time

import pytest

from core_broker.log_copy import INTENT_FILE
from core_broker.model import Message
from core_broker.remoting.client import RpcClient
from core_broker.remoting.rows import messages_to_block, put_results_from_block
from core_broker.topic_config import TopicConfig
from tests.test_replication import Group, group, http, post, read_all  # noqa: F401 - the fixture
from unimq.local_cluster import Proc

pytestmark = [pytest.mark.slow]


def _rpc(p: Proc) -> RpcClient:
    return RpcClient("127.0.0.1", p.ports["broker"], connect_timeout=3.0)


@pytest.mark.timeout(240)
def test_state_follows_the_master_through_a_failover(group: Group) -> None:
    """A topic created, a pull consumer's offset committed and door state written (an MQTT
    session, an AMQP durable queue) on the master are all on the new master after a SIGKILL."""
    g = group
    st = asyncio.run(g.state())
    old = st.master_id
    assert old is not None

    async def write() -> None:
        c = _rpc(g.brokers[old])
        try:
            await c.call("create_topic", TopicConfig("orders", queues=2))
            block = messages_to_block([Message("orders", f"o{i}".encode(), queue_id=i % 2) for i in range(10)])
            put_results_from_block(await c.call("send", block))
            await c.call("commit_offset", "billing", "orders", 1, 3)
            await c.call("kv_put", "mqtt.session", "sensor-7", b"persistent session, subscribed to a/#")
            await c.call("kv_put", "amqp.queue", "invoices", b"durable queue")
        finally:
            await c.close()

    asyncio.run(write())
    g.brokers[old].kill9()
    new = asyncio.run(g.wait_state(lambda s: s.master_id not in (None, old), "a new master", 30))
    assert new.master_id is not None

    async def check() -> None:
        c = _rpc(g.brokers[new.master_id])  # type: ignore[index]
        try:
            deadline = time.monotonic() + 20
            while True:  # the new master serves once its services started
                try:
                    tc = await c.call("get_topic", "orders")
                    break
                except Exception:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
            assert tc is not None and tc.queues == 2
            assert await c.call("get_offset", "billing", "orders", 1) == 3
            assert await c.call("kv_get", "mqtt.session", "sensor-7") == b"persistent session, subscribed to a/#"
            assert await c.call("kv_get", "amqp.queue", "invoices") == b"durable queue"
            assert sum([await c.call("query_offset", "orders", q) for q in (0, 1)]) == 10
        finally:
            await c.close()

    asyncio.run(check())


@pytest.mark.timeout(240)
def test_a_stalled_replica_leaves_the_in_sync_set_and_rejoins(group: Group) -> None:
    """A replica frozen (SIGSTOP) falls behind past replica_lag_max_ms: it leaves the set and
    puts keep being acknowledged by the other two; thawed, it catches up and rejoins."""
    g = group
    st = asyncio.run(g.state())
    lagger = next(b for b in ("b1", "b2", "b3") if b != st.master_id)
    os.kill(g.brokers[lagger].popen.pid, signal.SIGSTOP)
    try:
        for i in range(40):
            assert post(g, "lag", f"while frozen {i}".encode() * 20) == 200
        asyncio.run(g.wait_state(lambda s: lagger not in s.in_sync and len(s.in_sync) == 2, "the stalled replica out", 30))
        for i in range(40):
            assert post(g, "lag", f"after it left {i}".encode()) == 200
    finally:
        os.kill(g.brokers[lagger].popen.pid, signal.SIGCONT)
    asyncio.run(g.wait_state(lambda s: lagger in s.in_sync, "the replica back in the set", 40))
    assert post(g, "lag", b"all three again") == 200
    assert len(read_all(g, "lag")) == 81


class _Patient(Group):
    """Replicas frozen for about a second stay in the in-sync set (a lag allowance of 5 s, not
    1.5 s), so they can be elected after the master is killed even on a loaded machine."""

    def start_broker(self, b: str, *extra: str) -> Proc:
        return super().start_broker(b, "--set", "replica_lag_max_ms=5000", *extra)


class _FastSnapshots(_Patient):
    """... and snapshotting their state every 0.1 s: a snapshot always follows a write at once."""

    def start_broker(self, b: str, *extra: str) -> Proc:
        return super().start_broker(b, "--set", "broker.state_snapshot_interval_s=0.1", *extra)


def _in_sync_group(g: Group) -> Group:
    try:
        asyncio.run(g.wait_state(lambda s: s.master_id is not None and len(s.in_sync) == 3, "all three in sync"))
    except BaseException:
        g.stop()
        raise
    return g


@pytest.mark.timeout(300)
def test_a_deposed_master_cuts_its_unacknowledged_tail_even_killed_meanwhile(tmp_path) -> None:  # type: ignore[no-untyped-def]
    g = _in_sync_group(_Patient(tmp_path))
    try:
        _cut_tail(g)
    finally:
        g.stop()


def _cut_tail(g: Group) -> None:
    """Both replicas frozen (SIGSTOP), the master writes a batch nobody acknowledges and is killed
    before it could; a replica takes over. The old master comes back as a replica and cuts that
    tail - SIGKILLed at random moments of its rejoin, it cuts again on the next start - so its log
    ends up identical to the new master's and the unacknowledged messages are nowhere."""
    st = asyncio.run(g.state())
    old = st.master_id
    assert old is not None
    replicas = [b for b in ("b1", "b2", "b3") if b != old]
    for i in range(20):
        assert post(g, "tail", f"acked {i}".encode()) == 200
    unacked = [f"never acknowledged {i}".encode() for i in range(5)]

    async def unacknowledged_write() -> None:
        c = _rpc(g.brokers[old])
        try:
            tc = await c.call("get_topic", "tail")
            block = messages_to_block([Message("tail", u, queue_id=tc.queue_base) for u in unacked])
            send = asyncio.ensure_future(c.call("send", block, rpc_timeout=30.0))
            await asyncio.sleep(0.3)  # written, waiting for replicas that cannot answer
            assert not send.done()
            g.brokers[old].kill9()
            with pytest.raises(Exception):
                await send  # never acknowledged
        finally:
            await c.close()

    for b in replicas:
        os.kill(g.brokers[b].popen.pid, signal.SIGSTOP)
    # Fetches the replicas had waiting on the master (long polls) run out first: an answer
    # to one would carry the write into a frozen replica's socket, and it would keep it
    # (an unacknowledged write may survive; here the point is one that must not).
    time.sleep(0.7)
    try:
        asyncio.run(unacknowledged_write())
    finally:
        for b in replicas:
            os.kill(g.brokers[b].popen.pid, signal.SIGCONT)
    old_log = b"".join(f.read_bytes() for f in sorted((g.root / old / "commitlog").iterdir()))
    assert all(u in old_log for u in unacked)  # the tail is there, in the old master's log
    new = asyncio.run(g.wait_state(lambda s: s.master_id not in (None, old), "a new master", 40))
    for i in range(20, 30):
        # the new master takes writes once a replica caught up with it (heartbeats; slow under load)
        deadline = time.monotonic() + 60
        while (code := post(g, "tail", f"acked {i}".encode())) != 200:
            if time.monotonic() > deadline:
                state = asyncio.run(g.state())
                logs = "\n".join(f"--- {b}:\n{p.tail()}" for b, p in g.brokers.items())
                raise AssertionError(f"the new master {new.master_id} still answers {code} after 60 s; {state}\n{logs}")
            time.sleep(0.2)
    # SIGKILL in the middle of the cut: the store's truncation intent file is on disk from
    # before the first byte is cut until after the last; kill the moment it appears.
    intent = g.root / old / INTENT_FILE
    p = g.start_broker(old)
    deadline = time.monotonic() + 30
    while not intent.exists() and time.monotonic() < deadline:
        pass
    os.kill(p.popen.pid, signal.SIGKILL)
    p.popen.wait()
    assert intent.exists(), "the rejoin did not start a truncation within 30 s"
    rnd = random.Random(16)
    for _ in range(3):  # and at random moments of the next rejoins (which finish the cut first)
        p = g.start_broker(old)
        time.sleep(rnd.uniform(0.0, 0.5))
        p.kill9()
    assert not intent.exists()
    g.start_broker(old)
    asyncio.run(g.wait_state(lambda s: old in s.in_sync and len(s.in_sync) == 3, "the old master back in sync", 60))
    got = read_all(g, "tail")
    assert sorted(got) == sorted(f"acked {i}".encode() for i in range(30))
    g.stop()  # clean stops: both logs flushed
    master_files = sorted((g.root / str(new.master_id) / "commitlog").iterdir())
    old_files = sorted((g.root / old / "commitlog").iterdir())
    assert [f.name for f in master_files] == [f.name for f in old_files]
    for a, b in zip(master_files, old_files):
        assert a.read_bytes() == b.read_bytes(), f"{b} differs from the new master's {a}"
    for u in unacked:
        assert not any(u in f.read_bytes() for f in old_files), "an unacknowledged message survived the cut"


@pytest.mark.timeout(240)
def test_amqp_confirms_nack_while_too_few_replicas_are_in_sync(group: Group) -> None:
    """Below min_insync_replicas the AMQP door answers a confirmed publish with basic.nack (the
    retriable refusal reaches the client), and nothing of it is stored; back in sync, acks."""
    import pika

    g = group
    st = asyncio.run(g.state())
    params = pika.ConnectionParameters("127.0.0.1", g.gateway.ports["amqp"], blocked_connection_timeout=30)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.queue_declare("jobs", durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", "jobs", b"stored", pika.BasicProperties(delivery_mode=2))
    replicas = [b for b in ("b1", "b2", "b3") if b != st.master_id]
    for b in replicas:
        g.brokers[b].kill9()
    asyncio.run(g.wait_state(lambda s: s.in_sync == frozenset({st.master_id}), "replicas out of the in-sync set", 30))
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", "jobs", b"refused", pika.BasicProperties(delivery_mode=2))
    g.start_broker(replicas[0])
    asyncio.run(g.wait_state(lambda s: len(s.in_sync) == 2, "a replica back in sync", 40))
    deadline = time.monotonic() + 20
    while True:
        try:
            ch.basic_publish("", "jobs", b"after", pika.BasicProperties(delivery_mode=2))
            break
        except pika.exceptions.NackError:
            assert time.monotonic() < deadline
            time.sleep(0.3)
    got = []
    for _ in range(3):
        _m, _p, body = ch.basic_get("jobs", auto_ack=True)
        if body is not None:
            got.append(body)
    conn.close()
    assert b"refused" not in got and got[0] == b"stored" and b"after" in got


@pytest.mark.timeout(240)
def test_a_replica_serves_pulls_only_with_read_from_replica(group: Group) -> None:
    """Pulls go to the master; a replica refuses them (NOT_MASTER) unless read_from_replica is
    on, and then serves the offsets it holds - the same messages the master serves."""
    from core_broker.errors import NotMasterError
    from core_broker.remoting.rows import get_result_from_block

    g = group
    st = asyncio.run(g.state())
    for i in range(12):
        assert post(g, "near", f"n{i}".encode()) == 200
    plain, reader = [b for b in ("b1", "b2", "b3") if b != st.master_id]
    g.brokers[reader].stop()
    g.start_broker(reader, "--set", "read_from_replica=true")
    asyncio.run(g.wait_state(lambda s: reader in s.in_sync, "the reading replica back in sync", 40))

    async def pulls() -> None:
        m, p, r = _rpc(g.brokers[str(st.master_id)]), _rpc(g.brokers[plain]), _rpc(g.brokers[reader])
        try:
            tc = await m.call("get_topic", "near")
            want: list[bytes] = []
            for q in tc.queue_ids:
                want += [x.body for x in get_result_from_block(await m.call("pull", "near", q, 0, 64)).messages]
            assert len(want) == 12
            with pytest.raises(NotMasterError):
                await p.call("pull", "near", tc.queue_ids[0], 0, 64)
            deadline = time.monotonic() + 20
            while True:  # the replica learns the topic with the master's next state snapshot
                try:
                    got: list[bytes] = []
                    for q in tc.queue_ids:
                        got += [x.body for x in get_result_from_block(await r.call("pull", "near", q, 0, 64)).messages]
                    break
                except Exception:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.3)
            assert sorted(got) == sorted(want)
        finally:
            for c in (m, p, r):
                await c.close()

    asyncio.run(pulls())


@pytest.mark.timeout(300)
def test_a_deposed_master_forgets_state_it_snapshotted_from_its_cut_tail(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A master commits a consumer offset nobody acknowledges and snapshots it (its state file
    and offsets table now say 999) before it is killed. Back as a replica, it cuts that tail -
    and with it the snapshot: promoted later, it serves the acknowledged offset, not 999."""
    g = _in_sync_group(_FastSnapshots(tmp_path))
    try:
        st = asyncio.run(g.state())
        old = str(st.master_id)
        others = [b for b in ("b1", "b2", "b3") if b != old]
        assert post(g, "work", b"w") == 200

        async def commit(offset: int, acked: bool) -> None:
            c = _rpc(g.brokers[old])
            try:
                q = (await c.call("get_topic", "work")).queue_base
                if acked:
                    await c.call("commit_offset", "billing", "work", q, offset)
                    return
                pending = asyncio.ensure_future(c.call("commit_offset", "billing", "work", q, offset))
                await asyncio.sleep(0.5)  # journaled, snapshotted (0.1 s), waiting for frozen replicas
                assert not pending.done()
                g.brokers[old].kill9()
                with pytest.raises(Exception):
                    await pending
            finally:
                await c.close()

        asyncio.run(commit(2, acked=True))
        for b in others:
            os.kill(g.brokers[b].popen.pid, signal.SIGSTOP)
        time.sleep(0.7)  # the replicas' waiting fetches run out (see the test above)
        try:
            asyncio.run(commit(999, acked=False))
        finally:
            for b in others:
                os.kill(g.brokers[b].popen.pid, signal.SIGCONT)
        assert b'"billing"' in (g.root / old / "config" / "consumer_offsets.json").read_bytes()
        assert b"999" in (g.root / old / "config" / "consumer_offsets.json").read_bytes()
        new = asyncio.run(g.wait_state(lambda s: s.master_id not in (None, old), "a new master", 40))
        g.start_broker(old)
        asyncio.run(g.wait_state(lambda s: old in s.in_sync and len(s.in_sync) == 3, "the old master in sync", 60))
        for b in others:  # only the old master is left to lead
            g.brokers[b].kill9()
        asyncio.run(g.wait_state(lambda s: s.master_id == old, "the old master elected again", 40))
        assert new.master_id != old

        async def offset() -> int | None:
            c = _rpc(g.brokers[old])
            try:
                deadline = time.monotonic() + 20
                while True:
                    try:
                        tc = await c.call("get_topic", "work")
                        return await c.call("get_offset", "billing", "work", tc.queue_base)
                    except Exception:
                        assert time.monotonic() < deadline
                        await asyncio.sleep(0.2)
            finally:
                await c.close()

        assert asyncio.run(offset()) == 2
    finally:
        g.stop()
