"""adapters.amqp.routing: RabbitMQ's exchange semantics, checked without a server.

Why direct: the end-to-end tests route a few publishes through a client; the
matching rules themselves (topic wildcards, headers x-match modes, exchange to
exchange bindings with cycles, alternate exchanges, the default exchange) are
a pure function of the bindings and are checked here case by case.
"""

from __future__ import annotations

from typing import Any

import pytest

from adapters.amqp.routing import (
    DIRECT,
    FANOUT,
    HEADERS,
    PREDECLARED,
    TOPIC,
    Binding,
    Exchange,
    headers_match,
    route,
    topic_matcher,
)


@pytest.mark.parametrize("key, routing_key, hit", [
    ("a.b.c", "a.b.c", True),
    ("a.b.c", "a.b", False),
    ("a.*.c", "a.x.c", True),
    ("a.*.c", "a.c", False),
    ("a.*", "a.b.c", False),
    ("a.#", "a", True),
    ("a.#", "a.b.c", True),
    ("#.c", "c", True),
    ("#.c", "a.b.c", True),
    ("#.c", "a.b.d", False),
    ("a.#.c", "a.c", True),
    ("a.#.c", "a.x.y.c", True),
    ("*.#", "", True),  # "" is one (empty) word
    ("#", "anything.at.all", True),
    ("#.#", "a.b", True),
    ("*", "a.b", False),
])
def test_topic_binding_keys(key: str, routing_key: str, hit: bool) -> None:
    assert topic_matcher(key)(routing_key) is hit


def test_headers_match_modes() -> None:
    h = {"format": "pdf", "type": "report", "x-tag": "1"}
    assert headers_match({"x-match": "all", "format": "pdf", "type": "report"}, h)
    assert not headers_match({"x-match": "all", "format": "pdf", "type": "log"}, h)
    assert headers_match({"x-match": "any", "format": "zip", "type": "report"}, h)
    assert not headers_match({"x-match": "any", "format": "zip"}, h)
    assert headers_match({"format": "pdf"}, h)  # all by default
    assert headers_match({"x-match": b"any", "type": "report"}, h)  # the mode as bytes (longstr)
    # x- arguments are compared only in the -with-x modes
    assert headers_match({"x-match": "all", "x-tag": "2"}, h)
    assert not headers_match({"x-match": "all-with-x", "x-tag": "2"}, h)
    assert headers_match({"x-match": "any-with-x", "x-tag": "1", "format": "zip"}, h)
    assert headers_match({"x-match": "all", "format": None}, h)  # void: presence only
    assert not headers_match({"x-match": "all", "missing": None}, h)
    assert headers_match({"x-match": "all"}, None)  # nothing to check
    assert not headers_match({"x-match": "any"}, None)


def _exchanges(*defs: tuple[str, str, dict[str, Any]]) -> dict[str, Exchange]:
    exs = {name: Exchange(name, kind) for name, kind in PREDECLARED}
    for name, kind, args in defs:
        exs[name] = Exchange(name, kind, arguments=args)
    return exs


def _bind(exs: dict[str, Exchange], src: str, dest: str, key: str = "", to_exchange: bool = False,
          args: dict[str, Any] | None = None) -> Binding:
    b = Binding(src, dest, to_exchange, key, repr(sorted((args or {}).items())))
    assert exs[src].add(b, args or {})
    return b


def test_direct_fanout_topic_headers_and_the_default_exchange() -> None:
    exs = _exchanges(("logs", FANOUT, {}), ("hdr", HEADERS, {}))
    queues = {"q1", "q2", "q3"}
    _bind(exs, "amq.direct", "q1", "red")
    _bind(exs, "amq.direct", "q2", "red")
    _bind(exs, "amq.direct", "q3", "blue")
    _bind(exs, "logs", "q1")
    _bind(exs, "logs", "q3")
    _bind(exs, "amq.topic", "q2", "stock.*.nyse")
    _bind(exs, "hdr", "q3", args={"x-match": "any", "k": "v"})
    r = route
    assert r(exs, "amq.direct", "red", None, queues.__contains__) == {"q1", "q2"}
    assert r(exs, "amq.direct", "green", None, queues.__contains__) == set()
    assert r(exs, "logs", "ignored", None, queues.__contains__) == {"q1", "q3"}
    assert r(exs, "amq.topic", "stock.ibm.nyse", None, queues.__contains__) == {"q2"}
    assert r(exs, "hdr", "", {"k": "v"}, queues.__contains__) == {"q3"}
    assert r(exs, "", "q2", None, queues.__contains__) == {"q2"}  # the queue named by the key
    assert r(exs, "", "nope", None, queues.__contains__) == set()
    assert r(exs, "missing", "red", None, queues.__contains__) == set()


def test_exchange_to_exchange_bindings_cycles_and_alternates() -> None:
    exs = _exchanges(("a", DIRECT, {"alternate-exchange": "unrouted"}), ("b", TOPIC, {}), ("unrouted", FANOUT, {}))
    _bind(exs, "a", "b", "k", to_exchange=True)
    _bind(exs, "b", "a", "#", to_exchange=True)  # a cycle: each exchange is visited once
    _bind(exs, "b", "qb", "k")
    _bind(exs, "unrouted", "lost")
    assert route(exs, "a", "k", None, lambda _n: True) == {"qb"}
    assert route(exs, "a", "other", None, lambda _n: True) == {"lost"}  # nothing matched: the alternate
    assert exs["a"].alternate == "unrouted" and exs["b"].alternate is None


def test_bindings_are_added_once_and_removed() -> None:
    exs = _exchanges()
    topic = exs["amq.topic"]
    b = _bind(exs, "amq.topic", "q", "a.*")
    assert not topic.add(b, {})  # the same binding again
    assert list(topic.match("a.b", None)) == [b]
    assert topic.remove(b) and not topic.remove(b)
    assert list(topic.match("a.b", None)) == []  # the per-key cache was dropped with it
    direct = exs["amq.direct"]
    d = _bind(exs, "amq.direct", "q", "k")
    assert direct.remove(d) and "k" not in direct._direct


def test_redeclare_equivalence() -> None:
    ex = Exchange("e", DIRECT, durable=True, arguments={"alternate-exchange": "ae"})
    assert ex.equivalent(DIRECT, True, False, False, {"alternate-exchange": "ae"}) is None
    assert ex.equivalent(TOPIC, True, False, False, {}) == "type 'topic' but current is 'direct'"
    assert ex.equivalent(DIRECT, False, False, False, {"alternate-exchange": "ae"}).startswith("durable")
    assert ex.equivalent(DIRECT, True, False, False, {}) == "argument 'alternate-exchange' differs"
