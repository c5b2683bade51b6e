"""Several gateways serving one set of MQTT sessions: ownership, takeover, routing copies, wakes.

Why: a fleet of devices is spread over several gateway processes (one port shared
with SO_REUSEPORT, or a TCP load balancer), and a device reconnects to whichever
gateway it lands on. Each gateway routes publishes with an in-memory trie of the
persistent sessions' subscriptions, so it must learn of sessions other gateways
create or change; the gateway a session is connected to must learn of messages
other gateways stored for it; and a session moving between gateways must move
whole (subscriptions, queue floors, QoS 2 ids), with the old connection closed.

How (README "MQTT door", "Several gateways"):

- Every persistent session's record (``mqtt.sessions``, replicated on every
  broker) names its *owner* gateway (``"o"``, a random id per gateway process), a
  claim *epoch* (``"g"``) and whether it is online there (``"d" == 0``).
- Each gateway long-polls every broker's door-state feed (``core_broker/door_feed.py``)
  and keeps a *routing copy* (``copies.Copy``: owner, epoch, online, expiry and the
  subscriptions; never written back) of each session owned elsewhere that has
  subscriptions or is offline there (its expiry is armed here too); of one online
  without subscriptions only its owner's id (nothing to route; a clean-start CONNECT
  here must still take it over). Retained messages come the same way.
- CONNECT for a session this gateway does not own reads the record fresh. If it
  is online at another live gateway, this one writes a *claim* (the record with
  ``o`` = itself, ``g`` + 1) and waits (``mqtt_takeover_timeout_s``) for the old
  owner's *release*: the old owner sees the claim in its feed, closes the
  connection (v5 DISCONNECT 0x8E, the will as on one gateway), commits the
  session's acknowledged queue floors, and writes the record with its final state
  and ``"h"`` = the claimed epoch. The new owner then restores the session from
  that record, reading every broker's lane from its committed floor: messages
  acknowledged before are not sent again, unacknowledged ones are (QoS 1: at
  least once); so a record is not written again when its session gains a lane
  (``Delivery.save_lanes``): that would cost every first message a write, its
  replication and a copy refresh at every gateway. A dead owner (not in the brokers' list of gateways polling) is not
  waited for.
- A gateway storing a message into the queue of a session another live gateway
  owns leaves that gateway a *note* on the broker that stored it (lane name);
  the owner reads the lane at once. A QoS 0 publish matching a subscription with a
  queue of a session online at another live gateway (as this gateway's copy says)
  goes the same way, and the lane delivers it at QoS 0: the owner's tail does not
  read what such subscriptions want (tail.py), so each gateway reads back only what
  its clean sessions and QoS 0 subscriptions need.

The guarantee (issue 21): a message acknowledged for a persistent session connected
at a live gateway is delivered promptly, never left for the next reconnect. Notes
are how; what keeps them from being lost:

- notes go to the owner whatever this gateway's copy says of it being online (a
  copy may lag: a release written by a gateway holding the session offline says
  offline though the new owner holds it connected);
- two gateways that both think they hold a session (two CONNECTs racing, each
  missing the other's record) settle on one (:meth:`Fleet._yields`), and the one
  that keeps it writes its record again, as it does whenever another gateway's
  write names it, so the copies every gateway routes by converge on the holder;
- a note reaching a gateway that does not hold the session (the sender's copy
  was older) is passed on to the owner it knows of, ``MAX_HOPS`` times at most;
  one reaching the holder before the connection is attached marks the lane, which
  the CONNECT's resume reads; one arriving while that lane's read is on its way
  is kept for another read (``delivery.py``);
- a broker hands a note out once: after a watch call failed (its answer may have
  carried notes), every session connected here reads its lanes again.

A gateway that died gets no notes: its sessions wait in the store for their next
CONNECT anywhere, which reads every lane from its committed floor.

Clean (non-persistent) sessions and QoS 0 subscriptions across gateways: tail.py;
shared subscriptions' groups: fleet_share.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

from gateway.api import DoorFeed

from .codec import MQTTProtocolError
from .copies import Copy
from .retained import KV_RETAINED
from .session import Session
from .session_store import KV_SESSIONS

if TYPE_CHECKING:
    from .broker import MQTTBroker

log = logging.getLogger("unimq.mqtt")

__all__ = ["Fleet"]

WATCH_S = 2.0  # a watch call's long poll on a broker
NAMESPACES = [KV_SESSIONS, KV_RETAINED]
NOTE_TRIES = 4  # a note sent to a broker that does not answer is sent again, this often at most
MAX_HOPS = 3  # a note passed on from a gateway that no longer holds the session, at most this often
# "h" of a claim's record: the owner it names waits for a release (a gateway that took a session
# as stored writes "h" 0, and an offline holder lets it go without a write: Fleet._let_go)
CLAIM = -1
_SCAN = json.JSONDecoder().scan_once  # the json module's C scanner


def _parse(raw: bytes) -> Any:
    """``json.loads(raw)`` of a session record from the feed, straight through the C scanner:
    every gateway parses every other gateway's records (two per device in a CONNECT storm),
    and ``json.loads``' Python layers (encoding detection, decode, end check) cost about as much
    as the scan of a record this small. Raises ValueError as ``json.loads`` does."""
    text = raw.decode()
    try:
        d, end = _SCAN(text, 0)
    except StopIteration as e:
        raise ValueError(f"not a record at {e.value}") from None
    if end != len(text):
        raise ValueError("trailing data after the record")
    return d


class Fleet:
    """This gateway's part in a fleet of gateways sharing MQTT sessions (see the module doc)."""

    def __init__(self, broker: MQTTBroker) -> None:
        self.broker = broker
        self.processor = broker.processor
        self.gid = uuid.uuid4().hex[:16]
        # how this gateway's own session records look (Session.to_json: "h" last): the feed brings
        # them back, and they are told apart without parsing them
        self._own = f'"o":"{self.gid}"'.encode()
        # the brokers' door-state feed (MessagingProcessor offers it; a remote processor over
        # the gateway RPC does not: its door then stays on its own)
        self.feed = self.processor.door_feed()
        self.enabled = self.feed is not None
        self.timeout_s = broker.config.takeover_timeout_s
        self.seen: dict[str, dict[str, int]] = {ns: {} for ns in NAMESPACES}  # namespace -> key -> newest version
        self.copies: dict[str, Copy] = {}  # client id -> routing copy of a session another gateway holds
        self.bare: dict[str, str] = {}  # client id -> owner: held online elsewhere, no subscriptions
        self.live: dict[str, float] = {}  # gateway id -> when a broker last saw it polling
        self._claims: dict[tuple[str, int], asyncio.Future[bytes]] = {}  # (client id, epoch) -> release
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._manager: asyncio.Task[None] | None = None
        self._stopping = False
        self._notes: dict[str, dict[str, list[list[Any]]]] = {}  # broker -> owner -> wake notes
        self.takeovers = 0  # sessions this gateway took from another one

    def _feed(self) -> DoorFeed:
        """The feed; only called on the paths ``enabled`` guards."""
        assert self.feed is not None, "the fleet is off without a door-state feed"
        return self.feed

    # -- lifecycle

    async def start(self) -> None:
        """Take in every broker's door state once, then follow their feeds: a gateway that says
        it is ready routes to the sessions other gateways hold."""
        if not self.enabled:
            return
        self._stopping = False
        cursors = {}
        for name in await self._feed().door_brokers():
            try:
                cursors[name] = self._take(await self._feed().door_watch(
                    name, self.gid, NAMESPACES, "", 0, 0.0))
            except Exception as e:  # that broker's watcher tries again
                log.debug("mqtt fleet: first read of %s failed: %s", name, e)
        self._manager = asyncio.get_running_loop().create_task(self._manage(cursors))

    async def stop(self) -> None:
        # the flag ends the loops even if a cancel is lost on the way (asyncio may drop one
        # that arrives as an awaited call completes); the wait is bounded for the same reason
        self._stopping = True
        tasks = [t for t in (self._manager, *self._watchers.values()) if t is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=5.0)
            for t in pending:
                log.warning("mqtt fleet: a watcher did not stop within 5 s; left behind")
        self._watchers.clear()

    async def _manage(self, cursors: dict[str, tuple[str, int]]) -> None:
        """One watcher per registered broker (brokers come and go)."""
        while not self._stopping:
            for name in await self._feed().door_brokers():
                t = self._watchers.get(name)
                if t is None or t.done():
                    self._watchers[name] = asyncio.get_running_loop().create_task(
                        self._watch(name, *cursors.pop(name, ("", 0))))
            await asyncio.sleep(5.0)

    async def _watch(self, broker: str, inc: str, seq: int) -> None:
        failed = False
        while not self._stopping:
            try:
                r = await self._feed().door_watch(
                    broker, self.gid, NAMESPACES, inc, seq, WATCH_S)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a broker down or restarting: ask again soon
                log.debug("mqtt fleet: watching %s failed: %s", broker, e)
                failed = True
                await asyncio.sleep(1.0)
                continue
            restarted = bool(inc) and r["inc"] != inc  # notes left before a broker restart are gone
            inc, seq = self._take(r)
            if failed or restarted:  # notes lost with an answer: every connected session reads its lanes
                failed = False
                self.rewake()

    def _take(self, r: dict[str, Any]) -> tuple[str, int]:
        """Apply one watch answer; the cursor to ask from next."""
        now = time.monotonic()
        for g in r.get("gateways", ()):
            self.live[g] = now
        try:
            for ns, items in r["kv"].items():
                seen = self.seen.setdefault(ns, {})
                for key, (ver, val) in items.items():
                    if ver > seen.get(key, -1):
                        seen[key] = ver
                        self._apply(ns, key, val)
            for note in r["notes"]:
                self._wake(note)
        except Exception:  # pragma: no cover - one bad record must not stop the feed
            log.exception("mqtt fleet: applying door-state changes failed")
        return r["inc"], r["seq"]

    def alive(self, gid: str) -> bool:
        at = self.live.get(gid)
        return at is not None and time.monotonic() - at < WATCH_S * 3

    # -- what the feed brings

    def _apply(self, ns: str, key: str, raw: bytes | None) -> None:
        if ns == KV_RETAINED:
            self.broker.retained.apply(key, raw)
            return
        s = self.broker.sessions.get(key)
        if raw is None:
            # a session discarded elsewhere; one this gateway holds is discarded by a claim first
            if s is not None and not self.owns(s):
                self.broker.drop_copy(s)
            self._drop(key)
            return
        if raw.endswith(b',"h":0}') and self._own in raw:
            return  # this gateway's own write coming back (not a release to it: "h" is 0)
        try:
            d = _parse(raw)
            owner, epoch, handed = d.get("o"), int(d.get("g", 0)), int(d.get("h", 0))
            online = not d["d"]
        except (ValueError, TypeError, KeyError, AttributeError):
            return
        if handed:
            f = self._claims.get((key, handed))
            if f is not None and not f.done() and owner == self.gid:
                f.set_result(raw)  # the old owner released it to this gateway's claim
        if owner is None:
            return
        if owner == self.gid:
            # another gateway's write naming this one (a release, written from that gateway's
            # state: it may say offline): the record others route by is this gateway's own again
            if s is not None and self.owns(s):
                self.broker.session_store.save_soon(s)
            return
        if s is not None and self.owns(s):
            if not self._yields(s, owner, epoch, online):  # the record others route by must name it again
                s.epoch = max(s.epoch, epoch) + 1
                self.broker.session_store.save_soon(s)
            elif s.conn is None and handed != CLAIM:
                self._let_go(s, key, d, online)
            else:
                self.broker.spawn(self._release(s, owner, epoch))
            return
        self._copy(key, d, online)

    def _yields(self, s: Session, owner: str, epoch: int, online: bool) -> bool:
        """Does ``s``, held here, go to ``owner``, whose record of it (``epoch``, ``online``
        there) the feed just brought? Exactly one of two gateways that both think they hold a
        session keeps it, and a connected device is never given up for a record that is not:

        - held here by a live connection, offline (or dead) there: kept here -- a device that
          gave up on a CONNECT there and came here; that gateway's last write lost a race;
        - a higher epoch: a claim (CONNECT there after here): it goes;
        - the same epoch (both took it at once without seeing the other's record): offline
          here, it goes; connected at both, the higher gateway id keeps it;
        - a lower epoch: a stale write; kept here.
        """
        here = s.conn is not None
        if here and not (online and self.alive(owner)):
            return False
        if epoch != s.epoch:
            return epoch > s.epoch
        return not here or owner > self.gid

    def _copy(self, cid: str, d: Any, online: bool) -> None:
        """Replace the routing copy of a session another gateway owns (``d``: its parsed record,
        naming its owner); one whose subscriptions did not change (it went online or offline
        there) is updated in place, keeping its routing entries. One online there without
        subscriptions is only remembered by its owner (nothing to route, no expiry here)."""
        old = self.copies.get(cid)
        if old is not None:
            cid = old.client_id  # one string for the client id, however often its record comes
            try:
                if old.same_subs(d):
                    old.refresh(d, online)
                    self._arm(old)
                    return
            except (ValueError, KeyError, TypeError, AttributeError, MQTTProtocolError):
                pass
        self._replace(cid, None)
        try:
            if online and not d["s"]:
                self.bare[cid] = sys.intern(d["o"])
                return
            c = Copy(cid, d, online)
        except (ValueError, KeyError, TypeError, AttributeError, MQTTProtocolError):
            return
        self.copies[cid] = c
        routing = self.broker.routing
        for sub in c.subs:
            if not sub.group:  # shared groups stay per gateway
                routing.index(sub)
        self._arm(c)

    def _drop(self, cid: str) -> None:
        """Forget what this gateway knows of ``cid`` held elsewhere (nothing stored is touched)."""
        self.bare.pop(cid, None)
        c = self.copies.pop(cid, None)
        if c is None:
            return
        if c.expiry_handle is not None:
            c.expiry_handle.cancel()
            c.expiry_handle = None
        routing = self.broker.routing
        for sub in c.subs:
            if not sub.group:
                routing.unindex(c, sub)  # type: ignore[arg-type]

    def _arm(self, c: Copy) -> None:
        """A copy's expiry runs here while it is offline at its owner (the owner may die)."""
        if not c.online:
            self.broker.session_store.arm_expiry(c, self._expired)  # type: ignore[arg-type]
        elif c.expiry_handle is not None:
            c.expiry_handle.cancel()
            c.expiry_handle = None

    def _expired(self, c: Copy) -> None:
        if self.copies.get(c.client_id) is c and not (c.online and self.alive(c.owner)):
            self.broker.spawn(self._end(c))

    async def _end(self, c: Copy) -> None:
        """A copy's session expired while offline at its owner: discard it (subscriptions' LMQs,
        record), as read fresh, unless it changed meanwhile."""
        raw = await self.broker.session_store.read(c.client_id)
        if self.copies.get(c.client_id) is not c or c.online or raw is None:
            return
        s = self._replace(c.client_id, raw)
        if s is not None:
            await self.broker.end_session(s)

    def _replace(self, cid: str, record: bytes | None) -> Session | None:
        """Forget ``cid``'s session here (nothing stored is touched) and read it from ``record``
        (None: nothing to read; unreadable: the client starts anew)."""
        old = self.broker.sessions.get(cid)
        if old is not None:
            self.broker.drop_copy(old)
        self._drop(cid)
        if record is None:
            return None
        try:
            return Session.from_json(cid, record)[0]
        except (ValueError, KeyError, TypeError, AttributeError, MQTTProtocolError):
            return None

    def owns(self, s: Session | Copy) -> bool:
        return s.owner is None or s.owner == self.gid

    def _let_go(self, s: Session, cid: str, d: Any, online: bool) -> None:
        """``s``, held here offline, was taken by the gateway ``d`` names from its stored record
        (not a claim: that gateway waits for no release). Nothing is written: the record it read
        was this one's last (an offline session's floors are committed before its record says
        offline, and nothing changes it offline); a release would only make the new owner
        write its record once more (in a reconnect storm, two writes per device that moved)."""
        self.broker.wills.cancel(s)  # the session goes on at the new owner: a delayed will is not due
        self.broker.drop_copy(s)
        self._copy(cid, d, online)  # kept as a routing copy of the new owner's

    async def _release(self, s: Session, owner: str, epoch: int) -> None:
        """Another gateway claimed ``s``: close its connection here and hand its state over."""
        b = self.broker
        conn = s.conn
        s.owner, s.epoch = owner, epoch  # from now on nothing here writes its record
        if conn is not None:
            conn.close(0x8E, "session taken over", publish_will=True)
            b.detach(conn)
        b.wills.cancel(s)  # the session goes on at the new owner: a delayed will is not due
        await b.delivery.commit_offsets()  # its acknowledged floors, before the new owner reads them
        s.handed, s.disconnected_at = epoch, 0
        raw = s.to_json()
        try:
            await self.processor.kv_put(b.ctx, KV_SESSIONS, s.client_id, raw)
        finally:
            s.handed = 0
        if b.sessions.get(s.client_id) is s:
            b.drop_copy(s)
            self._copy(s.client_id, json.loads(raw), True)  # kept as a routing copy of the new owner's
        log.info("mqtt: session %r handed over to gateway %s", s.client_id, owner)

    # -- CONNECT

    def unknown(self, cid: str) -> bool:
        """Is ``cid`` unknown here (no session, no copy, no owner elsewhere the feed told of)?
        A persistent CONNECT of one creates its record instead of reading it first (broker.py);
        a record the feed has not brought yet makes that create fail, and then :meth:`claim`."""
        return self.enabled and cid not in self.broker.sessions and cid not in self.copies and cid not in self.bare

    async def claim(self, cid: str, clean_start: bool) -> None:
        """Before CONNECT ``cid`` is handled: make this gateway the owner of its persistent
        session, taking it over from another gateway (see the module doc). A clean start only
        needs it when the feed told of the session (a copy, or its owner: the session it
        discards lives elsewhere)."""
        if not self.enabled:
            return
        b = self.broker
        s = b.sessions.get(cid)
        if s is None and clean_start and cid not in self.copies and cid not in self.bare:
            return  # nothing to continue; a session stored elsewhere would be known here
        if s is not None and self.owns(s):
            return  # held here (a takeover here is the one-gateway path)
        raw = await b.session_store.read(cid)
        if raw is None:
            self._replace(cid, None)
            return
        try:
            d = json.loads(raw)
            owner, epoch, online = d.get("o"), int(d.get("g", 0)), not d["d"]
        except (ValueError, TypeError, KeyError, AttributeError):
            return
        epoch += 1
        if owner is not None and owner != self.gid and online and self.alive(owner):
            d["o"], d["g"], d["h"] = self.gid, epoch, CLAIM
            f: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            self._claims[(cid, epoch)] = f
            try:
                await self.processor.kv_put(b.ctx, KV_SESSIONS, cid, json.dumps(d, separators=(",", ":")).encode())
                async with asyncio.timeout(self.timeout_s):  # not wait_for: it can swallow a cancel
                    raw = await f
            except TimeoutError:
                log.warning("mqtt: gateway %s did not release session %r within %.1fs: taking it as stored",
                            owner, cid, self.timeout_s)
                raw = await b.session_store.read(cid) or raw
            finally:
                self._claims.pop((cid, epoch), None)
        s = self._replace(cid, raw)
        if s is None:
            return
        s.owner, s.epoch, s.online = self.gid, epoch, False
        self.takeovers += 1
        # the brokers (a nameserver call) only for a subscription's lanes: not per device that moved
        await b.adopt_owned(s, await self._feed().door_brokers() if s.subs else [])

    def new_owner(self, s: Session) -> None:
        """``s`` is attached here: its record names this gateway from now on."""
        if self.enabled:
            s.owner = self.gid
            if not s.epoch:
                s.epoch = 1

    # -- wakes for sessions online at another gateway

    def remote(self, s: Session | Copy) -> bool:
        """Is ``s`` a routing copy of a session online at another gateway?"""
        return s.owner is not None and s.owner != self.gid and s.online

    def note(self, broker: str, s: Session | Copy, lmq: str, hops: int = 0) -> None:
        """``broker`` stored a message in ``lmq`` of ``s`` (online elsewhere): tell its owner."""
        per = self._notes.get(broker)
        if per is None:
            per = self._notes[broker] = {}
        item = [s.client_id, lmq, broker, hops] if hops else [s.client_id, lmq, broker]
        per.setdefault(s.owner, []).append(item)  # type: ignore[arg-type]

    def flush_notes(self) -> None:
        if not self._notes:
            return
        notes, self._notes = self._notes, {}
        for broker, per in notes.items():
            for owner, items in per.items():
                self.broker.spawn(self._send_notes(broker, owner, items))

    async def _send_notes(self, broker: str, owner: str, items: list[list[Any]]) -> None:
        for attempt in range(NOTE_TRIES):
            try:
                await self._feed().door_notify(broker, owner, items)
                return
            except Exception as e:  # that broker busy or restarting: again, then (a restart) the
                # owner's watch sees the broker's new incarnation and reads every lane anyway
                log.debug("mqtt fleet: notes to %s via %s failed: %s", owner, broker, e)
                await asyncio.sleep(0.5 * (attempt + 1))
        log.warning("mqtt fleet: %d notes to gateway %s via %s not delivered", len(items), owner, broker)

    def _wake(self, note: list[Any]) -> None:
        cid, lmq, broker = note[:3]
        if lmq is None:  # [cid, None, ms]: another gateway's CONNECT of that client id (tail.py)
            self.broker.tail.connected_elsewhere(cid, broker)
            return
        hops = note[3] if len(note) > 3 else 0
        b = self.broker
        s: Session | Copy | None = b.sessions.get(cid) or self.copies.get(cid)
        if s is None:
            return  # no subscription here to read by; the owner's CONNECT reads every lane
        if not isinstance(s, Session) or not self.owns(s):
            # it moved on meanwhile (the sender's copy was older than this one's): passed on to
            # the owner this gateway knows of, a few times at most (copies converge)
            if hops < MAX_HOPS and self.alive(s.owner):  # type: ignore[arg-type]
                self.note(broker, s, lmq, hops + 1)
                self.flush_notes()
            return
        sub = b.delivery._sub_of_lmq(s, lmq)
        if sub is not None:
            # even before the session's connection is attached (a CONNECT on its way): the lane
            # is made and marked, and the CONNECT's resume reads it
            b.delivery.must_pull(s, sub, broker)
            b.delivery.wake(s)

    def rewake(self) -> None:
        """Read every lane of every session connected here again: after a watch call failed, the
        notes its answer carried may be lost with it (a broker hands each note out once)."""
        d = self.broker.delivery
        for s in list(self.broker.sessions.values()):
            if s.conn is not None and self.owns(s) and s.cursors:
                d.resume(s)
