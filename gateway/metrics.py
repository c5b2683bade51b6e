"""Processor metrics: counters by operation and protocol, rendered for Prometheus.

Kept in the processor (not the adapters) so every door is counted the same
way; the HTTP door serves the text at ``/metrics``.
"""

from __future__ import annotations

from collections import defaultdict


class Metrics:
    def __init__(self) -> None:
        self.counters: dict[tuple[str, str], int] = defaultdict(int)
        # (name, protocol, topic) -> n: messages in/out per door and topic (the HTTP door's /metrics)
        self.topic_counters: dict[tuple[str, str, str], int] = defaultdict(int)

    def inc_topic(self, name: str, protocol: str, topic: str, n: int = 1) -> None:
        self.topic_counters[(name, protocol, topic)] += n

    def count_in(self, protocol: str, topic: str, n: int, nbytes: int) -> None:
        """``n`` messages of ``nbytes`` body bytes sent to ``topic`` through ``protocol``'s door
        (one call for the four counters: every send of every door counts here)."""
        c, tc = self.counters, self.topic_counters
        c[("messages_in", protocol)] += n
        c[("bytes_in", protocol)] += nbytes
        tc[("messages_in", protocol, topic)] += n
        tc[("bytes_in", protocol, topic)] += nbytes

    def count_out(self, protocol: str, topic: str, n: int, nbytes: int) -> None:
        """``n`` messages of ``nbytes`` body bytes delivered from ``topic`` through ``protocol``'s door."""
        c, tc = self.counters, self.topic_counters
        c[("messages_out", protocol)] += n
        c[("bytes_out", protocol)] += nbytes
        tc[("messages_out", protocol, topic)] += n
        tc[("bytes_out", protocol, topic)] += nbytes

    def inc(self, name: str, protocol: str, n: int = 1) -> None:
        self.counters[(name, protocol)] += n

    def get(self, name: str, protocol: str | None = None) -> int:
        if protocol is not None:
            return self.counters.get((name, protocol), 0)
        return sum(v for (n, _), v in self.counters.items() if n == name)

    def render_prometheus(self) -> str:
        lines = []
        names = sorted({n for n, _ in self.counters})
        for n in names:
            lines.append(f"# TYPE unimq_{n}_total counter")
            for (name, proto), v in sorted(self.counters.items()):
                if name == n:
                    lines.append(f'unimq_{n}_total{{protocol="{proto}"}} {v}')
        return "\n".join(lines) + "\n"
