"""Large AMQP messages, as apps migrating from RabbitMQ send them (issue 14): a 100 MiB message
round trip with publisher confirms on the default settings' segment size, and a message over
the door's limit refused at its content header with RabbitMQ's answer (406 PRECONDITION_FAILED,
the channel closed), the connection and the next client served."""

from __future__ import annotations

import hashlib
import os

import pika
import pika.exceptions
import pytest

MiB = 1024 * 1024


@pytest.mark.timeout(300)
def test_100_mib_round_trip_with_confirms(unimq_server) -> None:  # type: ignore[no-untyped-def]
    # the store's default segment (1 GiB): the test-sized one would cap messages at half of it
    srv = unimq_server("--set", f"store.commitlog_segment_size={1 << 30}")
    body = os.urandom(100 * MiB)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", srv.ports["amqp"],
                                                             blocked_connection_timeout=120))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("big", durable=True)
    ch.basic_publish("", "big", body, pika.BasicProperties(delivery_mode=2), mandatory=True)  # raises on nack
    method, _, got = ch.basic_get("big", auto_ack=False)
    assert method is not None and len(got) == len(body)
    assert hashlib.sha256(got).digest() == hashlib.sha256(body).digest()
    ch.basic_ack(method.delivery_tag)
    conn.close()


@pytest.mark.timeout(120)
def test_over_the_limit_refused_at_the_header_and_next_client_served(unimq_server) -> None:  # type: ignore[no-untyped-def]
    srv = unimq_server("--set", "amqp_max_message_size=1048576")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", srv.ports["amqp"]))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("capped")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.basic_publish("", "capped", b"x" * (2 * MiB))
    assert ei.value.reply_code == 406 and "larger than configured max size 1048576" in ei.value.reply_text
    ch2 = conn.channel()  # the connection survives: only that channel was closed
    ch2.confirm_delivery()
    ch2.basic_publish("", "capped", b"y" * MiB)  # at the limit: fine
    assert ch2.queue_declare("capped", passive=True).method.message_count == 1
    conn.close()
    other = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", srv.ports["amqp"]))
    assert other.channel().queue_declare("capped", passive=True).method.message_count == 1
    other.close()
