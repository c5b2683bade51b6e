"""Routing copies: what a gateway keeps of a persistent session another gateway holds.

Why a type of its own: every gateway keeps a copy of every session the others hold
(fleet.py), so copies are most of a fleet's memory (issue 21: under 10 KiB per idle
client summed over the fleet). A copy is never connected, read or written here;
routing needs only who holds it (owner, claim epoch, online there), its
subscriptions (filter, QoS, options, LMQ) and, while it is offline there, its
expiry. A full :class:`~.session.Session` (six dicts, a request context, in-flight
state) cost about three times as much.

A copy's subscriptions are :class:`~.session.Subscription` objects whose
``session`` is the copy: the routing trie, the plans and the publish path read
``sub.session.client_id`` / ``.owner`` / ``.conn`` (None: never connected here) /
``.ctx`` (read rights) of either kind alike, and tell a copy by its owner
(``Fleet.owns``).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from gateway.context import RequestContext

from .session import Subscription
from .topics import parse_shared

__all__ = ["Copy"]

# The session expiry intervals seen, one int object each (a fleet's devices share a few values)
_EXPIRIES: dict[int, int] = {}


class Copy:
    """A routing copy of a session ``owner`` holds, built from its record (never written back)."""

    __slots__ = ("client_id", "owner", "epoch", "online", "expiry", "disconnected_at", "expiry_handle", "username",
                 "has_sub_ids", "subs")

    conn: None = None  # never connected here (routing code reads a session's connection)

    def __init__(self, client_id: str, d: Any, online: bool) -> None:
        """``d``: the session's parsed record (Session.to_json), ``online``: at its owner (a
        releasing gateway's record says offline); raises ValueError, KeyError, TypeError or
        MQTTProtocolError for a record it cannot read."""
        self.client_id = client_id
        self.expiry_handle: asyncio.TimerHandle | None = None
        self.has_sub_ids = False  # set by Routing.index
        self.refresh(d, online)
        subs = []
        for key, qos, nl, rap, rh, sid, lmq in d["s"]:
            group, flt = parse_shared(key)
            sub = Subscription(flt, qos, self, no_local=bool(nl), rap=bool(rap), rh=rh,  # type: ignore[arg-type]
                               sub_id=sid, lmq=lmq, group=group)
            sub.lmq_ready = lmq is not None  # the owner made its LMQ before storing the record
            subs.append(sub)
        self.subs: tuple[Subscription, ...] = tuple(subs)

    def refresh(self, d: Any, online: bool) -> None:
        """Take the record's fields other than its subscriptions (it went online or offline at
        its owner, or moved to another one)."""
        self.owner: str = sys.intern(d["o"])  # a few gateway ids shared by every copy
        self.epoch = int(d.get("g", 0))
        self.online = online
        e = d["e"]
        self.expiry: int = _EXPIRIES.setdefault(e, e) if len(_EXPIRIES) < 1024 else e
        # only read while offline there (its expiry runs here): an online copy holds no int of its own
        self.disconnected_at: int = 0 if online else d["d"] or int(time.time() * 1000)
        self.username: str | None = d.get("u")

    def same_subs(self, d: Any) -> bool:
        """Does the record ``d`` have exactly this copy's subscriptions?"""
        return bool(d["s"] == [sub.to_json() for sub in self.subs])

    @property
    def ctx(self) -> RequestContext:
        """Its identity as last stored (what its subscriptions may read: acl.py); made when asked,
        only where topic rights are enforced."""
        return RequestContext(protocol="mqtt", client_id=self.client_id, principal=self.username)
