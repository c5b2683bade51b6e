"""Pops of messages only the tier holds: reads done off the event loop before a pop.

Why a step before the pop: ``PopService`` runs on the event loop without I/O (a pop is a
cursor move and a journal entry), and a cold read waits on the network. So the broker asks
here first: every queue whose pop cursor lies below the local queue's minimum (a consumer
group behind local retention, or new and reading from the start) is read from the tier on
its read workers, and a retry queue through ``get_local_async`` (a retry link whose origin
only the tier holds is delivered, not skipped). The pop uses a read only if the queue's
cursor is still where the read started. Without this a pop cursor jumped over everything
local retention removed: a lagging group silently lost those messages.

An in-flight message popped from the tier has no local queue entry, so when its invisible
time ends the revive cannot find the record to retry or dead-letter; ``PopService`` lists
those and :meth:`ColdPops.resolve` looks their records up in the tier's index objects.
A FIFO message is redelivered in place instead (so its message group never overtakes
itself): when its segment left local disk while it was in flight (or parked behind its
group), the pop would find no local entry, so the records of those it may deliver again
are read here first (``PopService.cold_messages``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import CorruptRecordError
from ..model import StoredMessage
from ..record import FLAG_BATCH
from ..system_topics import RETRY_PREFIX

if TYPE_CHECKING:
    from ..message_store import MessageFilter
    from ..pop_service import PopService, ReadAhead
    from .service import TierService


CACHE_LIMIT = 4096  # FIFO messages read ahead for redelivery and kept until a pop takes them


class ColdPops:
    def __init__(self, tier: "TierService", pops: "PopService") -> None:
        self.tier = tier
        self.pops = pops
        pops.min_offset = tier.min_offset  # a new group reading from the start starts in the tier
        pops.cold_wanted = []

    async def read_ahead(
        self, group: str, queues: list[tuple[str, int]], max_count: int, msg_filter: "MessageFilter | None",
        fifo: bool, from_latest: bool,
    ) -> "ReadAhead":
        out: ReadAhead = {}
        store = self.tier.store
        for topic, qid in queues:
            c = self.pops.cursor(group, topic, qid, fifo, from_latest)
            if c.fifo and (c.inflight or c.waiting):
                await self._fifo_again(group, topic, qid, max_count)
            start = c.next
            # below the local minimum, or an entry whose record retention just deleted (the
            # queue's minimum passes it lazily; a compacted queue's minimum is exact): only the tier has it
            if start < store.min_offset(topic, qid) or (
                    start < store.max_offset(topic, qid) and store.phys_at(topic, qid, start) is None
                    and (topic, qid) not in store.compaction.gens):
                r = await self.tier.get_async(topic, qid, start, max_count, msg_filter)
                if r is not None:
                    out[(topic, qid)] = (start, r)
            elif topic.startswith(RETRY_PREFIX):
                out[(topic, qid)] = (start, await self.tier.get_local_async(topic, qid, start, max_count, msg_filter))
        return out

    async def _fifo_again(self, group: str, topic: str, qid: int, max_count: int) -> None:
        """Read the FIFO messages this pop may deliver again in place (or after parking) whose
        queue entries left local disk while they were in flight, so the pop finds them."""
        store, cache = self.tier.store, self.pops.cold_messages
        todo = [o for o in self.pops.fifo_due(group, topic, qid, max_count)
                if (topic, qid, o) not in cache and store.phys_at(topic, qid, o) is None]
        if not todo:
            return
        if len(cache) > CACHE_LIMIT:  # what no pop took (acked meanwhile): read again if needed
            cache.clear()
        for m in await self.tier.run_cold(self._read_each, topic, qid, todo):
            cache[(topic, qid, m.queue_offset)] = m

    def _read_each(self, topic: str, qid: int, offsets: list[int]) -> list[StoredMessage]:
        out = []
        for o in offsets:
            r = self.tier.reader.get(topic, qid, o, 1)
            if r is not None and r.messages and r.messages[0].queue_offset == o:
                out.append(r.messages[0])
        return out

    async def resolve(self) -> bool:
        """Look up the records of the in-flight messages the last revive could not find locally;
        True if there were any (the caller revives again)."""
        wanted = self.pops.cold_wanted
        if not wanted:
            return False
        todo, wanted[:] = list(dict.fromkeys(wanted)), []
        for key in todo:
            phys, index = await self.tier.run_cold(self._look_up, *key)
            self.pops.cold_phys[key] = -1 if phys is None else phys
            if index is not None:
                self.pops.cold_batch_index[key] = index
        return True

    def _look_up(self, topic: str, qid: int, offset: int) -> tuple[int | None, int | None]:
        """The entry's record offset and, inside a batch record, the message's index there; its
        record (and a link's origin) read too, so the ``put_link`` of the revive that follows
        finds their blocks in the cache."""
        reader = self.tier.reader
        found = reader.locate(topic, qid, offset)
        if found is None:
            return None, None
        try:
            m = reader.read_phys(found[0])
        except (CorruptRecordError, ValueError):
            return None, None
        if not m.flags & FLAG_BATCH:  # a plain message on a batch topic: its link names no index
            return found[0], None
        return found
