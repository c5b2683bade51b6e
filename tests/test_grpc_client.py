"""The official RocketMQ 5 Python client against `unimq up`, unchanged.

Producer + SimpleConsumer (send, receive, ack), FIFO order under concurrent
producers, delay, transactions (commit, rollback, and an open one resolved by
the producer's checker over Telemetry), change invisible duration, tag and
SQL92 filters, PushConsumer, dead-lettering (non-FIFO through redelivery,
FIFO through ForwardMessageToDeadLetterQueue).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Iterator

import pytest
from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer, TransactionChecker, TransactionResolution
from rocketmq.grpc_protocol import FilterType

from grpc_helpers import (
    client_config,
    message,
    producer,
    receive_until,
    shared_server,
    simple_consumer,
    started,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def grpc_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """One server for the module: every test uses its own topics and groups."""
    config = write_config(tmp_path_factory.mktemp("grpc-client-config"))
    with shared_server(tmp_path_factory, "--config", str(config)) as server:
        yield server.ports["grpc"]


def test_send_receive_ack(grpc_port: int) -> None:
    with started(producer(grpc_port, ("orders",))) as p:
        sent = {}
        for i in range(10):
            r = p.send(message("orders", f"order-{i}".encode(), tag="TagA", keys=(f"k{i}",), props={"n": str(i)}))
            assert r.message_id and r.offset >= 0
            sent[r.message_id] = i
    with started(simple_consumer(grpc_port, "g-orders", {"orders": FilterExpression()})) as c:
        got = receive_until(c, 10)
        assert {m.message_id for m in got} == set(sent)
        for m in got:
            i = sent[m.message_id]
            assert m.body == f"order-{i}".encode()
            assert m.topic == "orders" and m.tag == "TagA" and m.keys == {f"k{i}"}
            assert m.properties == {"n": str(i)}
            assert m.delivery_attempt == 1 and not m.corrupted and m.born_timestamp > 0
        assert c.receive(32, 30) == []  # all acked: nothing comes back


def test_fifo_order_within_groups_under_concurrent_producers(grpc_port: int) -> None:
    per_producer, groups = 30, ("ga", "gb", "gc")
    errors: list[BaseException] = []

    def produce(pid: int) -> None:
        try:
            with started(producer(grpc_port, ("fifo_t",))) as p:
                for seq in range(per_producer):
                    g = groups[seq % len(groups)]
                    p.send(message("fifo_t", f"{pid}:{seq}".encode(), group=g))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(pid,)) for pid in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    with started(simple_consumer(grpc_port, "g-fifo", {"fifo_t": FilterExpression()})) as c:
        got = receive_until(c, 3 * per_producer, timeout=60)
    seen: dict[tuple[str, str], list[int]] = defaultdict(list)
    for m in got:
        pid, seq = m.body.decode().split(":")
        assert m.message_group == groups[int(seq) % len(groups)]
        seen[(m.message_group, pid)].append(int(seq))
    assert len(got) == 3 * per_producer
    for key, seqs in seen.items():
        assert seqs == sorted(seqs), f"group/producer {key} delivered out of order: {seqs}"


def test_delay_message_not_delivered_before_its_time(grpc_port: int) -> None:
    deliver_at = int(time.time()) + 3
    with started(producer(grpc_port, ("delay_t",))) as p:
        p.send(message("delay_t", b"later", deliver_at_s=deliver_at))
    with started(simple_consumer(grpc_port, "g-delay", {"delay_t": FilterExpression()}, await_s=1)) as c:
        got = []
        while not got:
            batch = c.receive(8, 30)
            now = time.time()
            if batch:
                assert now >= deliver_at, "a delay message arrived before its delivery time"
            got += batch
            assert now < deliver_at + 30, "the delay message never arrived"
        assert got[0].body == b"later" and got[0].delivery_timestamp == deliver_at * 1000
        c.ack(got[0])


class RecordingChecker(TransactionChecker):
    def __init__(self, resolution: TransactionResolution) -> None:
        self.resolution = resolution
        self.checked: list[bytes] = []

    def check(self, message):  # type: ignore[no-untyped-def]
        self.checked.append(message.body)
        return self.resolution


def test_transactions_commit_rollback_and_checker(grpc_port: int) -> None:
    checker = RecordingChecker(TransactionResolution.COMMIT)
    with started(producer(grpc_port, ("txn_t",), checker=checker)) as p:
        t1 = p.begin_transaction()
        r1 = p.send(message("txn_t", b"committed"), t1)
        assert r1.transaction_id
        t1.commit()
        t2 = p.begin_transaction()
        p.send(message("txn_t", b"rolled-back"), t2)
        t2.rollback()
        t3 = p.begin_transaction()
        p.send(message("txn_t", b"orphan"), t3)  # neither committed nor rolled back
        with started(simple_consumer(grpc_port, "g-txn", {"txn_t": FilterExpression()}, await_s=1)) as c:
            # the open transaction is checked back with this producer, whose checker commits it
            got = receive_until(c, 2, timeout=40)
            assert sorted(m.body for m in got) == [b"committed", b"orphan"]
            assert b"orphan" in checker.checked and b"committed" not in checker.checked
            assert c.receive(8, 30) == []  # the rolled-back half never shows up


def test_change_invisible_duration_brings_message_back(grpc_port: int) -> None:
    with started(producer(grpc_port, ("inv_t",))) as p:
        p.send(message("inv_t", b"again"))
    with started(simple_consumer(grpc_port, "g-inv", {"inv_t": FilterExpression()}, await_s=1)) as c:
        [m] = receive_until(c, 1, ack=False)
        old_handle = m.receipt_handle
        c.change_invisible_duration(m, 1)
        assert m.receipt_handle != old_handle  # the client takes the new handle from the response
        [again] = receive_until(c, 1, ack=False, timeout=30)
        assert again.message_id == m.message_id and again.delivery_attempt == 2
        c.ack(again)
        assert c.receive(8, 30) == []


def test_tag_and_sql_filters(grpc_port: int) -> None:
    with started(producer(grpc_port, ("sensors",))) as p:
        p.send(message("sensors", b"a-eu-hot", tag="TagA", props={"region": "eu", "temp": "35"}))
        p.send(message("sensors", b"b-eu-cold", tag="TagB", props={"region": "eu", "temp": "10"}))
        p.send(message("sensors", b"c-us-hot", tag="TagC", props={"region": "us", "temp": "40"}))
        p.send(message("sensors", b"d-notag", props={"region": "eu", "temp": "31"}))
    tags = simple_consumer(grpc_port, "g-tags", {"sensors": FilterExpression("TagA || TagB")}, await_s=1)
    with started(tags) as c:
        got = receive_until(c, 2)
        assert sorted(m.body for m in got) == [b"a-eu-hot", b"b-eu-cold"]
        assert c.receive(8, 30) == []
    sql = FilterExpression("region = 'eu' AND temp > 30", FilterType.SQL)
    with started(simple_consumer(grpc_port, "g-sql", {"sensors": sql}, await_s=1)) as c:
        got = receive_until(c, 2)
        assert sorted(m.body for m in got) == [b"a-eu-hot", b"d-notag"]
        assert c.receive(8, 30) == []


class Collecting(MessageListener):
    def __init__(self, result: ConsumeResult = ConsumeResult.SUCCESS) -> None:
        self.result = result
        self.lock = threading.Lock()
        self.messages: list = []

    def consume(self, message):  # type: ignore[no-untyped-def]
        with self.lock:
            self.messages.append(message)
        return self.result


def test_push_consumer_receives_everything(grpc_port: int) -> None:
    listener = Collecting()
    push = PushConsumer(client_config(grpc_port), "g-push", listener, {"pushed": FilterExpression()})
    with started(push):
        with started(producer(grpc_port, ("pushed",))) as p:
            ids = {p.send(message("pushed", f"p{i}".encode())).message_id for i in range(30)}
        wait_for(lambda: {m.message_id for m in listener.messages} >= ids, 40, "all pushed messages")
    assert {m.message_id for m in listener.messages} == ids


def test_failing_message_reaches_dlq(grpc_port: int) -> None:
    listener = Collecting(ConsumeResult.FAILURE)
    push = PushConsumer(client_config(grpc_port), "g-fail", listener, {"poison": FilterExpression()})
    with started(push):
        with started(producer(grpc_port, ("poison",))) as p:
            mid = p.send(message("poison", b"poison-pill")).message_id
        # max_delivery_attempts = 3 in the suite's config: 3 deliveries, then the DLQ
        wait_for(lambda: len(listener.messages) >= 3, 40, "three deliveries")
        with started(simple_consumer(grpc_port, "g-dlq-reader", {"%DLQ%g-fail": FilterExpression()}, await_s=1)) as c:
            got = _receive_retrying(c, 1)
    assert [m.delivery_attempt for m in listener.messages[:3]] == [1, 2, 3]
    assert got[0].message_id == mid and got[0].body == b"poison-pill"


def test_failing_fifo_message_is_forwarded_to_dlq(grpc_port: int) -> None:
    listener = Collecting(ConsumeResult.FAILURE)
    push = PushConsumer(client_config(grpc_port), "g-fifo-fail", listener, {"fifo_dlq_t": FilterExpression()})
    with started(push):
        assert push.fifo  # the server's settings said the subscription is FIFO
        with started(producer(grpc_port, ("fifo_dlq_t",))) as p:
            mid = p.send(message("fifo_dlq_t", b"fifo-poison", group="g1")).message_id
        wait_for(lambda: len(listener.messages) >= 3, 40, "three local attempts")
        with started(simple_consumer(grpc_port, "g-dlq2", {"%DLQ%g-fifo-fail": FilterExpression()}, await_s=1)) as c:
            got = _receive_retrying(c, 1)
    assert got[0].message_id == mid and got[0].body == b"fifo-poison"


def _receive_retrying(c, count: int, timeout: float = 30.0) -> list:  # type: ignore[no-untyped-def]
    """Receive from a topic that may not exist yet (a DLQ is created by the first dead letter)."""
    deadline = time.monotonic() + timeout
    got: list = []
    while len(got) < count:
        try:
            got += receive_until(c, count - len(got), timeout=max(1.0, deadline - time.monotonic()))
        except AssertionError:
            raise
        except Exception:  # route not found yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    return got
