"""A queue's ready messages in LMQ offset order; with ``x-max-priority``, one such order per priority.

Why: RabbitMQ hands out a queue's messages in the order they were enqueued and
puts a requeued message back at its original position; an ``x-max-priority``
queue hands out the highest priority first. Both are offset-ordered deques of
:class:`~adapters.amqp.lease.Lease` (one, or one per level), with released
leases merged back in place.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .lease import Lease

__all__ = ["PriorityBuffer", "merge_back", "offset_of"]


def offset_of(lease: Lease) -> int:
    """Sort key: a lease's LMQ offset (a queue's ready messages are kept in this order)."""
    return lease.offset


def merge_back(d: "deque[Lease]", back: list[Lease]) -> None:
    """Put leases (sorted by offset) back into an offset-ordered deque, in place."""
    if not d or back[-1].offset <= d[0].offset:
        d.extendleft(reversed(back))
    else:  # in place: a pump iterating the deque keeps its reference
        merged = list(heapq.merge(back, d, key=offset_of))
        d.clear()
        d.extend(merged)


class PriorityBuffer:
    """The ready messages of an ``x-max-priority`` queue: highest priority first, then LMQ offset.

    One offset-ordered deque per priority level, with the subset of the deque
    interface the queue's code uses (``popleft``, ``append``, ``[0]``, ``len``).
    """

    def __init__(self, max_priority: int) -> None:
        self.levels: list[deque[Lease]] = [deque() for _ in range(max_priority + 1)]
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def _top(self) -> "deque[Lease]":
        for d in reversed(self.levels):
            if d:
                return d
        raise IndexError("empty buffer")

    def __getitem__(self, i: int) -> Lease:
        if i != 0:
            raise IndexError("only the head of a priority buffer is addressable")
        return self._top()[0]

    def popleft(self) -> Lease:
        lease = self._top().popleft()
        self.n -= 1
        return lease

    def append(self, lease: Lease) -> None:
        self.levels[lease.priority].append(lease)
        self.n += 1

    def clear(self) -> None:
        for d in self.levels:
            d.clear()
        self.n = 0

    def merge_back(self, back: list[Lease]) -> None:
        for level, d in enumerate(self.levels):
            mine = [x for x in back if x.priority == level]
            if mine:
                merge_back(d, mine)
        self.n += len(back)
