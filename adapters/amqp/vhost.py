"""One AMQP virtual host: its exchanges and queues, and routing a publish to queues.

Why its own module: the vhost is the namespace every method of a connection
works in (after Connection.Open) and the unit routing caches depend on
(``version`` moves on every change of exchanges, bindings or queues).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .mapping import unified_topic
from .routing import PREDECLARED, Exchange, route

if TYPE_CHECKING:
    from .queue_state import QueueState

__all__ = ["VHost"]


class VHost:
    """A vhost's exchanges (the predeclared ones first) and queues."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, QueueState] = {}
        self._topics: dict[tuple[str, str], tuple[str, str | None]] = {}
        # bumped by every change of exchanges, bindings or queues: routing caches built
        # over this vhost (the cross-door amq.topic routes) drop their entries on a change
        self.version = 0
        for ex_name, ex_type in PREDECLARED:
            self.exchanges[ex_name] = Exchange(ex_name, ex_type, durable=True)

    def unified_topic(self, exchange: str, routing_key: str) -> tuple[str, str | None]:
        key = (exchange, routing_key)
        t = self._topics.get(key)
        if t is None:
            if len(self._topics) > 65536:
                self._topics.clear()
            t = self._topics[key] = unified_topic(self.name, exchange, routing_key)
        return t

    def route(self, exchange: str, routing_key: str, headers: dict[str, Any] | None) -> list[QueueState]:
        if exchange == "":  # the default exchange: the queue named by the routing key (the hot path)
            q = self.queues.get(routing_key)
            return q.solo if q is not None else []
        names = route(self.exchanges, exchange, routing_key, headers, self.queues.__contains__)
        qs = self.queues
        return [qs[n] for n in names if n in qs]
