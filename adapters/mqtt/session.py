"""MQTT session state: subscriptions, per-subscription queue cursors, in-flight windows.

Why this shape: the session is what outlives a connection (clean session 0 /
session expiry > 0). Everything a session needs after a unimq restart is
small and written through the processor's durable key-value store
(``mqtt.sessions``: the subscriptions, their light message queues and the
expiry, and the packet ids of inbound QoS 2 messages stored but not yet
released by PUBREL); the messages themselves live in the store, in each QoS 1/2
subscription's ``%LMQ%`` queue, and the session's progress through a queue is
the processor's committed consumer offset (group ``mqtt``). Why the inbound
QoS 2 ids: a client that did not see the PUBREC resends the PUBLISH (DUP) after
a restart too, and only the remembered id tells that it is stored already
(exactly once). Outbound, the packet ids whose PUBREC arrived (PUBREL sent,
PUBCOMP awaited) are saved before the message's offset is acknowledged: a
subscriber that hands a QoS 2 message to its application on PUBREL (paho does)
must get that PUBREL after a restart too, or the message is lost for it while the
queue says delivered. Other outbound in-flight state (the packet id of a PUBLISH
not yet PUBRECed) stays in memory: such a message is not acknowledged, so after a
restart it is read from the queue again and sent with a new id.
"""

from __future__ import annotations

import asyncio
import json
import time
from json.encoder import encode_basestring_ascii as _quote  # json.dumps' own string quoting (C)
from typing import TYPE_CHECKING, Any

from gateway.context import RequestContext
from gateway.lmq_reader import LaneRuns, WindowedLane

from .codec import MQTT_311
from .mapping import Outgoing
from .topics import parse_shared

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["Subscription", "Cursor", "Inflight", "Session", "Outgoing", "SESSION_NEVER_EXPIRES", "NONE", "EMPTY"]  # Outgoing: mapping's

SESSION_NEVER_EXPIRES = 0xFFFFFFFF
# The empty value of a session's packet-id and lane sets until one is added (an empty set is
# 216 bytes, and ten thousands of idle sessions have none): code that adds makes a set first.
NONE: frozenset[Any] = frozenset()


class _Empty(dict):  # type: ignore[type-arg]
    """An empty dict that refuses writes: a session's lanes, wake marks, in-flight window and ACL
    cache until it has one (an empty dict is 64 bytes, five per idle session; issue 21's memory).
    Reads, ``pop`` and ``clear`` work as on any empty dict; a write is a bug (the code that adds
    makes a dict first: :meth:`Session.new_cursor`, :meth:`Session.alloc_pid`) and says so."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("Session's shared empty dict is read-only: make the session its own dict first")

    __setitem__ = setdefault = update = __ior__ = _refuse  # type: ignore[assignment]


EMPTY: dict[Any, Any] = _Empty()


class Subscription:
    __slots__ = ("filter", "qos", "no_local", "rap", "rh", "sub_id", "lmq", "lmq_ready", "session", "group")

    def __init__(self, flt: str, qos: int, session: "Session", *, no_local: bool = False, rap: bool = False,
                 rh: int = 0, sub_id: int = 0, lmq: str | None = None, group: str | None = None) -> None:
        self.filter = flt
        self.qos = qos
        self.no_local = no_local
        self.rap = rap
        self.rh = rh
        self.sub_id = sub_id
        self.lmq = lmq  # light message queue of a QoS 1/2 subscription
        self.lmq_ready = False  # the LMQ topic is known to exist
        self.session = session
        self.group = group  # shared subscription group name

    def key(self) -> str:
        return f"$share/{self.group}/{self.filter}" if self.group else self.filter

    def to_json(self) -> list[Any]:
        return [self.key(), self.qos, int(self.no_local), int(self.rap), self.rh, self.sub_id, self.lmq]


# A session's progress through one lane of an LMQ (gateway.lmq_reader): next offset to hand
# to the client, the in-memory window of just-stored messages, the acknowledged floor.
# Keyed ``(lmq, broker)`` in ``Session.cursors``.
Cursor = WindowedLane


class Inflight:
    """An outbound QoS 1/2 PUBLISH not yet acknowledged."""

    __slots__ = ("msg", "qos", "lmq", "offset", "receipt", "sub_ids")

    def __init__(self, msg: Outgoing, qos: int, lmq: Any, offset: int, receipt: str | None,
                 sub_ids: list[int] | None) -> None:
        self.msg = msg
        self.qos = qos
        self.lmq = lmq  # the lane (lmq, broker) of a subscription's message; a shared group's LMQ name
        self.offset = offset
        self.receipt = receipt  # shared subscriptions: the pop receipt handle (lmq is the group's)
        self.sub_ids = sub_ids


class Session:
    __slots__ = (
        "client_id", "version", "expiry", "subs", "lmq_seq", "conn", "cursors", "pending",
        "inflight", "pubrel", "qos2_in", "next_pid", "pumping", "disconnected_at", "expiry_handle",
        "will_handle", "dirty", "has_sub_ids", "ctx", "runs", "username", "acl_write", "owner", "epoch", "handed",
        "online",
    )

    def __init__(self, client_id: str, version: int = MQTT_311, expiry: int = 0,
                 ctx: RequestContext | None = None) -> None:
        self.client_id = client_id
        self.version = version
        self.expiry = expiry  # seconds after disconnect; SESSION_NEVER_EXPIRES = never
        self.subs: dict[str, Subscription] = {}  # key (filter or $share/g/f) -> subscription
        self.lmq_seq = 0
        self.conn: Connection | None = None
        # EMPTY (shared, read-only) until the first lane is made (new_cursor), with pending and runs
        self.cursors: dict[tuple[str, str], Cursor] = EMPTY  # (lmq, broker) -> that lane's cursor
        self.pending: dict[tuple[str, str], int] = EMPTY  # lane -> wake generation (has data to read)
        self.inflight: dict[int, Inflight] = EMPTY  # packet id -> outbound in flight (made by alloc_pid)
        self.pubrel: set[int] | frozenset[int] = NONE  # outbound QoS 2: PUBREC received, PUBCOMP awaited
        self.qos2_in: set[int] | frozenset[int] = NONE  # inbound QoS 2: stored, PUBREL awaited
        self.next_pid = 1
        self.pumping = False
        self.disconnected_at = 0  # ms
        self.expiry_handle: asyncio.TimerHandle | None = None
        self.will_handle: asyncio.TimerHandle | None = None
        self.dirty: set[tuple[str, str]] | frozenset[tuple[str, str]] = NONE  # lanes whose floor must be committed
        self.has_sub_ids = False
        # set at each CONNECT (``ctx``: the CONNECT's own, made once: a frozen dataclass is not cheap)
        self.ctx: RequestContext = ctx if ctx is not None else RequestContext(protocol="mqtt", client_id=client_id)
        # lmq -> runs [broker, how many offsets] of messages waiting in its lanes, oldest first:
        # the order they were stored in across brokers, so a read-back interleaves the lanes
        # the same way. Only for an LMQ with more than one lane (never in merged mode).
        self.runs: dict[str, LaneRuns[str]] = EMPTY
        self.username: str | None = None  # from the last CONNECT: its identity for topic rights (acl.py)
        self.acl_write: dict[str, bool] = EMPTY  # topic -> may publish (cached ACL decisions; acl.py)
        # Several gateways (fleet.py): the gateway that holds the session ("o" in the record; None:
        # this one, never shared), its claim epoch ("g"), the epoch it was handed over to ("h",
        # in the record a releasing gateway writes) and whether it is online at its owner.
        self.owner: str | None = None
        self.epoch = 0
        self.handed = 0
        self.online = False

    @property
    def persistent(self) -> bool:
        return self.expiry != 0

    def alloc_pid(self) -> int:
        """A free packet id for an outbound PUBLISH, which the caller puts in ``inflight``."""
        pid = self.next_pid
        inflight, pubrel = self.inflight, self.pubrel
        if inflight is EMPTY:
            inflight = self.inflight = {}
        for _ in range(65536):
            if pid not in inflight and pid not in pubrel:
                break
            pid = pid + 1 if pid < 65535 else 1
        else:  # pragma: no cover - the window is far smaller than 65535
            raise RuntimeError("no free packet identifier")
        self.next_pid = pid + 1 if pid < 65535 else 1
        return pid

    def new_cursor(self, key: tuple[str, str], cur: Cursor) -> Cursor:
        """Add the cursor of lane ``key`` (the first one gives the session its own ``cursors``,
        ``pending`` and ``runs``: every write to those is about a lane it has)."""
        if self.cursors is EMPTY:
            self.cursors = {}
            if self.pending is EMPTY:
                self.pending = {}
            if self.runs is EMPTY:
                self.runs = {}
        self.cursors[key] = cur
        return cur

    def outstanding(self) -> int:
        return len(self.inflight) + len(self.pubrel)

    def lanes(self) -> dict[str, list[str]]:
        """LMQ -> the brokers holding a lane of it (saved: after a restart each is read back)."""
        out: dict[str, list[str]] = {}
        for lmq, b in self.cursors:
            out.setdefault(lmq, []).append(b)
        return out

    @classmethod
    def from_json(cls, client_id: str, raw: bytes) -> tuple["Session", dict[str, list[str]]]:
        """A session saved by :meth:`to_json`, and its lanes (LMQ -> brokers). Raises ValueError,
        KeyError, TypeError or MQTTProtocolError for a record it cannot read."""
        return cls.from_dict(client_id, json.loads(raw))

    @classmethod
    def from_dict(cls, client_id: str, d: Any) -> tuple["Session", dict[str, list[str]]]:
        """:meth:`from_json` of a record already parsed (the fleet's feed reads each once)."""
        s = cls(client_id, d["v"], d["e"])
        s.take_state(d)
        for key, qos, nl, rap, rh, sid, lmq in d["s"]:
            group, flt = parse_shared(key)
            s.subs[key] = Subscription(flt, qos, s, no_local=bool(nl), rap=bool(rap), rh=rh, sub_id=sid, lmq=lmq,
                                       group=group)
        lanes = d.get("l") or {}  # none in the format before lanes
        return s, lanes if isinstance(lanes, dict) else {}

    def take_state(self, d: Any) -> None:
        """Take a record's fields other than its subscriptions and lanes (raises as
        :meth:`from_json` for a record it cannot read)."""
        self.version, self.expiry = d["v"], d["e"]
        self.lmq_seq = d["n"]
        self.disconnected_at = d["d"] or int(time.time() * 1000)
        self.qos2_in = {int(pid) for pid in d.get("q", ()) if 0 < int(pid) < 65536} or NONE
        self.pubrel = {int(pid) for pid in d.get("r", ()) if 0 < int(pid) < 65536} or NONE
        self.username = d.get("u")
        self.owner = d.get("o")
        self.epoch = int(d.get("g", 0))
        self.online = not d["d"]

    def to_json(self, online: bool = False) -> bytes:
        """The durable record: what ``json.dumps(..., separators=(",", ":"))`` of its fields gives,
        byte for byte, written by hand. Why: a CONNECT storm writes a record per CONNECT and per
        close, and the json module's encoder cost ~25,000 instructions for this small dict (8%
        of a gateway's CPU per CONNECT under callgrind), an f-string a tenth of that; only a
        session with subscriptions, lanes or packet ids pays for ``json.dumps`` of those.
        ``online``: as if connected (a record created before its connection is attached)."""
        subs, cursors, q, r = self.subs, self.cursors, self.qos2_in, self.pubrel
        u, o = self.username, self.owner
        d = self.disconnected_at or (0 if online or self.conn is not None else int(time.time() * 1000))
        return (f'{{"v":{self.version},"e":{self.expiry},"n":{self.lmq_seq},"d":{d},'
                f'"s":{_dumps([s.to_json() for s in subs.values()]) if subs else "[]"},'
                f'"q":{_dumps(sorted(q)) if q else "[]"},"r":{_dumps(sorted(r)) if r else "[]"},'
                f'"l":{_dumps(self.lanes()) if cursors else "{}"},'
                f'"u":{"null" if u is None else _quote(u)},"o":{"null" if o is None else _quote(o)},'
                f'"g":{self.epoch},"h":{self.handed}}}').encode()


def _dumps(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"))
