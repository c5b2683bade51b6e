"""AMQP door state that needs its own `unimq up` (conftest's ``unimq_server``): restart, leases, disk alarm.

Durable exchanges, queues and bindings and persistent messages must survive
a clean restart; transient (non-durable) queues and exchanges must not; an
unacked message comes back (redelivered) after the restart.
"""

from __future__ import annotations

import signal
import time

import pika
import pika.exceptions
import pytest
from pika.adapters.blocking_connection import BlockingChannel

pytestmark = pytest.mark.timeout(120)


# Test-sized segments and no free-space thresholds: the machine's disk is shared.
SMALL_STORE = "[store]\ncommitlog_segment_size = 67108864\ndisk_refuse_free_ratio = 0.0\ndisk_min_free_ratio = 0.0\n"


def _params(server) -> pika.ConnectionParameters:  # type: ignore[no-untyped-def]
    return pika.ConnectionParameters("127.0.0.1", server.ports["amqp"])


def _config(tmp_path, text: str = SMALL_STORE) -> str:  # type: ignore[no-untyped-def]
    """A config file with ``text``; returns its path for ``--config``."""
    cfg = tmp_path / "unimq.toml"
    cfg.write_text(text)
    return str(cfg)


def _connect(server) -> tuple[pika.BlockingConnection, BlockingChannel]:  # type: ignore[no-untyped-def]
    c = pika.BlockingConnection(_params(server))
    return c, c.channel()


def _first_run(unimq_server, tmp_path):  # type: ignore[no-untyped-def]
    """A server on a fresh data dir, a channel in confirm mode on it, and ``restart()``: a
    server started again on the same data dir and config."""
    data, cfg = tmp_path / "data", _config(tmp_path)
    server = unimq_server("--config", cfg, data_dir=data)
    c, ch = _connect(server)
    ch.confirm_delivery()
    return server, c, ch, lambda: unimq_server("--config", cfg, data_dir=data)


def test_durable_state_and_persistent_messages_survive_restart(unimq_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    s1, c, ch, restart = _first_run(unimq_server, tmp_path)
    ch.exchange_declare("orders", "topic", durable=True)
    ch.exchange_declare("audit", "fanout", durable=True)
    ch.exchange_bind(destination="audit", source="orders", routing_key="#")
    ch.queue_declare("orders.eu", durable=True, arguments={"x-dead-letter-exchange": "audit"})
    ch.queue_bind("orders.eu", "orders", "eu.*")
    ch.queue_declare("audit.log", durable=True)
    ch.queue_bind("audit.log", "audit")
    ch.exchange_declare("temp-ex", "direct", durable=False)
    ch.queue_declare("temp-q", durable=False)
    for i in range(3):
        ch.basic_publish("orders", "eu.new", f"order {i}".encode(), pika.BasicProperties(delivery_mode=2))
    m, _, body = ch.basic_get("orders.eu")  # held unacked across the restart
    assert body == b"order 0"
    c.close()  # closing requeues it
    assert s1.stop(signal.SIGTERM) == 0

    s2 = restart()
    c, ch = _connect(s2)
    assert ch.queue_declare("orders.eu", passive=True).method.message_count == 3
    assert ch.queue_declare("audit.log", passive=True).method.message_count == 3
    ch.exchange_declare("orders", "topic", passive=True)
    for name, kind in (("temp-q", "queue"), ("temp-ex", "exchange")):
        ch2 = c.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
            if kind == "queue":
                ch2.queue_declare(name, passive=True)
            else:
                ch2.exchange_declare(name, "direct", passive=True)
        assert ei.value.reply_code == 404
    got = []
    for method, props, body in ch.consume("orders.eu", inactivity_timeout=10):
        assert method is not None, got
        got.append((body, method.redelivered))
        ch.basic_ack(method.delivery_tag)
        if len(got) == 3:
            break
    ch.cancel()
    assert sorted(b for b, _ in got) == [b"order 0", b"order 1", b"order 2"]
    assert dict(got)[b"order 0"] is True
    # bindings survived too: a new publish still routes through orders -> audit
    ch.basic_publish("orders", "eu.more", b"after restart")
    for method, props, body in ch.consume("orders.eu", inactivity_timeout=10):
        assert body == b"after restart"
        ch.basic_ack(method.delivery_tag)
        break
    ch.cancel()
    assert ch.queue_declare("audit.log", passive=True).method.message_count == 4
    c.close()
    assert s2.stop(signal.SIGTERM) == 0


def test_out_of_order_acks_and_purge_survive_restart(unimq_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A durable queue's cursor: acked messages never come back, unacked ones do (redelivered)."""
    s1, c, ch, restart = _first_run(unimq_server, tmp_path)
    ch.queue_declare("jobs", durable=True)
    ch.queue_declare("purged", durable=True)
    for i in range(6):
        ch.basic_publish("", "jobs", f"j{i}".encode(), pika.BasicProperties(delivery_mode=2))
    for i in range(3):
        ch.basic_publish("", "purged", f"p{i}".encode(), pika.BasicProperties(delivery_mode=2))
    ch.queue_purge("purged")
    ch.basic_publish("", "purged", b"kept", pika.BasicProperties(delivery_mode=2))
    held = {}
    for _ in range(6):
        m, _, body = ch.basic_get("jobs")
        held[body] = m.delivery_tag
    for b in (b"j1", b"j3", b"j4"):  # out of order; j0, j2, j5 stay unacked
        ch.basic_ack(held[b])
    assert ch.queue_declare("jobs", passive=True).method.message_count == 0
    c.close()
    assert s1.stop(signal.SIGTERM) == 0

    s2 = restart()
    c, ch = _connect(s2)
    assert ch.queue_declare("jobs", passive=True).method.message_count == 3
    assert ch.queue_declare("purged", passive=True).method.message_count == 1
    got = []
    while True:
        m, _, body = ch.basic_get("jobs", auto_ack=True)
        if m is None:
            break
        got.append((body, m.redelivered))
    assert got == [(b"j0", True), (b"j2", True), (b"j5", True)]
    m, _, body = ch.basic_get("purged", auto_ack=True)
    assert body == b"kept" and m.redelivered is False
    assert ch.basic_get("purged") == (None, None, None)
    c.close()
    assert s2.stop(signal.SIGTERM) == 0


def test_unacked_lease_is_renewed_and_not_redelivered(unimq_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A message held unacked for long is neither redelivered to others nor lost (the door holds it
    itself; ``amqp_lease_ms``, kept so old configs load, no longer limits it)."""
    s = unimq_server("--config", _config(tmp_path, "amqp_lease_ms = 1000\n" + SMALL_STORE))
    c, ch = _connect(s)
    ch.queue_declare("held")
    ch.basic_publish("", "held", b"slow job")
    m, _, body = ch.basic_get("held")
    assert body == b"slow job"
    other = pika.BlockingConnection(_params(s))
    och = other.channel()
    deadline = time.monotonic() + 3.0  # three leases
    while time.monotonic() < deadline:
        assert och.basic_get("held") == (None, None, None)
        other.process_data_events(time_limit=0.2)
    ch.basic_ack(m.delivery_tag)
    assert ch.queue_declare("held", passive=True).method.message_count == 0
    other.close()
    c.close()


def test_connection_blocked_when_disk_low(unimq_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Under [store] disk_refuse_free_ratio the door tells publishers Connection.Blocked."""
    s = unimq_server("--config", _config(tmp_path, "[store]\ndisk_refuse_free_ratio = 0.999999\n"
                                               "disk_min_free_ratio = 0.999999\ncommitlog_segment_size = 67108864\n"))
    c = pika.BlockingConnection(_params(s))
    blocked = []
    c.add_on_connection_blocked_callback(lambda conn, frame: blocked.append(frame.method.reason))
    deadline = time.monotonic() + 10
    while not blocked and time.monotonic() < deadline:
        c.process_data_events(time_limit=0.2)
    assert blocked == ["low on disk"]
    c.close()
