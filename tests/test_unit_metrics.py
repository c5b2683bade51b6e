"""The processor's counters and their Prometheus text, read back with prometheus_client's parser."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import Metrics

pytestmark = pytest.mark.timeout(30)


def test_counters_by_operation_and_protocol() -> None:
    m = Metrics()
    m.inc("send", "mqtt")
    m.inc("send", "mqtt", 4)
    m.inc("send", "amqp", 2)
    m.inc("ack", "grpc")
    assert m.get("send", "mqtt") == 5
    assert m.get("send", "amqp") == 2
    assert m.get("send") == 7  # every protocol
    assert m.get("ack") == 1
    assert m.get("send", "http") == 0 and m.get("never") == 0


def test_reading_an_absent_counter_does_not_create_it() -> None:
    m = Metrics()
    m.get("send", "mqtt")
    assert m.render_prometheus() == "\n"


def test_topic_counters_are_kept_apart() -> None:
    m = Metrics()
    m.inc_topic("messages_in", "mqtt", "a/b")
    m.inc_topic("messages_in", "mqtt", "a/b", 3)
    m.inc_topic("messages_in", "amqp", "a/b")
    assert m.topic_counters == {("messages_in", "mqtt", "a/b"): 4, ("messages_in", "amqp", "a/b"): 1}
    assert m.get("messages_in") == 0  # not an operation counter


def test_the_rendering_is_valid_prometheus_text_with_every_counter() -> None:
    m = Metrics()
    m.inc("send", "mqtt", 3)
    m.inc("send", "amqp")
    m.inc("pop", "grpc", 7)
    text = m.render_prometheus()
    assert text.endswith("\n")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == {"unimq_send", "unimq_pop"}  # the parser drops the _total suffix
    assert all(f.type == "counter" for f in families.values())
    samples = {(s.name, s.labels["protocol"]): s.value for f in families.values() for s in f.samples}
    assert samples == {
        ("unimq_send_total", "mqtt"): 3.0,
        ("unimq_send_total", "amqp"): 1.0,
        ("unimq_pop_total", "grpc"): 7.0,
    }


def test_the_rendering_is_stable_sorted_by_name_then_protocol() -> None:
    m = Metrics()
    for name, proto in [("send", "mqtt"), ("ack", "http"), ("send", "amqp"), ("ack", "amqp")]:
        m.inc(name, proto)
    assert m.render_prometheus().splitlines() == [
        "# TYPE unimq_ack_total counter",
        'unimq_ack_total{protocol="amqp"} 1',
        'unimq_ack_total{protocol="http"} 1',
        "# TYPE unimq_send_total counter",
        'unimq_send_total{protocol="amqp"} 1',
        'unimq_send_total{protocol="mqtt"} 1',
    ]
