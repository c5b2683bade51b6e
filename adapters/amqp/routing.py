"""Exchanges, bindings and publish-time routing (RabbitMQ's semantics, no I/O).

Why routing lives in the door and happens at publish: unimq stores a message
once and indexes it into every queue it reaches (multi-dispatch), so the set
of AMQP queues a publish reaches must be known when it is stored. This
module answers exactly that: given an exchange, a routing key and headers,
which queues (following exchange-to-exchange bindings and alternate
exchanges, without looping) receive the message.

Matching: direct exchanges index bindings by key (a dict lookup); fanout
takes all; topic exchanges compile each binding key (``*`` one word, ``#``
zero or more words) once and cache the result per routing key until the
bindings change; headers exchanges evaluate ``x-match`` all/any (and
RabbitMQ 3.10's ``all-with-x`` / ``any-with-x``) per publish.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

DIRECT, FANOUT, TOPIC, HEADERS = "direct", "fanout", "topic", "headers"
EXCHANGE_TYPES = (DIRECT, FANOUT, TOPIC, HEADERS)

# Predeclared in every vhost, like RabbitMQ (the default exchange is "").
PREDECLARED: tuple[tuple[str, str], ...] = (
    ("", DIRECT),
    ("amq.direct", DIRECT),
    ("amq.fanout", FANOUT),
    ("amq.topic", TOPIC),
    ("amq.headers", HEADERS),
    ("amq.match", HEADERS),
)

_TOPIC_CACHE_MAX = 4096


@dataclass(frozen=True)
class Binding:
    """source exchange --routing_key/arguments--> destination (a queue, or an exchange when ``to_exchange``)."""

    source: str
    destination: str
    to_exchange: bool
    routing_key: str
    arguments_key: str = ""  # canonical rendering of the arguments (identity of the binding)

    @property
    def kind(self) -> str:
        return "e" if self.to_exchange else "q"


def topic_matcher(binding_key: str) -> Any:
    """A predicate over routing keys for an AMQP topic binding key (``*`` one word, ``#`` zero or more)."""
    pat = binding_key.split(".")
    if "#" not in pat and "*" not in pat:
        return binding_key.__eq__
    if pat == ["#"]:
        return lambda _rk: True

    def match(routing_key: str) -> bool:
        words = routing_key.split(".")
        # states: set of pattern positions reachable after consuming the words so far
        n = len(pat)

        def close(states: set[int]) -> set[int]:
            out = set(states)
            todo = list(states)
            while todo:
                i = todo.pop()
                if i < n and pat[i] == "#" and i + 1 not in out:
                    out.add(i + 1)  # '#' may match zero words
                    todo.append(i + 1)
            return out

        states = close({0})
        for w in words:
            nxt: set[int] = set()
            for i in states:
                if i >= n:
                    continue
                p = pat[i]
                if p == "#":
                    nxt.add(i)
                elif p == "*" or p == w:
                    nxt.add(i + 1)
            if not nxt:
                return False
            states = close(nxt)
        return n in states

    return match


def headers_match(binding_args: dict[str, Any], headers: dict[str, Any] | None) -> bool:
    """RabbitMQ's headers-exchange match of a binding's arguments against message headers."""
    mode = binding_args.get("x-match", "all")
    if isinstance(mode, (bytes, bytearray)):
        mode = bytes(mode).decode("utf-8", "replace")
    if mode not in ("all", "any", "all-with-x", "any-with-x"):
        mode = "all"
    with_x = mode.endswith("-with-x")
    want_all = mode.startswith("all")
    headers = headers or {}
    checked = 0
    for k, v in binding_args.items():
        if k == "x-match" or (k.startswith("x-") and not with_x):
            continue
        checked += 1
        present = k in headers
        # a binding argument of type void matches on presence only
        ok = present and (v is None or headers[k] == v)
        if want_all and not ok:
            return False
        if not want_all and ok:
            return True
    return want_all  # all: every one matched (or none to check); any: none matched


@dataclass
class Exchange:
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    # bindings where this exchange is the source
    bindings: dict[Binding, dict[str, Any]] = field(default_factory=dict)  # binding -> arguments
    _direct: dict[str, set[Binding]] = field(default_factory=dict, repr=False)
    _topic: list[tuple[Any, Binding]] = field(default_factory=list, repr=False)
    _topic_cache: dict[str, list[Binding]] = field(default_factory=dict, repr=False)

    @property
    def alternate(self) -> str | None:
        ae = self.arguments.get("alternate-exchange")
        if isinstance(ae, (bytes, bytearray)):
            ae = bytes(ae).decode("utf-8", "replace")
        return ae if isinstance(ae, str) and ae else None

    def add(self, b: Binding, args: dict[str, Any]) -> bool:
        if b in self.bindings:
            return False
        self.bindings[b] = args
        if self.type == DIRECT:
            self._direct.setdefault(b.routing_key, set()).add(b)
        elif self.type == TOPIC:
            self._topic.append((topic_matcher(b.routing_key), b))
            self._topic_cache.clear()
        return True

    def remove(self, b: Binding) -> bool:
        if b not in self.bindings:
            return False
        del self.bindings[b]
        if self.type == DIRECT:
            s = self._direct.get(b.routing_key)
            if s is not None:
                s.discard(b)
                if not s:
                    del self._direct[b.routing_key]
        elif self.type == TOPIC:
            self._topic = [(r, x) for r, x in self._topic if x != b]
            self._topic_cache.clear()
        return True

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Iterable[Binding]:
        t = self.type
        if t == DIRECT:
            return self._direct.get(routing_key, ())
        if t == FANOUT:
            return self.bindings.keys()
        if t == TOPIC:
            hit = self._topic_cache.get(routing_key)
            if hit is None:
                hit = [b for r, b in self._topic if r(routing_key)]
                if len(self._topic_cache) >= _TOPIC_CACHE_MAX:
                    self._topic_cache.clear()
                self._topic_cache[routing_key] = hit
            return hit
        return [b for b, args in self.bindings.items() if headers_match(args, headers)]

    def equivalent(self, type_: str, durable: bool, auto_delete: bool, internal: bool,
                   arguments: dict[str, Any]) -> str | None:
        """None if a redeclare with these settings is equivalent, else what differs."""
        if type_ != self.type:
            return f"type '{type_}' but current is '{self.type}'"
        if durable != self.durable:
            return f"durable '{str(durable).lower()}' but current is '{str(self.durable).lower()}'"
        if auto_delete != self.auto_delete:
            return f"auto_delete '{str(auto_delete).lower()}' but current is '{str(self.auto_delete).lower()}'"
        if internal != self.internal:
            return f"internal '{str(internal).lower()}' but current is '{str(self.internal).lower()}'"
        if (arguments or {}).get("alternate-exchange") != self.arguments.get("alternate-exchange"):
            return "argument 'alternate-exchange' differs"
        return None


def route(exchanges: dict[str, Exchange], exchange: str, routing_key: str,
          headers: dict[str, Any] | None, queue_exists: Any) -> set[str]:
    """Names of the queues a publish to ``exchange`` reaches.

    ``queue_exists(name) -> bool`` serves the default exchange, which routes
    to the queue named by the routing key. Exchange-to-exchange bindings are
    followed once per exchange (cycles are harmless); an exchange that routes
    nowhere hands the message to its ``alternate-exchange`` if it has one.
    """
    out: set[str] = set()
    if exchange == "":
        if queue_exists(routing_key):
            out.add(routing_key)
        return out
    seen: set[str] = set()
    todo = [exchange]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        ex = exchanges.get(name)
        if ex is None:
            continue
        before = len(out)
        reached_exchange = False
        for b in ex.match(routing_key, headers):
            if b.to_exchange:
                todo.append(b.destination)
                reached_exchange = True
            else:
                out.add(b.destination)
        if len(out) == before and not reached_exchange and ex.alternate:
            todo.append(ex.alternate)
    return out
