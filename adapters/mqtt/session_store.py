"""Persistent sessions: the sessions of this door, their durable records and their expiry.

What outlives a connection (clean session 0 / session expiry > 0) is small and
written through the processor's durable key-value store (namespace
``mqtt.sessions``, one record per client id: see ``session.py`` for what it
holds and why); the messages themselves stay in the store, in the sessions' LMQs.
Records are written and read in batches (``gateway/kv_batch.py``: a storm of
CONNECTs makes one call per broker per batch, not one per device); a record is
rendered when its batch is sent, so it carries the session's newest state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from gateway.api import MessagingAPI
from gateway.context import RequestContext
from gateway.kv_batch import SKIP, KvBatcher

from .codec import MQTTProtocolError
from .session import SESSION_NEVER_EXPIRES, Session

log = logging.getLogger("unimq.mqtt")

__all__ = ["SessionStore", "KV_SESSIONS"]

KV_SESSIONS = "mqtt.sessions"


class SessionStore:
    """Client id -> session, with the durable record of each persistent one."""

    __slots__ = ("processor", "ctx", "sessions", "gid", "batch")

    def __init__(self, processor: MessagingAPI, ctx: RequestContext) -> None:
        self.processor = processor
        self.ctx = ctx
        self.sessions: dict[str, Session] = {}
        self.gid: str | None = None  # this gateway's id among several (fleet.py); None: alone
        self.batch = KvBatcher(processor, ctx, KV_SESSIONS)

    async def load(self) -> list[tuple[Session, dict[str, list[str]]]]:
        """Read back the persistent sessions saved before a restart, with their saved lanes
        (unreadable records are skipped with a warning)."""
        out = []
        for cid, raw in (await self.processor.kv_items(self.ctx, KV_SESSIONS)).items():
            try:
                s, lanes = Session.from_json(cid, raw)
            except (ValueError, KeyError, TypeError, MQTTProtocolError):
                log.warning("dropping unreadable MQTT session %r", cid)
                continue
            # its identity as last seen: what its subscriptions may read while it is away
            s.ctx = RequestContext(protocol="mqtt", client_id=cid, principal=s.username)
            self.sessions[cid] = s
            out.append((s, lanes))
        return out

    def _current(self, s: Session) -> bool:
        """Is ``s`` a persistent session this gateway holds (its record is written here)?"""
        return s.persistent and self.sessions.get(s.client_id) is s and (s.owner is None or s.owner == self.gid)

    async def save(self, s: Session) -> None:
        """Write ``s``'s record (a persistent session still current only); returns once it is
        durable, holding the session's state as of some moment after the call."""
        if self._current(s):
            await self._write(s)

    def save_soon(self, s: Session) -> None:
        """:meth:`save` for a caller that does not wait (a failure is logged)."""
        if self._current(s):
            self._write(s).add_done_callback(_log_failure)

    def _write(self, s: Session) -> "asyncio.Future[None]":
        # rendered when its batch leaves: the newest state, unless the session moved meanwhile
        return self.batch.write(s.client_id, lambda: s.to_json() if self._current(s) else SKIP)

    def create(self, s: Session, record: bytes) -> "asyncio.Future[bool]":
        """Create ``s``'s ``record`` where the brokers hold nothing of its client id (a new
        device's session, written without reading first: ``KvBatcher.create``); True once
        durable, False when refused (read the record and go on from what it says)."""
        return self.batch.create(s.client_id, record)

    async def delete(self, client_id: str) -> None:
        await self.batch.write(client_id, _deleted)

    async def read(self, client_id: str) -> bytes | None:
        """``client_id``'s record as the brokers hold it (after this gateway's own writes of it)."""
        return await self.batch.read(client_id)

    def remove(self, s: Session) -> None:
        """Take ``s`` out *now* (a CONNECT that replaces it must not find it any more)."""
        if self.sessions.get(s.client_id) is s:
            del self.sessions[s.client_id]
        if s.expiry_handle is not None:
            s.expiry_handle.cancel()
            s.expiry_handle = None

    @staticmethod
    def arm_expiry(s: Session, expire: Callable[[Session], Any]) -> None:
        """Call ``expire(s)`` when ``s`` has been offline for its expiry interval."""
        if s.expiry_handle is not None:
            s.expiry_handle.cancel()
            s.expiry_handle = None
        if s.conn is not None or s.expiry == SESSION_NEVER_EXPIRES:
            return
        left = s.disconnected_at / 1000 + s.expiry - time.time()
        s.expiry_handle = asyncio.get_running_loop().call_later(max(left, 0), expire, s)


def _deleted() -> None:
    return None


def _log_failure(f: "asyncio.Future[None]") -> None:
    if not f.cancelled() and f.exception() is not None:
        log.warning("mqtt: a session record could not be stored: %s", f.exception())
