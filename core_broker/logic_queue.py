"""Static topics: the map from a topic's logic queues onto chains of physical queues on brokers.

A static topic has a fixed number of *logic* queues, whatever the number of brokers, so
the queue a key (or FIFO message group) hashes to never changes. Each logic queue ``q``
is a chain of items, oldest first; an item says "logic offsets from ``logic_start`` are
physical queue ``q`` of ``broker`` from ``phys_start``", up to ``phys_end`` (exclusive)
once the item is closed, or open (``phys_end == OPEN``) for the last item, the leader:
the one broker that takes new messages of ``q``. Moving a logic queue to another broker
(a remap) closes the leader where its physical queue ends and opens a new item there,
whose ``logic_start`` is where the closed one ends: logic offsets go on growing, dense,
and no message is copied. Older offsets are read from the broker that stored them.

This is the shape of RocketMQ 5's static topics (``TopicQueueMappingDetail`` with its
``LogicQueueMappingItem`` list), written small: the physical queue id on every broker is
the logic queue id (a broker holding a logic queue twice, A -> B -> A, continues its own
physical queue: physical ranges of one broker never overlap), and the whole map, with an
epoch that grows with each change, is kept by every broker holding any part of the topic
and published with its routes. Sans-io: the broker fences writes with it and the gateway
translates reads with it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .errors import BadRequestError

OPEN = -1  # phys_end of the leader item: the physical queue is still written


class MappingItem(NamedTuple):
    broker: str
    logic_start: int
    phys_start: int
    phys_end: int = OPEN

    @property
    def open(self) -> bool:
        return self.phys_end == OPEN

    @property
    def logic_end(self) -> int | None:
        """Where the next item's logic offsets start (None while open)."""
        return None if self.phys_end == OPEN else self.logic_start + self.phys_end - self.phys_start

    def to_logic(self, phys: int) -> int:
        return self.logic_start + phys - self.phys_start

    def to_phys(self, logic: int) -> int:
        return self.phys_start + logic - self.logic_start


class QueueMapping:
    """Every logic queue's chain of items, and the epoch of this version of the map."""

    __slots__ = ("epoch", "queues")

    def __init__(self, epoch: int, queues: list[list[MappingItem]]) -> None:
        self.epoch = epoch
        self.queues = queues

    # ---------------------------------------------------------------- building

    @classmethod
    def initial(cls, n: int, brokers: list[str]) -> "QueueMapping":
        """``n`` logic queues over ``brokers`` as contiguous ranges (5 on 2: 0-2, 3-4)."""
        if not brokers:
            raise BadRequestError("a static topic needs at least one writable broker")
        k = min(len(brokers), n)
        owners: list[str] = []
        for rank, b in enumerate(brokers[:k]):
            owners += [b] * (n // k + (1 if rank < n % k else 0))
        return cls(1, [[MappingItem(b, 0, 0)] for b in owners])

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "QueueMapping":
        return cls(int(d["epoch"]), [[MappingItem(str(i[0]), int(i[1]), int(i[2]), int(i[3])) for i in chain]
                                     for chain in d["queues"]])

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "queues": [[list(i) for i in chain] for chain in self.queues]}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, QueueMapping) and other.to_json() == self.to_json()

    def __repr__(self) -> str:
        return f"QueueMapping({self.to_json()!r})"

    # ---------------------------------------------------------------- reading

    def __len__(self) -> int:
        return len(self.queues)

    def chain(self, q: int) -> list[MappingItem]:
        if not 0 <= q < len(self.queues):
            raise BadRequestError(f"the static topic has logic queues 0 to {len(self.queues) - 1}, not {q}")
        return self.queues[q]

    def leader(self, q: int) -> MappingItem | None:
        """The open item of ``q`` (None while a remap has closed it and not opened the next)."""
        last = self.chain(q)[-1]
        return last if last.open else None

    def last(self, q: int) -> MappingItem:
        return self.chain(q)[-1]

    def brokers(self) -> list[str]:
        """Every broker holding a part of the topic, sorted."""
        return sorted({i.broker for chain in self.queues for i in chain})

    def logic_min(self, q: int) -> int:
        return self.chain(q)[0].logic_start

    def locate(self, q: int, logic: int) -> tuple[int, MappingItem]:
        """The index and item holding logic offset ``logic`` of queue ``q``: the last item starting
        at or before it (an offset at an item's end belongs to the next one). An offset before the
        first item gives the first."""
        chain = self.chain(q)
        for idx in range(len(chain) - 1, -1, -1):
            if chain[idx].logic_start <= logic:
                return idx, chain[idx]
        return 0, chain[0]

    # ---------------------------------------------------------------- changing (each a new map)

    def _with(self, q: int, chain: list[MappingItem]) -> "QueueMapping":
        queues = [list(c) for c in self.queues]
        queues[q] = chain
        return QueueMapping(self.epoch + 1, queues)

    def sealed(self, q: int, phys_end: int) -> "QueueMapping":
        """``q``'s leader closed where its physical queue ends: no broker takes ``q`` until
        :meth:`extended` opens the next item."""
        lead = self.leader(q)
        if lead is None:
            raise BadRequestError(f"logic queue {q} is already sealed")
        if phys_end < lead.phys_start:
            raise BadRequestError(f"logic queue {q} cannot end at {phys_end}, before its start {lead.phys_start}")
        return self._with(q, self.chain(q)[:-1] + [lead._replace(phys_end=phys_end)])

    def extended(self, q: int, broker: str, phys_start: int) -> "QueueMapping":
        """A sealed ``q`` continued on ``broker``'s physical queue ``q`` from ``phys_start``."""
        last = self.last(q)
        if last.open:
            raise BadRequestError(f"logic queue {q} is open on {last.broker}: seal it first")
        item = MappingItem(broker, last.logic_end, phys_start)  # type: ignore[arg-type]
        return self._with(q, self.chain(q) + [item])

    def released(self, q: int, broker: str) -> "QueueMapping":
        """``q`` without its closed items on ``broker`` that come before every item elsewhere
        (scale-in: their offsets are no longer readable). Only a chain's oldest items can go:
        a read must never jump over a hole in the middle of the log."""
        chain = self.chain(q)
        n = 0
        while n < len(chain) - 1 and chain[n].broker == broker:
            n += 1
        if n == 0:
            raise BadRequestError(
                f"logic queue {q} has no closed item on {broker!r} at the head of its chain "
                "(release the older brokers first, or remap the queue away from this one)")
        return self._with(q, chain[n:])

    def items_on(self, broker: str) -> list[tuple[int, MappingItem]]:
        return [(q, i) for q, chain in enumerate(self.queues) for i in chain if i.broker == broker]
