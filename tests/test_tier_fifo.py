"""FIFO redelivery in place of messages whose segment left local disk while in flight (issue 17).

A FIFO topic's unacked message comes back in place after its invisible time (its
message group waits for it), and the group's next messages wait parked behind it.
Here a real `unimq up` (HTTP door, 64 KiB segments, local retention of about a
second, the tier on a real S3-compatible server on 127.0.0.1) pops a FIFO topic over
HTTP and leaves one message unacked; more writes roll the segment, it is uploaded and
deleted locally while that message is in flight and its group's next ones are parked.
Popping again must give the same message again (attempt 2, byte for byte), then the
parked ones in order, each read from the tier: none is skipped or lost.
"""

from __future__ import annotations

import base64
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tier_helpers import S3Server, aws_credentials, s3, tier_up_sets, wait_for  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("aws_credentials")]


def test_fifo_message_in_flight_when_its_segment_left_is_redelivered_in_place(unimq_server, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    srv = unimq_server(*tier_up_sets(s3, bucket))
    first_segment = Path(srv.data_dir) / "commitlog" / f"{0:020d}"
    sent = {g: [b"%s%d-" % (g.encode(), i) + os.urandom(300) for i in range(3)] for g in ("a", "b")}
    pop_url = "/v1/topics/orders/groups/workers/pop"
    ack_url = "/v1/topics/orders/groups/workers/ack"
    with httpx.Client(base_url=srv.url("http", ""), timeout=30) as c:
        assert c.post("/v1/topics", json={"name": "orders", "queues": 1, "type": "FIFO"}).status_code == 201
        assert c.post("/v1/topics", json={"name": "filler", "queues": 1}).status_code == 201
        for i in range(3):
            for g in ("a", "b"):
                r = c.post(f"/v1/topics/orders/messages?message_group={g}", content=sent[g][i])
                assert r.status_code in (200, 201), r.text
                assert int(r.json()["message_id"][-16:], 16) < 65536  # all in the first segment

        first = c.post(pop_url, params={"max": 32, "invisible_s": 2}).json()["messages"]
        assert sorted(base64.b64decode(m["body_base64"]) for m in first) == sorted([sent["a"][0], sent["b"][0]])
        b0 = next(m for m in first if m["message_group"] == "b")
        assert c.post(ack_url, json={"receipt_handles": [b0["receipt_handle"]]}).json()["acked"] == 1
        # a0 stays in flight, a1, a2, b1, b2 parked; their segment is sealed, uploaded, retired
        for _ in range(140):
            c.post("/v1/topics/filler/messages", content=os.urandom(1000))
        wait_for(lambda: not first_segment.exists(), timeout=60)

        got: dict[str, list[tuple[bytes, int]]] = {"a": [], "b": []}
        deadline = time.monotonic() + 40
        while len(got["a"]) + len(got["b"]) < 5 and time.monotonic() < deadline:
            msgs = c.post(pop_url, params={"max": 32, "invisible_s": 30, "wait_s": 1}).json()["messages"]
            for m in msgs:
                got[m["message_group"]].append((base64.b64decode(m["body_base64"]), m["delivery_attempt"]))
            if msgs:
                assert c.post(ack_url, json={"receipt_handles": [m["receipt_handle"] for m in msgs]}).json()[
                    "acked"] == len(msgs)
        # in place: a0 again (its second delivery) before a1 and a2; b's parked ones in order
        assert got["a"] == [(sent["a"][0], 2), (sent["a"][1], 1), (sent["a"][2], 1)]
        assert got["b"] == [(sent["b"][1], 1), (sent["b"][2], 1)]
        assert c.post(pop_url, params={"max": 32}).json()["messages"] == []  # nothing twice
    assert srv.stop(signal.SIGTERM) == 0, srv.stderr()
