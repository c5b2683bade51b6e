"""Queries by message id and by key, local and (with the tier on) in the tier.

Why a mixin of the broker: the answers combine the store's index, the tier's keys
objects and the broker's rule that delay and transactional messages are found under the
topic they are for, not the system queue that holds them; the broker exposes them, and
the broker module would otherwise grow past what one reader takes in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from .errors import BadRequestError
from .message_store import MessageStore
from .model import StoredMessage
from .system_topics import HALF_TOPIC, P_REAL_TOPIC, TIMER_TOPIC, public_properties

if TYPE_CHECKING:
    from .tier import TierService


class MessageQueries:
    store: MessageStore
    tier: "TierService | None"

    async def query_by_id_async(self, message_id: str) -> StoredMessage | None:
        """:meth:`query_by_id`, with server-assigned ids of messages only the tier holds found
        there too (what the doors call)."""
        m = self.query_by_id(message_id)
        if m is None and self.tier is not None:
            m = self._public(await self.tier.query_by_id_async(message_id))
        return m

    def query_by_id(self, message_id: str) -> StoredMessage | None:
        return self._public(self.store.query_by_id(message_id))

    @staticmethod
    def _public(m: StoredMessage | None) -> StoredMessage | None:
        """A message as a query answers it: under the topic it is for, internal properties off."""
        if m is not None:
            m.topic = m.properties.get(P_REAL_TOPIC, m.topic)  # still waiting in the timer/half queue
            m.properties = public_properties(m.properties)
        return m

    def query_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**62,
                     max_count: int = 32) -> list[StoredMessage]:
        """Messages by key on local disk (:meth:`query_by_key_async` adds the tier's)."""
        if self.store.is_batch_topic(topic):  # keys inside a batch record are never indexed
            raise BadRequestError(f"topic {topic!r} is a batch topic: its messages' keys are kept but not "
                                  "indexed, so it cannot be searched by key (read it by offset)")
        return self._by_key(self.store.query_by_key, topic, key, begin_ms, end_ms, max_count)

    async def query_by_key_async(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = 2**62,
                                 max_count: int = 32) -> list[StoredMessage]:
        """:meth:`query_by_key`, with messages whose segments only the tier still holds found
        there too, older after newer (what the doors call)."""
        out = self.query_by_key(topic, key, begin_ms, end_ms, max_count)
        if len(out) < max_count and self.tier is not None:
            cold = await self.tier.query_by_key_async(topic, key, begin_ms, end_ms, 4 * max_count)
            cold += [m for t in (TIMER_TOPIC, HALF_TOPIC)
                     for m in await self.tier.query_by_key_async(t, key, begin_ms, end_ms, 4 * max_count)]
            out += self._by_key(lambda t, *a: [m for m in cold if m.topic == t], topic, key, begin_ms, end_ms,
                                max_count - len(out))
        return out

    @staticmethod
    def _by_key(query: Callable[..., list[StoredMessage]], topic: str, key: str, begin_ms: int, end_ms: int,
                max_count: int) -> list[StoredMessage]:
        out = query(topic, key, begin_ms, end_ms, max_count)
        # Delay and transactional messages are stored once, in the timer / half queue, and
        # indexed there (their delivery is a link, which is not indexed): find them under
        # the topic they are for, as query_by_id does.
        for sys_topic in (TIMER_TOPIC, HALF_TOPIC):
            if len(out) >= max_count:
                break
            for m in query(sys_topic, key, begin_ms, end_ms, 4 * max_count):
                if m.properties.get(P_REAL_TOPIC) == topic:
                    m.topic = topic
                    out.append(m)
        out = out[:max_count]
        for m in out:
            m.properties = public_properties(m.properties)
        return out
