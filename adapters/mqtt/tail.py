"""Several gateways: messages other gateways stored, for the subscribers only this gateway serves.

Why (issue 21): a publish is routed by the gateway it arrives at, with the subscriptions
it knows. It knows the persistent sessions other gateways hold (routing copies:
fleet.py), and their QoS 1/2 deliveries go through the sessions' queues; it knows
nothing of other gateways' clean sessions, and it delivers QoS 0 only to connections
of its own. With connections spread over gateways at random (``SO_REUSEPORT``, a load
balancer), a plain ``mosquitto_sub -t 'a/#'`` would miss what a publisher on another
gateway sends. rocketmq-mqtt's answer, taken here: every MQTT publish is stored in the
store topic its first level maps to (``mapping.py``), so a gateway whose own
subscribers need a first level *tails* that store topic -- every queue on every broker,
long-polled by offset through the processor, from the end at the time the first such
subscriber appeared -- and hands what other gateways stored to its subscribers.

What is delivered from the tail, to subscriptions of sessions connected here:

- a message some other gateway stored: its gateway stamps it with :data:`P_ORIGIN`
  (``<gateway id>.<epoch>:<sequence>``, per store topic) while it sees other live
  gateways; an unstamped message, or one of this gateway's, was routed here already;
- to a clean session, at the subscription's QoS (downgraded to the message's), from
  memory (as a retained message is: a clean session keeps nothing past its connection);
  to a persistent session only for its subscriptions without a queue (QoS 0 ones): one
  with a queue (QoS 1/2) gets every message through it, QoS 0 publishes too -- the
  publishing gateway's routing copy of the session, online here, puts them in the
  queue and leaves a note (fleet.py), and the lane delivers them at QoS 0. So such
  subscriptions make no demand: a fleet of persistent QoS 1 devices has every gateway
  read back nothing it would not deliver (issue 21: it read every message back and
  matched it, to find only subscriptions served by their queues);
- with the usual matching, read rights, no-local and retain-as-published rules;
- per origin gateway in its sequence order: what the tail reads from several queues and
  brokers is put back in the order the origin stored it, waiting up to :data:`GAP_S`
  for a missing number (a send that failed leaves one), and :data:`GAP_S` for the first
  message of an origin not seen before (its predecessors may still be on their way).

Bounded memory: at most :data:`MAX_HELD` messages waiting per origin and topic, and a
clean session's in-memory QoS 1/2 deliveries stop at four in-flight windows (past that
they are dropped and counted, as Mosquitto's ``max_queued_messages`` drops). Filters whose
first level is a wildcard (``#``, ``+/x``) make every store topic tailed (listed every
:data:`LIST_S`; a topic found later is read from the time the demand began). One gateway
alone (no other live one in the fleet): no tail runs and no stamp is written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Iterable

from core_broker.errors import TopicNotFoundError, UnimqError
from core_broker.model import GetStatus, StoredMessage

from .codec import RC_SESSION_TAKEN_OVER
from .fleet_share import WILD, FleetShares, demand_key
from .mapping import P_MQTT_CLIENT_ID, P_ORIGIN, P_RETAIN, P_TOPIC, now_ms, outgoing_from_stored
from .routing import Routing
from .session import Session, Subscription

if TYPE_CHECKING:
    from .broker import MQTTBroker

log = logging.getLogger("unimq.mqtt")

__all__ = ["Tail", "GAP_S", "MAX_HELD", "tailed"]

GAP_S = 0.5  # how long a missing sequence number (or an origin's first message) is waited for
MAX_HELD = 10_000  # messages waiting per origin and store topic; past it they go out as they are
WAIT_MS = 2_000  # a tail's long poll on one queue
BATCH = 128  # messages per pull
LIST_S = 5.0  # wildcard demand: how often the store topics are listed
CHECK_S = 1.0  # how often the manager looks at the fleet (other gateways alive?) and routes
MAX_SEQ_TOPICS = 100_000  # store topics with a stamp counter; past it the counters start a new epoch

def tailed(s: Session, sub: Subscription) -> bool:
    """Is what other gateways store for ``sub`` (of ``s``, connected here) read from the tail?
    Not a shared group's (fleet_share.py), nor one with a queue of a persistent session: every
    gateway's routing copy of the session puts each message for it in that queue, QoS 0 too
    (``Routing.plan``'s ``remote0``)."""
    return not sub.group and not (sub.lmq and s.persistent)


class _Order:
    """One origin's messages in one store topic, put back in the origin's sequence."""

    __slots__ = ("next", "held", "timer", "seen")

    def __init__(self) -> None:
        self.next = -1  # the number expected next; -1: not known yet (the origin's first message)
        self.held: dict[int, StoredMessage] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.seen = time.monotonic()


class _TopicTail:
    """The readers of one store topic: one long-polling task per queue (and broker)."""

    def __init__(self, tail: Tail, topic: str, since_ms: int, from_end: bool = True) -> None:
        self.tail = tail
        self.topic = topic
        self.since_ms = since_ms  # queues found after the first look are read from this time on
        self.readers: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.orders: dict[str, _Order] = {}
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.looked = not from_end  # (a topic a later listing found: read from since_ms at once)
        self._lock = asyncio.Lock()  # one look at a time (the manager's and a SUBSCRIBE's)

    async def position(self) -> None:
        """Start a reader on every queue not read yet: from its end the first time, later (a
        queue that appeared: a new topic, a new broker) from ``since_ms``."""
        async with self._lock:
            await self._position()

    async def _position(self) -> None:
        t = self.tail
        p, ctx = t.processor, t.broker.ctx
        try:
            route = await p.query_route(ctx, self.topic)
        except TopicNotFoundError:
            route = None  # created by its first send; read from since_ms once it exists
        except UnimqError as e:
            log.debug("mqtt tail: route of %s: %s", self.topic, e)
            route = None
        first = not self.looked
        self.looked = True
        if route is not None:
            for q in route.queues:
                key = (q.broker, q.queue_id)
                if key in self.readers:
                    continue
                try:
                    if first:
                        off = await p.query_offset(ctx, self.topic, q.queue_id, "end", broker=q.broker)
                    else:
                        off = await p.query_offset(ctx, self.topic, q.queue_id, "timestamp", self.since_ms,
                                                   broker=q.broker)
                except UnimqError as e:
                    log.debug("mqtt tail: offset of %s %s/%d: %s", self.topic, q.broker, q.queue_id, e)
                    continue
                self.readers[key] = asyncio.get_running_loop().create_task(self._read(q.broker, q.queue_id, off))
        if not self.ready.done():
            self.ready.set_result(None)

    async def _read(self, broker: str, qid: int, off: int) -> None:
        t = self.tail
        p, ctx = t.processor, t.broker.ctx
        while True:
            try:
                r = await p.pull(ctx, self.topic, qid, off, BATCH, None, WAIT_MS, broker=broker)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a broker down or restarting: ask again soon
                log.debug("mqtt tail: pull %s %s/%d: %s", self.topic, broker, qid, e)
                await asyncio.sleep(1.0)
                continue
            if r.status == GetStatus.OFFSET_MOVED:
                off = r.min_offset  # retention took what was not read yet
                continue
            if r.status == GetStatus.OFFSET_OVERFLOW_BADLY:
                off = r.max_offset
                continue
            for m in r.messages:
                t.take(self, m)
            if r.next_offset > off:
                off = r.next_offset
            elif not r.messages and r.status not in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE):
                await asyncio.sleep(0.2)  # (a long poll a broker did not hold: do not spin)

    def stop(self) -> None:
        for task in self.readers.values():
            task.cancel()
        self.readers.clear()
        for o in self.orders.values():
            if o.timer is not None:
                o.timer.cancel()
        self.orders.clear()


class Tail:
    """This gateway's tails of store topics, and the stamps it writes on what it publishes."""

    def __init__(self, broker: MQTTBroker) -> None:
        self.broker = broker
        self.processor = broker.processor
        self.fleet = broker.fleet
        self.several = False  # other live gateways in the fleet: stamp publishes, run tails
        self.demand: dict[str, int] = {}  # store topic (or WILD) -> subscriptions of sessions connected here
        # session connected here -> filter -> its demand key (what each subscription added)
        self._held: dict[Session, dict[str, str]] = {}
        self._since: dict[Session, int] = {}  # session connected here -> when (ms)
        self._kicks: list[list[object]] = []  # CONNECTs here not yet told to the other gateways
        self._kicker: asyncio.Task[None] | None = None  # telling them (one batch of notes at a time)
        self._brokers: list[str] = []  # the brokers the fleet's notes go through
        self.tails: dict[str, _TopicTail] = {}
        self._wild_since = 0  # ms: when the wildcard demand began
        self._wild: set[str] = set()  # the store topics the last listing found (wildcard demand)
        self._listed = 0.0
        self._seq: dict[str, int] = {}  # store topic -> next stamp number
        self._epoch = 0
        self._origin = ""
        self._manager: asyncio.Task[None] | None = None
        self.dropped = 0  # clean sessions' QoS 1/2 deliveries dropped over the in-flight bound
        self.delivered = 0
        self.shares = FleetShares(broker)  # shared subscriptions' groups across the fleet

    # -- lifecycle

    async def start(self) -> None:
        if not self.fleet.enabled:
            return
        self._origin = f"{self.fleet.gid}.{self._epoch}"
        await self._check()
        self._manager = asyncio.get_running_loop().create_task(self._manage())

    async def stop(self) -> None:
        if self._manager is not None:
            self._manager.cancel()
            await asyncio.wait([self._manager], timeout=5.0)
            self._manager = None
        for tt in self.tails.values():
            tt.stop()
        self.tails.clear()
        self.shares.follow(False)  # the pumps end now, not at their next long poll

    async def _manage(self) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                await self._check()
            except asyncio.CancelledError:
                raise
            except Exception:  # pragma: no cover - the manager must outlive one bad round
                log.exception("mqtt tail: check failed")

    async def _check(self) -> None:
        """Follow the fleet: tails run while another gateway is alive, on every topic in demand."""
        f = self.fleet
        gid = f.gid
        several = any(g != gid and f.alive(g) for g in f.live)
        if several != self.several:
            self._recount(several)
        self.shares.follow(several)
        if not several:
            for tt in self.tails.values():
                tt.stop()
            self.tails.clear()
            return
        if f.feed is not None:
            self._brokers = sorted(await f.feed.door_brokers())
        first_listing = False
        if self.demand.get(WILD):
            now = time.monotonic()
            if now - self._listed >= LIST_S:
                first_listing = not self._listed
                self._listed = now
                try:
                    topics = await self.processor.list_topics(self.broker.ctx)
                    self._wild = {t.name for t in topics if not t.name.startswith("%")}
                except UnimqError as e:
                    log.debug("mqtt tail: listing topics: %s", e)
        else:
            self._wild = set()
        for name in [n for n in self.tails if not self._wanted(n)]:
            self.tails.pop(name).stop()
        for name in [k for k in self.demand if k != WILD] + sorted(self._wild):
            cur = self.tails.get(name)
            if cur is None:
                # a topic a later listing found was made after the wildcard demand began
                direct = name in self.demand or first_listing
                cur = self.tails[name] = _TopicTail(self, name, now_ms() if direct else self._wild_since, direct)
            await cur.position()  # (again: queues that appeared since, a new topic, a new broker)
        now = time.monotonic()
        for tt in self.tails.values():
            for key in [k for k, o in tt.orders.items() if not o.held and now - o.seen > 60.0]:
                del tt.orders[key]

    def _recount(self, several: bool) -> None:
        """The fleet went from one gateway to several (the sessions connected here are counted
        from now on: what they need is tailed) or back (nothing is counted: one gateway alone
        pays nothing for this)."""
        self.several = several
        self.demand.clear()
        self._held.clear()
        self._since.clear()
        if several:
            for s in self.broker.sessions.values():
                if s.conn is not None:
                    keys = self._held[s] = self._keys(s, s.subs.values())
                    for k in keys.values():
                        self.demand[k] = self.demand.get(k, 0) + 1
                    self._since[s] = 0  # connected before any CONNECT another gateway tells of now
            if self.demand.get(WILD):
                self._wild_since = now_ms()
                self._listed = 0.0

    @staticmethod
    def _keys(s: Session, subs: Iterable[Subscription]) -> dict[str, str]:
        """The demand of ``s``'s subscriptions ``subs``: filter -> store topic (see :func:`tailed`)."""
        return {sub.filter: demand_key(sub.filter) for sub in subs if tailed(s, sub)}

    def _wanted(self, topic: str) -> bool:
        return self.demand.get(topic, 0) > 0 or (self.demand.get(WILD, 0) > 0 and topic in self._wild)

    # -- demand: subscriptions of sessions connected here

    def attach(self, s: Session) -> None:
        """``s`` is connected here now: its subscriptions are in demand (no waiting: what a
        CONNECT resumes was subscribed before, and its tails may start in the background)."""
        if not self.several:
            return  # (counted when the fleet becomes several: _recount)
        self._since[s] = now_ms()
        self._kick(s.client_id)
        keys = self._held[s] = self._keys(s, s.subs.values())
        for k in keys.values():
            self._want(k)
        self._groups(s.subs.values())

    async def subscribed(self, s: Session, subs: list[Subscription]) -> None:
        """New subscriptions of ``s`` (connected here); returns once their tails read from the
        end (before the SUBACK: a message another gateway stores after it reaches them)."""
        if not self.several:
            return
        keys = self._held.setdefault(s, {})
        waits = self._groups(subs)
        for f, k in self._keys(s, subs).items():
            keys[f] = k
            w = self._want(k)
            if w is not None:
                waits.append(w)
        if waits:
            await asyncio.wait(waits, timeout=10.0)

    def _groups(self, subs: Iterable[Subscription]) -> list[asyncio.Future[None]]:
        """Wake the fleet-wide pumps of the shared groups among ``subs``."""
        groups = self.broker.routing.groups
        waits = []
        for sub in subs:
            g = groups.get((sub.group, sub.filter)) if sub.group else None
            w = self.shares.wake(g) if g is not None else None
            if w is not None:
                waits.append(w)
        return waits

    def unsubscribed(self, s: Session, sub: Subscription) -> None:
        keys = self._held.get(s)
        k = keys.pop(sub.filter, None) if keys is not None and not sub.group else None
        if k is not None:
            self._unwant(k)

    def detach(self, s: Session) -> None:
        """``s`` is no longer connected here."""
        self._since.pop(s, None)
        for k in self._held.pop(s, {}).values():
            self._unwant(k)

    def _want(self, k: str) -> asyncio.Future[None] | None:
        n = self.demand.get(k, 0)
        self.demand[k] = n + 1
        if not self.several:
            return None
        if k == WILD:
            if not n:
                self._wild_since = now_ms()
                self._listed = 0.0
                self.broker.spawn(self._check())
            return None
        tt = self.tails.get(k)
        if tt is None:
            tt = self.tails[k] = _TopicTail(self, k, now_ms())
            self.broker.spawn(tt.position())
        return tt.ready

    def _unwant(self, k: str) -> None:
        n = self.demand.get(k, 0) - 1
        if n > 0:
            self.demand[k] = n
            return
        self.demand.pop(k, None)
        if k == WILD:
            self._listed = 0.0
            self.broker.spawn(self._check())  # the topics no one else wants are let go
        elif not self._wanted(k):
            tt = self.tails.pop(k, None)
            if tt is not None:
                tt.stop()

    # -- one connection per client id in the fleet

    def _kick(self, cid: str) -> None:
        """A CONNECT of ``cid`` here: the other gateways close an older connection of it (MQTT
        wants client ids unique; a persistent session's takeover does this through its record,
        fleet.py, a clean session has none)."""
        if self._kicker is None:
            self._kicker = self.broker.spawn(self._send_kicks())
        self._kicks.append([cid, None, now_ms()])

    async def _send_kicks(self) -> None:
        """The notes of :meth:`_kick`, one batch on its way at a time: the CONNECTs of a storm
        that arrive meanwhile go in the next (a note call per loop turn was a broker call, a
        wake of the other gateway's long poll and its answer per ~4 CONNECTs)."""
        try:
            await asyncio.sleep(0)  # every CONNECT of this loop turn in one note list
            while self._kicks:
                kicks, self._kicks = self._kicks, []
                f = self.fleet
                feed = f.feed
                if feed is None:
                    return
                for g in [g for g in f.live if g != f.gid and f.alive(g)]:
                    for b in self._brokers:  # through any broker the other gateway watches
                        try:
                            await feed.door_notify(b, g, kicks)
                            break
                        except Exception as e:
                            log.debug("mqtt tail: CONNECT notes to %s via %s: %s", g, b, e)
        finally:
            self._kicker = None

    def connected_elsewhere(self, cid: str, at_ms: int) -> None:
        """Another gateway took a CONNECT of ``cid`` at ``at_ms``: a clean session's connection
        here made before that is closed, as a takeover on one gateway closes it."""
        b = self.broker
        s = b.sessions.get(cid)
        if s is None or s.persistent or s.conn is None:
            return  # (a persistent session moves by its record: fleet.py)
        since = self._since.get(s)
        if since is None or since >= at_ms:
            return  # connected here after that CONNECT: this one is the newest
        conn = s.conn
        conn.close(RC_SESSION_TAKEN_OVER, "session taken over", publish_will=True)
        b.detach(conn)

    # -- stamps on what this gateway publishes

    def stamp(self, topic: str) -> str:
        """The origin stamp of the next message this gateway stores in ``topic``."""
        seq = self._seq
        n = seq.get(topic, 0)
        if not n and len(seq) >= MAX_SEQ_TOPICS:  # a new epoch: every counter starts again
            seq.clear()
            self._epoch += 1
            self._origin = f"{self.fleet.gid}.{self._epoch}"
        seq[topic] = n + 1
        return f"{self._origin}:{n}"

    # -- what the readers bring

    def take(self, tt: _TopicTail, m: StoredMessage) -> None:
        props = m.properties
        stamp = props.get(P_ORIGIN) if props else None
        if not stamp:
            return  # not stamped: stored while its gateway saw no other, or not an MQTT message
        origin, _, n = stamp.rpartition(":")
        if origin.startswith(self.fleet.gid):
            return  # this gateway's own: routed when it was published
        try:
            seq = int(n)
        except ValueError:
            return
        o = tt.orders.get(origin)
        if o is None:
            o = tt.orders[origin] = _Order()
        o.seen = time.monotonic()
        if seq == o.next:
            self._deliver(m)
            o.next = seq + 1
            held = o.held
            while o.next in held:
                self._deliver(held.pop(o.next))
                o.next += 1
            if not held and o.timer is not None:
                o.timer.cancel()
                o.timer = None
        elif seq > o.next:  # a gap (or the origin's first message): wait for what is missing
            o.held[seq] = m
            if len(o.held) > MAX_HELD:
                self._flush(o)
            elif o.timer is None:
                o.timer = asyncio.get_running_loop().call_later(GAP_S, self._flush, o)
        else:  # its gap was given up on: late, but not lost
            self._deliver(m)

    def _flush(self, o: _Order) -> None:
        """What waited :data:`GAP_S` goes out in sequence; the numbers missing are given up."""
        o.timer = None
        held = o.held
        if not held:
            return
        for seq in sorted(held):
            self._deliver(held[seq])
        o.next = max(held) + 1
        held.clear()

    def _deliver(self, m: StoredMessage) -> None:
        props = m.properties
        topic = props.get(P_TOPIC)
        if not topic:
            return
        subs, _groups = self.broker.routing.match(topic)  # (shared groups: fleet_share.py)
        if not subs:
            return
        out = None
        access = self.broker.access
        publisher = props.get(P_MQTT_CLIENT_ID)
        for sub in subs:
            s = sub.session
            conn = s.conn
            if conn is None or conn.closed:
                continue  # a routing copy, or offline: QoS 0 is not kept for it
            if out is None:
                out = outgoing_from_stored(props, m.body, m.topic)
                if out.expired(now_ms()):
                    return
            if sub.lmq and s.persistent:
                continue  # through its queue: the publishing gateway routed it by its copy
            q = sub.qos if sub.qos < out.qos else out.qos
            if sub.no_local and publisher == s.client_id:
                continue
            if access.enforced and not access.can_read(s, topic):
                continue
            if q and len(s.inflight) >= 4 * conn.window:
                self.dropped += 1
                continue
            conn.deliver(out, q, sub.rap and props.get(P_RETAIN) == "1", Routing.sub_ids(s, topic, sub))
            self.delivered += 1
