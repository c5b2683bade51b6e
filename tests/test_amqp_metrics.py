"""The AMQP door's deliveries in ``/metrics`` (issue 14: "/metrics counts only HTTP pop and pull").

A real `unimq up`, pika consuming (push) and basic.get, and ``/metrics`` read with httpx.
Deliveries from memory are counted by the door per run of deliveries, read-backs by the
processor's pull; together they are every message sent to a consumer.
"""

from __future__ import annotations

import re
import time

import httpx
import pika
import pytest

from tests.test_amqp_e2e import Server, consume_n, params, server, uniq  # noqa: F401  (module fixture)

pytestmark = pytest.mark.timeout(60)


def amqp_out(http_port: int) -> int:
    text = httpx.get(f"http://127.0.0.1:{http_port}/metrics", timeout=10).text
    return sum(int(float(m[1])) for m in
               re.finditer(r'^unimq_messages_out_total\{protocol="amqp",topic="[^"]*"\} (\S+)$', text, re.M))


def test_amqp_deliveries_are_counted_as_messages_out(server: Server) -> None:  # noqa: F811
    http = server.ports["http"]
    before = amqp_out(http)
    c = pika.BlockingConnection(params(server))
    ch = c.channel()
    q = uniq("met")
    ch.queue_declare(q)
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    assert len(consume_n(ch, q, 5)) == 5
    for i in range(2):
        ch.basic_publish("", q, b"%d" % i)
    got = [ch.basic_get(q, auto_ack=True)[2] for _ in range(2)]
    assert all(got)
    deadline = time.monotonic() + 10
    while amqp_out(http) - before < 7 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert amqp_out(http) - before == 7
    c.close()
