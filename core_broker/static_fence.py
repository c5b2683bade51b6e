"""A broker's side of static topics: which logic queues it may write, and sealing one for a remap.

A static topic's logic queue is written by exactly one broker, its leader in the topic's
map (``logic_queue.py``). The broker enforces it: a send for a logic queue it does not
lead is refused with :class:`QueueMovedError` before anything is stored (the gateway asks
the routes again and sends to the new leader), and a remap starts by *sealing* the queue
here: in one event-loop turn, with no put in between (puts assign queue offsets
synchronously on the loop), the map's leader item is closed where the physical queue
ends. So no message can land after the end a remap recorded, whatever gateway sent it.

Send answers carry logic offsets: the broker leads the queue, so its map translates.
Delay and transaction messages are refused on static topics: they are written later,
by the timer or the commit, possibly after the queue moved away.
"""

from __future__ import annotations

from typing import Sequence

from .errors import BadRequestError, QueueMovedError
from .logic_queue import MappingItem, QueueMapping
from .model import Message, PutResult
from .topic_config import TopicConfig


class StaticFence:
    def __init__(self, broker: str) -> None:
        self.broker = broker
        self.maps: dict[str, QueueMapping] = {}  # static topic -> its map, as this broker holds it

    def reload(self, topics: Sequence[TopicConfig]) -> None:
        self.maps = {t.name: QueueMapping.from_json(t.mapping) for t in topics if t.mapping is not None}

    def check(self, msgs: Sequence[Message], transactional: bool) -> list[MappingItem | None] | None:
        """Raise unless this broker leads every static message's logic queue; the leader item of
        each message (None for a non-static one), or None when no message is static. Taken before
        the put: a seal may come while the put waits to be durable."""
        maps = self.maps
        leads: list[MappingItem | None] = []
        static = False
        for m in msgs:
            mp = maps.get(m.topic)
            if mp is None:
                leads.append(None)
                continue
            static = True
            if transactional or m.delivery_time_ms:
                raise BadRequestError(
                    f"topic {m.topic!r} is static: delay and transaction messages are not taken")
            lead = mp.leader(m.queue_id)
            if lead is None or lead.broker != self.broker:
                raise QueueMovedError(
                    f"logic queue {m.queue_id} of {m.topic!r} is written on "
                    f"{'no broker (a remap is under way)' if lead is None else lead.broker}, not {self.broker}",
                    epoch=mp.epoch)
            leads.append(lead)
        return leads if static else None

    @staticmethod
    def to_logic(leads: list[MappingItem | None], put: list[tuple[PutResult, str | None]]) -> list:
        """``put``'s queue offsets as logic offsets (the physical ones for non-static messages)."""
        return [(r if lead is None else r._replace(queue_offset=lead.to_logic(r.queue_offset)), tid)
                for lead, (r, tid) in zip(leads, put)]

    def seal(self, tc: TopicConfig, queue_id: int, phys_end: int, epoch: int) -> TopicConfig | None:
        """``tc`` with ``queue_id`` closed at ``phys_end`` (this broker's physical end), or None when it
        already is (a remap asked again). ``epoch``: the map the remap read; a newer one here refuses."""
        if tc.mapping is None:
            raise BadRequestError(f"topic {tc.name!r} is not static")
        mp = QueueMapping.from_json(tc.mapping)
        if mp.epoch > epoch:
            last = mp.last(queue_id)
            if not last.open and last.broker == self.broker and mp.epoch == epoch + 1:
                return None  # sealed by this remap already
            raise BadRequestError(f"the map of {tc.name!r} changed (epoch {mp.epoch}, not {epoch}): read it again")
        lead = mp.leader(queue_id)
        if lead is None or lead.broker != self.broker:
            raise QueueMovedError(f"logic queue {queue_id} of {tc.name!r} is not led by {self.broker}")
        sealed = mp.sealed(queue_id, phys_end)
        return TopicConfig(tc.name, queues=tc.queues, message_type=tc.message_type, perm=tc.perm, system=tc.system,
                           attributes=dict(tc.attributes), queue_base=tc.queue_base, mapping=sealed.to_json())
