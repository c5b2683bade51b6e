"""A subscriber that falls behind past the in-memory budget gets everything, once, in order.

Why: a connected QoS 1 session that is behind keeps just-stored messages in
memory up to ``mqtt_mem_queue_bytes``; what arrives past the budget is read
back from the store, and once the budget has room again new messages go to
memory again while the gap before them is still in the store. Those three
sources (live, memory, store gap) must interleave into one gap-free,
duplicate-free, ordered stream. The budget here holds ten 100-byte messages and
the in-flight window is 4, so a 60-message burst spans all three.
"""

from __future__ import annotations

import pytest

from adapters.mqtt import codec as C
from mqtt_fixtures import Paho, RawClient, config_file

pytestmark = pytest.mark.timeout(120)

PAYLOAD = 100


def _payload(i: int) -> bytes:
    return f"{i:06d}".encode().ljust(PAYLOAD, b".")


def _take(sub: RawClient, n: int, got: list[int], ack: bool) -> None:
    """Receive ``n`` PUBLISHes, recording their sequence numbers; PUBACK them if ``ack``."""
    for _ in range(n):
        p = sub.recv_type(C.Publish)
        assert p.qos == 1
        got.append(int(p.payload[:6]))
        if ack:
            sub.send(C.PubAck(p.packet_id))


@pytest.mark.parametrize("budget_msgs", [10, 0])
def test_behind_subscriber_gets_memory_and_store_gap_in_order(unimq_server, tmp_path, budget_msgs: int) -> None:
    budget = budget_msgs * (PAYLOAD + 256)  # adapters.mqtt.broker.MEM_ENTRY_OVERHEAD per entry
    cfg = config_file(tmp_path, f"mqtt_mem_queue_bytes = {budget}\nmqtt_max_inflight = 4\n")
    srv = unimq_server("--config", cfg)
    port = srv.ports["mqtt"]
    sub = RawClient(port)
    sub.connect("behind", clean=True)
    sub.send(C.Subscribe(1, [("bk/#", C.SubOptions(qos=1))]))
    assert sub.recv_type(C.Suback).reason_codes == [1]
    pub = Paho(port)
    for i in range(60):  # 4 go out, the budget keeps some, the rest is only in the store
        pub.publish("bk/a", _payload(i), qos=1)
    got: list[int] = []
    _take(sub, 4, got, ack=False)  # the window is full: nothing more comes until acks
    # acknowledge the first four (their packet ids were 1..4): four more leave memory,
    # which frees budget that the next publishes take while 14..59 wait in the store
    for pid in range(1, 5):
        sub.send(C.PubAck(pid))
    for i in range(60, 100):
        pub.publish("bk/b", _payload(i), qos=1)
    _take(sub, 96, got, ack=True)
    assert got == list(range(100))
    pub.publish("bk/c", _payload(100), qos=1)  # caught up: live delivery again
    _take(sub, 1, got, ack=True)
    assert got[-1] == 100
    sub.close()
    pub.disconnect()
