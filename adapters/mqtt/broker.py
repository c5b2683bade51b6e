"""The MQTT broker logic: connections, sessions, routing into the unified store, delivery.

How MQTT maps onto the one model (see also README, "MQTT door"):

- A PUBLISH to ``a/b/c`` becomes one stored message in unified topic ``a``
  (``gateway.naming``) with ``protocol = "mqtt"``, the full MQTT topic in
  property ``mqtt_topic``, the QoS in ``mqtt_qos``, v5 user properties as plain
  properties and the other v5 properties as ``mqtt_*`` properties. Any
  processor pop or pull of topic ``a`` reads it, body and properties intact.
- At publish time the topic-filter trie finds the matching subscriptions. Each
  QoS 1/2 subscription owns a light message queue (``%LMQ%mqtt/<client>/<n>``);
  the message is multi-dispatched into the LMQs of every matching subscription
  (``Message.extra_dispatch``: body stored once), so nothing ever scans topics.
- A connected session reads its LMQs with the processor's *pull* by offset and
  records progress as the committed offset of consumer group ``mqtt``. Why
  pull and not pop for these: an LMQ has exactly one reader, and MQTT wants
  in-order delivery and, after a reconnect, the unacknowledged messages again,
  first, in order, with DUP set and their original packet ids -- exactly what
  "resume from the committed floor" gives, while pop's invisible-time
  redelivery through a retry topic would reorder and duplicate behind the
  client's back. Shared subscriptions (``$share/g/f``) are the opposite case
  (several readers, load split, no order promise), so their one LMQ per group
  is consumed with *pop/ack*, and a member that leaves releases its in-flight
  messages to the others (change-invisible 0).
- QoS 0 (a QoS 0 publish, or a QoS 0 subscription) is written to the store for
  every other reader but delivered to online subscribers straight from memory;
  a QoS 0 message for an offline session is dropped, as Mosquitto does.
- Retained messages and persistent sessions are small state written through
  the processor's durable key-value store (``mqtt.retained``, ``mqtt.sessions``).
- Messages other doors send with an ``mqtt_topic`` property (AMQP ``amq.topic``
  with routing key ``a.b.c`` is MQTT ``a/b/c``) reach MQTT subscribers through
  the processor's router seam (:meth:`MQTTBroker.route` / ``after_send``).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import struct
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Coroutine

from core_broker.errors import MessageTooLargeError, StoreFullError, TopicNotFoundError, UnimqError
from core_broker.model import DispatchTarget, Message
from gateway.api import MessagingAPI
from gateway.context import RequestContext
from gateway.lmq_reader import LaneRuns, MemoryBudget, commit_floor, committed_floor, pull_lane
from gateway.naming import P_MQTT_QOS, P_MQTT_TOPIC

from . import codec as C
from .codec import Decoder, MQTTProtocolError, encode, encode_properties, encode_publish
from .session import SESSION_NEVER_EXPIRES, Cursor, Inflight, Outgoing, Session, Subscription
from .acl import READ, WRITE, Acl, load_acl_file
from .passwords import load_password_file
from .passwords import verify as verify_password
from .sys_topics import SysTopics
from .topics import TopicTrie, filter_matches, lmq_safe, parse_shared, unified_topic, validate_filter

log = logging.getLogger("unimq.mqtt")

__all__ = ["MQTTConfig", "MQTTBroker", "Connection", "outgoing_from_stored"]

KV_SESSIONS = "mqtt.sessions"
KV_RETAINED = "mqtt.retained"
OFFSET_GROUP = "mqtt"
LMQ_PREFIX = "%LMQ%mqtt/"
SHARE_LMQ_PREFIX = "%LMQ%mqtt-share/"
# Per message kept in a session's in-memory queue: the payload plus this much bookkeeping
# (the Outgoing, its topic bytes, the tuple and the deque slot), counted against
# MQTTConfig.mem_queue_bytes.
MEM_ENTRY_OVERHEAD = 256

# message properties this door writes (everything else is a user property)
P_TOPIC = P_MQTT_TOPIC
P_QOS = P_MQTT_QOS
P_RETAIN = "mqtt_retain"
P_EXPIRY_AT = "mqtt_expiry_at"
P_CONTENT_TYPE = "mqtt_content_type"
P_RESPONSE_TOPIC = "mqtt_response_topic"
P_CORRELATION = "mqtt_correlation_data"  # base64
P_PAYLOAD_FORMAT = "mqtt_payload_format"
_QOS_STR = ("0", "1", "2")
_PUBACK = struct.Struct(">BBH").pack  # a 3.1.1 (or success) PUBACK: type, length 2, packet id
MQTT_KEYS = frozenset({P_TOPIC, P_QOS, P_RETAIN, P_EXPIRY_AT, P_CONTENT_TYPE, P_RESPONSE_TOPIC, P_CORRELATION,
                       P_PAYLOAD_FORMAT})


@dataclass
class MQTTConfig:
    """Knobs of the MQTT door (``mqtt_*`` settings; see README)."""

    allow_anonymous: bool = True
    users: dict[str, str] = field(default_factory=dict)
    # A Mosquitto password file (mosquitto_passwd): its users are accepted beside ``users``.
    password_file: str = ""
    # A Mosquitto ACL file (acl.py): with one, clients get only the topic rights it grants.
    acl_file: str = ""
    # Outbound QoS 1/2 window per session: 3.1.1 clients get this; v5 clients the smaller
    # of this and their Receive Maximum.
    max_inflight: int = 256
    # Receive Maximum announced to v5 clients (inbound QoS 1/2 not yet acknowledged).
    receive_maximum: int = 1024
    topic_alias_maximum: int = 64
    # Largest packet accepted (fixed header included); bigger closes the connection (0x95).
    max_packet_size: int = 4 * 1024 * 1024 + 65536
    # 0: accept the client's keepalive; else impose this (v5 Server Keep Alive).
    server_keepalive: int = 0
    # Mosquitto's max_keepalive: a cap, not an override. A client asking for more (or for 0,
    # no keepalive) is held to this (v5: told so as Server Keep Alive); one asking for less
    # keeps its own. 0: no cap.
    max_keepalive: int = 0
    # Upper bound for a v5 session expiry interval (seconds).
    max_session_expiry: int = SESSION_NEVER_EXPIRES
    # Bytes waiting in a client's socket buffer past which QoS 0 messages to it are dropped.
    qos0_drop_buffer: int = 8 * 1024 * 1024
    # How long a CONNECT may take to arrive after the TCP connection opens.
    connect_timeout_s: float = 10.0
    # Bytes of just-stored QoS 1/2 messages kept in memory, over all connected sessions
    # that are behind, so that delivering them needs no read back from the store. Past
    # this, a session's queue is read from the store (pull by offset) as usual.
    mem_queue_bytes: int = 256 * 1024 * 1024
    # Seconds between two rounds of $SYS/broker/... statistics (see sys_topics.py); 0: none.
    sys_interval_s: float = 10.0


def effective_keepalive(requested: int, v5: bool, cfg: MQTTConfig) -> int:
    """The keepalive (seconds) a connection is held to: 1.5 times it of silence drops it.

    ``server_keepalive`` imposes one value on v5 clients (it has a way to say so);
    ``max_keepalive`` caps every client's, as Mosquitto's ``max_keepalive`` does (which
    refuses a 3.1.1 client above the cap instead: here it is held to the cap).
    """
    if v5 and cfg.server_keepalive:
        return cfg.server_keepalive
    cap = cfg.max_keepalive
    if cap and (requested == 0 or requested > cap):
        return cap
    return requested


def _now_ms() -> int:
    return int(time.time() * 1000)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("unimq")
    except Exception:  # run from a checkout that was never installed
        return "dev"


# ------------------------------------------------------------------ message mapping


def message_properties(topic: str, qos: int, retain: bool, props: dict[str, Any] | None) -> dict[str, str]:
    """The unified-model properties of an MQTT PUBLISH."""
    out = {P_TOPIC: topic, P_QOS: str(qos)}
    if retain:
        out[P_RETAIN] = "1"
    if props:
        for k, v in props.get("user_property", ()):
            out[k] = v
        if "message_expiry_interval" in props:
            out[P_EXPIRY_AT] = str(_now_ms() + props["message_expiry_interval"] * 1000)
        if "content_type" in props:
            out[P_CONTENT_TYPE] = props["content_type"]
        if "response_topic" in props:
            out[P_RESPONSE_TOPIC] = props["response_topic"]
        if "correlation_data" in props:
            out[P_CORRELATION] = base64.b64encode(props["correlation_data"]).decode()
        if "payload_format_indicator" in props:
            out[P_PAYLOAD_FORMAT] = str(props["payload_format_indicator"])
    return out


def forward_props(props: dict[str, Any] | None) -> dict[str, Any] | None:
    """The v5 properties of a received PUBLISH that are forwarded to subscribers as they are."""
    if not props:
        return None
    fwd = {k: v for k, v in props.items() if k not in ("topic_alias", "message_expiry_interval",
                                                         "subscription_identifier")}
    return fwd or None


def v5_props_of(props: dict[str, str]) -> dict[str, Any] | None:
    """The v5 PUBLISH properties a stored message carries (for v5 subscribers only)."""
    v5: dict[str, Any] = {}
    users = [(k, v) for k, v in props.items() if k not in MQTT_KEYS and not k.startswith("__")]
    if P_PAYLOAD_FORMAT in props:
        v5["payload_format_indicator"] = 1 if props[P_PAYLOAD_FORMAT] == "1" else 0
    if P_CONTENT_TYPE in props:
        v5["content_type"] = props[P_CONTENT_TYPE]
    if P_RESPONSE_TOPIC in props:
        v5["response_topic"] = props[P_RESPONSE_TOPIC]
    if P_CORRELATION in props:
        try:
            v5["correlation_data"] = base64.b64decode(props[P_CORRELATION])
        except (ValueError, TypeError):
            pass
    if users:
        v5["user_property"] = users
    return v5 or None


def outgoing_from_stored(props: dict[str, str], body: bytes, fallback_topic: str) -> Outgoing:
    """Rebuild the outbound form of a stored message (LMQ delivery, retained reload).

    The v5 properties are derived lazily (only a v5 subscriber needs them)."""
    topic = props.get(P_TOPIC) or fallback_topic
    q = props.get(P_QOS)
    qos = 1 if q is None else (0 if q == "0" else 2 if q == "2" else 1)
    expiry_at = 0
    e = props.get(P_EXPIRY_AT)
    if e is not None:
        try:
            expiry_at = int(e)
        except ValueError:
            expiry_at = 0
    out = Outgoing(topic, body, qos, props.get(P_RETAIN) == "1", None, expiry_at)
    out.raw = props
    return out


# ------------------------------------------------------------------ shared subscriptions


class SharedGroup:
    """All members of one ``$share/<group>/<filter>``; one LMQ consumed by pop/ack."""

    __slots__ = ("group", "filter", "members", "lmq", "lmq_ready", "cgroup", "rr", "pumping", "pending")

    def __init__(self, group: str, flt: str) -> None:
        self.group = group
        self.filter = flt
        self.members: dict[str, Subscription] = {}  # client id -> subscription
        self.lmq = f"{SHARE_LMQ_PREFIX}{lmq_safe(group)}/{lmq_safe(flt)}"
        self.lmq_ready = False
        self.cgroup = "mqtt-share-" + lmq_safe(group)
        self.rr = 0
        self.pumping = False
        self.pending = 0

    @property
    def qos(self) -> int:
        return max((s.qos for s in self.members.values()), default=0)

    def online(self) -> list[Subscription]:
        return [s for s in self.members.values() if s.session.conn is not None and not s.session.conn.closed]


# ------------------------------------------------------------------ broker


class _Plan:
    """Where one PUBLISH goes (see :meth:`MQTTBroker._plan`)."""

    __slots__ = ("ut", "tb", "targets", "lmq_subs", "direct", "wake_groups", "matched")

    def __init__(self, ut: str, tb: bytes, targets: tuple[DispatchTarget, ...],
                 lmq_subs: tuple[Subscription | None, ...], direct: tuple[Subscription, ...],
                 wake_groups: tuple[SharedGroup, ...], matched: bool) -> None:
        self.ut = ut  # unified topic
        self.tb = tb  # the MQTT topic, encoded
        self.targets = targets  # the LMQs, in the order of lmq_subs
        self.lmq_subs = lmq_subs  # QoS 1/2 subscriptions (None: a shared group's LMQ)
        self.direct = direct  # QoS 0 deliveries, straight from memory to those online
        self.wake_groups = wake_groups
        self.matched = matched


def PubItem(topic: str, payload: bytes, qos: int, retain: bool, props: dict[str, Any] | None) -> C.Publish:
    """One message to publish: a PUBLISH packet's fields (client publishes are passed as they are)."""
    return C.Publish(topic, payload, qos, retain, False, 0, props)


class MQTTBroker:
    """Sessions, subscriptions, retained messages; talks to the store only through the processor."""

    def __init__(self, processor: MessagingAPI, config: MQTTConfig | None = None) -> None:
        self.processor = processor
        self.config = config or MQTTConfig()
        self.ctx = RequestContext(protocol="mqtt", client_id="mqtt-door")
        self.sessions: dict[str, Session] = {}
        self.trie = TopicTrie()
        self.groups: dict[tuple[str, str], SharedGroup] = {}
        self.retained: dict[str, Outgoing] = {}
        self.connections: set[Connection] = set()
        self._route_cache: dict[str, tuple[list[Subscription], list[SharedGroup]]] = {}
        self._plans: dict[tuple[str, int], _Plan] = {}  # (topic, qos) -> plan (see _plan)
        self._route_gen = 0  # bumped whenever subscriptions change (plans made before are stale)
        self._unified: dict[str, str] = {}  # MQTT topic -> unified topic (cache)
        # messages other doors are sending to MQTT subscribers: id(message) -> plan
        self._gone_lanes: dict[str, list[str]] = {}  # LMQ being deleted -> brokers that held a lane
        self._xroute: dict[int, tuple[Outgoing, list[tuple[Subscription, DispatchTarget]], list[Subscription],
                                      list[SharedGroup]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._dirty_sessions: set[Session] = set()
        self._dirty_wake = asyncio.Event()  # set when _dirty_sessions stops being empty
        self.stats = {"qos0_dropped": 0}
        self.mem = MemoryBudget(self.config.mem_queue_bytes)  # every cursor's in-memory window (_mem_push)
        # counters for $SYS (sys_topics.py): PUBLISH packets and bytes in and out since start
        self.pub_in = self.pub_out = self.bytes_in = self.bytes_out = 0
        self.sys = SysTopics(self, self.config.sys_interval_s, _version())
        # users of a Mosquitto password file (read at start: a bad file stops the door there)
        self.hashed_users = load_password_file(self.config.password_file) if self.config.password_file else {}
        self.acl: Acl | None = load_acl_file(self.config.acl_file) if self.config.acl_file else None
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self._load()
        self._flusher = self.loop.create_task(self._flush_loop(), name="mqtt-offsets")
        self.sys.start()
        if hasattr(self.processor, "add_router"):
            self.processor.add_router(self)  # messages other doors send on MQTT topics

    async def stop(self) -> None:
        if hasattr(self.processor, "remove_router"):
            self.processor.remove_router(self)
        await self.sys.stop()
        for conn in list(self.connections):
            conn.close(C.RC_SERVER_SHUTTING_DOWN, "server shutting down", publish_will=False)
        if self._flusher is not None:
            self._flusher.cancel()
            try:
                await self._flusher
            except asyncio.CancelledError:
                pass
        for s in list(self.sessions.values()):
            for f in s.inflight.values():
                if f.receipt and f.lmq:
                    await self._release_shared(s, f)
            s.dirty.update(s.cursors)
            self._dirty_sessions.add(s)
            if s.persistent:
                self.spawn(self._save_session(s))
        await self._commit_offsets()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: asyncio.Task[Any]) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.error("mqtt background task failed", exc_info=t.exception())

    async def _load(self) -> None:
        """Rebuild retained messages and persistent sessions written before a restart."""
        now = _now_ms()
        for topic, raw in (await self.processor.kv_items(self.ctx, KV_RETAINED)).items():
            try:
                d = json.loads(raw)
                out = outgoing_from_stored(d["x"], base64.b64decode(d["b"]), topic)
            except (ValueError, KeyError, TypeError):
                log.warning("dropping unreadable retained message for %r", topic)
                continue
            if not out.expired(now):
                self.retained[topic] = out
        for cid, raw in (await self.processor.kv_items(self.ctx, KV_SESSIONS)).items():
            try:
                d = json.loads(raw)
                s = Session(cid, d["v"], d["e"])
                s.lmq_seq = d["n"]
                s.disconnected_at = d["d"] or now
                s.qos2_in = {int(pid) for pid in d.get("q", ()) if 0 < int(pid) < 65536}
                s.pubrel = {int(pid) for pid in d.get("r", ()) if 0 < int(pid) < 65536}
                s.username = d.get("u")
                for key, qos, nl, rap, rh, sid, lmq in d["s"]:
                    group, flt = parse_shared(key)
                    sub = Subscription(flt, qos, s, no_local=bool(nl), rap=bool(rap), rh=rh, sub_id=sid, lmq=lmq,
                                       group=group)
                    s.subs[key] = sub
            except (ValueError, KeyError, TypeError, MQTTProtocolError):
                log.warning("dropping unreadable MQTT session %r", cid)
                continue
            self.sessions[cid] = s
            s.ctx = RequestContext(protocol="mqtt", client_id=cid)
            saved_lanes = d.get("l") or {}
            for sub in s.subs.values():
                self._index_sub(sub)
                if sub.lmq and not sub.group:
                    # the lanes saved (none in the format before lanes) and the LMQ's route broker,
                    # where the single cursor of that format was committed
                    brokers = set(saved_lanes.get(sub.lmq) or ()) if isinstance(saved_lanes, dict) else set()
                    brokers.update(await self._route_brokers(sub.lmq))
                    for b in sorted(brokers):
                        key = (sub.lmq, b)
                        s.cursors[key] = Cursor(b, await self._committed(sub.lmq, b), must_pull=True)
                        s.pending[key] = 1
            self._arm_expiry(s)
        if self.sessions:
            log.info("mqtt: restored %d sessions, %d retained messages", len(self.sessions), len(self.retained))

    async def _route_brokers(self, lmq: str) -> list[str]:
        try:
            return list((await self.processor.query_route(self.ctx, lmq)).brokers)
        except UnimqError:
            return []

    async def _committed(self, lmq: str, broker: str) -> int:
        """A lane's committed offset (or the start of its part of the LMQ) on its broker."""
        try:
            return await committed_floor(self.processor, self.ctx, OFFSET_GROUP, lmq, broker)
        except UnimqError:
            return 0

    # -- offsets

    async def _flush_loop(self) -> None:
        # Asleep while no session has anything to commit; then one commit per 0.2 s at most,
        # taking in everything that became dirty meanwhile.
        while True:
            await self._dirty_wake.wait()
            self._dirty_wake.clear()
            await asyncio.sleep(0.2)
            try:
                await self._commit_offsets()
            except Exception:  # pragma: no cover - keep committing
                log.exception("mqtt: committing offsets failed")

    async def _commit_offsets(self) -> None:
        sessions, self._dirty_sessions = self._dirty_sessions, set()
        for s in sessions:
            dirty, s.dirty = s.dirty, set()
            for key in dirty:
                cur = s.cursors.get(key)
                if cur is None:
                    continue
                try:
                    await commit_floor(self.processor, self.ctx, OFFSET_GROUP, key[0], cur)
                except TopicNotFoundError:
                    pass

    # -- sessions

    def _arm_expiry(self, s: Session) -> None:
        if s.expiry_handle is not None:
            s.expiry_handle.cancel()
            s.expiry_handle = None
        if s.conn is not None or s.expiry == SESSION_NEVER_EXPIRES:
            return
        assert self.loop is not None
        left = s.disconnected_at / 1000 + s.expiry - time.time()
        s.expiry_handle = self.loop.call_later(max(left, 0), lambda: self.spawn(self._expire(s)))

    async def _expire(self, s: Session) -> None:
        if s.conn is None and self.sessions.get(s.client_id) is s:
            await self.end_session(s)

    async def end_session(self, s: Session) -> None:
        """Discard a session: subscriptions, LMQs, durable record, shared in-flight messages."""
        await self.forget_session(s)

    def forget_session(self, s: Session) -> Coroutine[Any, Any, None]:
        """Take ``s`` out of routing *now*; return the coroutine that cleans up the rest.

        The synchronous part matters: a CONNECT that takes over or replaces a session
        must not find the old one any more, whenever the cleanup task runs.
        """
        if self.sessions.get(s.client_id) is s:
            del self.sessions[s.client_id]
        for h in (s.expiry_handle, s.will_handle):
            if h is not None:
                h.cancel()
        s.expiry_handle = s.will_handle = None
        shared = [f for f in s.inflight.values() if f.receipt]
        s.inflight.clear()
        lmqs = [self._unindex_sub(s, sub) for sub in s.subs.values()]
        s.subs.clear()
        for cur in s.cursors.values():
            self._mem_clear(cur)
        s.cursors.clear()
        s.pending.clear()
        s.dirty.clear()

        async def cleanup() -> None:
            for f in shared:
                await self._release_shared_and_wake(s, f)
            for lmq in lmqs:
                if lmq:
                    await self._delete_lmq(lmq)
            await self.processor.kv_put(self.ctx, KV_SESSIONS, s.client_id, None)

        return cleanup()

    async def _save_session(self, s: Session) -> None:
        if s.persistent and self.sessions.get(s.client_id) is s:
            await self.processor.kv_put(self.ctx, KV_SESSIONS, s.client_id, s.to_json())

    # -- subscriptions

    def _routes_changed(self) -> None:
        self._route_cache.clear()
        self._plans.clear()
        self._route_gen += 1

    def _index_sub(self, sub: Subscription) -> None:
        self._routes_changed()
        s = sub.session
        if sub.sub_id:
            s.has_sub_ids = True
        if sub.group:
            key = (sub.group, sub.filter)
            g = self.groups.get(key)
            if g is None:
                g = self.groups[key] = SharedGroup(sub.group, sub.filter)
                self.trie.add(sub.filter, ("$share", sub.group), g)
            g.members[s.client_id] = sub
            sub.lmq = g.lmq
        else:
            self.trie.add(sub.filter, s.client_id, sub)

    def _unindex_sub(self, s: Session, sub: Subscription) -> str | None:
        """Remove a subscription from routing; return the LMQ that is no longer needed, if any."""
        self._routes_changed()
        if sub.group:
            g = self.groups.get((sub.group, sub.filter))
            if g is not None:
                g.members.pop(s.client_id, None)
                if not g.members:
                    del self.groups[(sub.group, sub.filter)]
                    self.trie.remove(sub.filter, ("$share", sub.group))
                    return g.lmq
            return None
        self.trie.remove(sub.filter, s.client_id)
        if sub.lmq:
            lanes = [k for k in s.cursors if k[0] == sub.lmq]
            for key in lanes:
                self._drop_lane(s, key)
            self._gone_lanes[sub.lmq] = [b for _, b in lanes]
            if len(self._gone_lanes) > 10_000:  # names whose deletion never ran
                self._gone_lanes.clear()
            return sub.lmq
        return None

    def _drop_lane(self, s: Session, key: tuple[str, str]) -> None:
        cur = s.cursors.pop(key, None)
        if cur is not None:
            self._mem_clear(cur)
        s.runs.pop(key[0], None)
        s.pending.pop(key, None)
        s.dirty.discard(key)

    async def _drop_sub(self, s: Session, sub: Subscription) -> None:
        lmq = self._unindex_sub(s, sub)
        if lmq:
            await self._delete_lmq(lmq)

    async def _delete_lmq(self, lmq: str) -> None:
        try:
            # every broker holding a lane must know the topic, so that deleting it reaches
            # that broker's part too (the name is used again by a later session of the client)
            for b in self._gone_lanes.pop(lmq, ()):
                await self.processor.host_lmq(self.ctx, lmq, b)
            await self.processor.delete_topic(self.ctx, lmq)
        except TopicNotFoundError:
            pass
        except UnimqError as e:  # pragma: no cover
            log.warning("mqtt: could not delete %s: %s", lmq, e)

    async def subscribe(self, conn: "Connection", pkt: C.Subscribe) -> None:
        s = conn.session
        assert s is not None
        v5 = conn.version == C.MQTT_5
        sid = 0
        if v5:
            ids = pkt.properties.get("subscription_identifier")
            if ids:
                sid = ids[0]
        codes: list[int] = []
        new_subs: list[tuple[Subscription, bool]] = []
        changed = False
        for key, opts in pkt.subscriptions:
            try:
                group, flt = parse_shared(key)
                validate_filter(flt)
                if group is not None and opts.no_local and v5:
                    raise MQTTProtocolError(C.RC_PROTOCOL_ERROR, "no local on a shared subscription")
            except MQTTProtocolError as e:
                if e.reason_code == C.RC_PROTOCOL_ERROR:
                    raise
                codes.append(C.RC_TOPIC_FILTER_INVALID if v5 else 0x80)
                continue
            if not self.can_subscribe(s, flt):
                codes.append(C.RC_NOT_AUTHORIZED if v5 else 0x80)
                continue
            old = s.subs.get(key)
            if old is not None:
                existed = True
                old.qos, old.no_local, old.rap, old.rh, old.sub_id = (opts.qos, opts.no_local,
                                                                     opts.retain_as_published,
                                                                     opts.retain_handling, sid)
                if old.sub_id:
                    s.has_sub_ids = True
                sub = old
                if group:
                    sub.lmq = self.groups[(group, flt)].lmq
                elif opts.qos > 0 and not sub.lmq:
                    s.lmq_seq += 1
                    sub.lmq = f"{LMQ_PREFIX}{lmq_safe(s.client_id)}/{s.lmq_seq}"
                    # its lanes (one per broker storing its messages) start with the first message
                self._routes_changed()
            else:
                existed = False
                sub = Subscription(flt, opts.qos, s, no_local=opts.no_local, rap=opts.retain_as_published,
                                   rh=opts.retain_handling, sub_id=sid, group=group)
                if opts.qos > 0 and not group:
                    s.lmq_seq += 1
                    sub.lmq = f"{LMQ_PREFIX}{lmq_safe(s.client_id)}/{s.lmq_seq}"
                    # its lanes (one per broker storing its messages) start with the first message
                s.subs[key] = sub
                self._index_sub(sub)
            changed = True
            codes.append(opts.qos)
            new_subs.append((sub, existed))
        # create the LMQs now, so that any door's router may dispatch into them at once
        for sub, _ in new_subs:
            if sub.group:
                g = self.groups.get((sub.group, sub.filter))
                if g is not None and not g.lmq_ready and sub.qos > 0:
                    await self._ensure_lmq(g.lmq)
                    g.lmq_ready = True
            elif sub.lmq and not sub.lmq_ready:
                await self._ensure_lmq(sub.lmq)
                sub.lmq_ready = True
        conn.send(encode(C.Suback(pkt.packet_id, codes), conn.version))
        if changed and s.persistent:
            await self._save_session(s)
        # retained messages (not for shared subscriptions)
        now = _now_ms()
        for sub, existed in new_subs:
            if sub.group or sub.rh == 2 or (sub.rh == 1 and existed):
                continue
            for topic, out in list(self.retained.items()):
                if out.expired(now):
                    self.retained.pop(topic, None)
                    continue
                if filter_matches(sub.filter, topic) and self.can_read(s, topic):
                    conn.deliver(out, min(out.qos, sub.qos), True, [sub.sub_id] if sub.sub_id else None)
            if sub.filter[:1] == "$":  # a leading wildcard never matches $SYS (MQTT 4.7.2)
                for topic, out in self.sys.retained.items():
                    if filter_matches(sub.filter, topic) and self.can_read(s, topic):
                        conn.deliver(out, 0, True, [sub.sub_id] if sub.sub_id else None)

    async def unsubscribe(self, conn: "Connection", pkt: C.Unsubscribe) -> None:
        s = conn.session
        assert s is not None
        codes = []
        for key in pkt.filters:
            sub = s.subs.pop(key, None)
            if sub is None:
                codes.append(C.RC_NO_SUBSCRIPTION_EXISTED)
                continue
            await self._drop_sub(s, sub)
            codes.append(C.RC_SUCCESS)
        s.has_sub_ids = any(x.sub_id for x in s.subs.values())
        conn.send(encode(C.Unsuback(pkt.packet_id, codes), conn.version))
        if s.persistent:
            await self._save_session(s)

    # -- routing and publishing

    def _route(self, topic: str) -> tuple[list[Subscription], list[SharedGroup]]:
        r = self._route_cache.get(topic)
        if r is not None:
            return r
        best: dict[str, Subscription] = {}
        groups: list[SharedGroup] = []
        for e in self.trie.match(topic):
            if isinstance(e, SharedGroup):
                groups.append(e)
                continue
            cid = e.session.client_id
            cur = best.get(cid)
            if cur is None or e.qos > cur.qos or (e.qos == cur.qos and e.lmq and not cur.lmq):
                best[cid] = e
        r = (list(best.values()), groups)
        if len(self._route_cache) > 20000:
            self._route_cache.clear()
        self._route_cache[topic] = r
        return r

    async def _ensure_lmq(self, name: str) -> None:
        await self.processor.create_topic(self.ctx, name, queues=1, exist_ok=True)

    async def _plan(self, topic: str, qos: int, publisher: str) -> "_Plan":
        """Where a PUBLISH of ``qos`` to ``topic`` goes: LMQs to dispatch into, QoS 0 subscribers.

        Cached per (topic, QoS) while the subscriptions do not change, when nothing in
        it depends on the message or its publisher (no shared groups: their round robin
        and pending count move per message; no no-local subscriptions), so a batch of
        publishes to a few topics builds its dispatch targets once, not per message.
        """
        gen = self._route_gen
        subs, groups = self._route(topic)
        targets: list[DispatchTarget] = []
        lmq_subs: list[Subscription | None] = []
        direct: list[Subscription] = []
        wake_groups: list[SharedGroup] = []
        cacheable = not groups
        acl = self.acl
        for sub in subs:
            if acl is not None and not self.can_read(sub.session, topic):
                continue
            if sub.no_local:
                cacheable = False
                if sub.session.client_id == publisher:
                    continue
            q = sub.qos if sub.qos < qos else qos
            if q == 0:
                direct.append(sub)
                continue
            lmq = sub.lmq
            if lmq is None:  # pragma: no cover - QoS>0 subscriptions always have one
                continue
            if not sub.lmq_ready:
                await self._ensure_lmq(lmq)
                sub.lmq_ready = True
            targets.append(DispatchTarget(lmq, 0))
            lmq_subs.append(sub)
        for g in groups:
            if qos == 0 or g.qos == 0:
                online = g.online()
                if online:
                    g.rr += 1
                    direct.append(online[g.rr % len(online)])
                continue
            if not g.lmq_ready:
                await self._ensure_lmq(g.lmq)
                g.lmq_ready = True
            targets.append(DispatchTarget(g.lmq, 0))
            lmq_subs.append(None)
            g.pending += 1
            wake_groups.append(g)
        ut = self._unified.get(topic)
        if ut is None:
            if len(self._unified) > 50_000:
                self._unified.clear()
            ut = self._unified[topic] = unified_topic(topic)
        plan = _Plan(ut, topic.encode(), tuple(targets), tuple(lmq_subs), tuple(direct), tuple(wake_groups),
                     bool(subs or groups))
        if cacheable and gen == self._route_gen:
            if len(self._plans) > 20000:
                self._plans.clear()
            self._plans[(topic, qos)] = plan
        return plan

    async def publish(self, ctx: RequestContext, publisher: str, items: list[C.Publish]) -> list[int]:
        """Store ``items`` (one batch), dispatch them, deliver QoS 0 to online subscribers.

        Returns a v5 reason code per item (0, 0x10 no matching subscribers, or an
        error >= 0x80). Raises nothing for store errors: they become codes.
        """
        msgs: list[Message] = []
        fast: list[tuple[Outgoing, tuple[Subscription, ...]]] = []
        wake: set[Session] = set()
        wake_groups: set[SharedGroup] = set()
        # per message: its plan (the QoS 1/2 subscriptions it was dispatched to, in
        # extra_dispatch order) and the outbound form subscribers get
        plans: list[_Plan] = []
        outs: list[Outgoing | None] = []
        plan_cache = self._plans
        retained = False
        for it in items:
            topic = it.topic
            qos = it.qos
            plan = plan_cache.get((topic, qos))
            if plan is None:
                plan = await self._plan(topic, qos, publisher)
            if plan.wake_groups:
                wake_groups.update(plan.wake_groups)
            iprops = it.properties
            if iprops is None and not it.retain:
                props = {P_TOPIC: topic, P_QOS: _QOS_STR[qos]}
                expiry = 0
            else:
                props = message_properties(topic, qos, it.retain, iprops)
                expiry = int(props.get(P_EXPIRY_AT, 0))
                retained = retained or it.retain
            msgs.append(Message(plan.ut, it.payload, properties=props, protocol="mqtt", extra_dispatch=plan.targets))
            out = None
            if plan.lmq_subs or plan.direct:
                out = Outgoing(topic, it.payload, qos, it.retain, forward_props(iprops) if iprops else None, expiry,
                               plan.tb)
                if plan.direct:
                    fast.append((out, plan.direct))
            plans.append(plan)
            outs.append(out)
        codes: list[int]
        try:
            results = await self.processor.send(ctx, msgs)
            codes = [0 if p.matched else C.RC_NO_MATCHING_SUBSCRIBERS for p in plans]
            for res, plan, out in zip(results, plans, outs):
                subs_ = plan.lmq_subs
                if not subs_:
                    continue
                # our targets come first in extra_dispatch (other doors' routers append theirs)
                offsets = res.extra_offsets if len(res.extra_offsets) >= len(subs_) else None
                for j, sub in enumerate(subs_):
                    if sub is None:
                        continue
                    s = sub.session
                    if offsets is not None:
                        self._offer(s, sub, out, offsets[j], res.broker)  # type: ignore[arg-type]
                    else:  # no offsets (a remote broker that does not report them): read the store
                        self._must_pull(s, sub, res.broker)
                        wake.add(s)
        except MessageTooLargeError:
            codes = [C.RC_PACKET_TOO_LARGE] * len(items)
        except StoreFullError:
            codes = [C.RC_QUOTA_EXCEEDED] * len(items)
        except UnimqError as e:
            log.warning("mqtt: publish refused: %s", e)
            codes = [C.RC_NOT_AUTHORIZED if e.code in ("FORBIDDEN", "UNAUTHORIZED") else C.RC_UNSPECIFIED_ERROR] \
                * len(items)
        for out, direct in fast:
            for sub in direct:
                conn = sub.session.conn
                if conn is not None:
                    conn.deliver(out, 0, sub.rap and out.retain, self._sub_ids(sub.session, out.topic, sub))
        for s in wake:
            self.wake(s)
        for g in wake_groups:
            self.wake_group(g)
        if retained:
            for it, code in zip(items, codes):
                if it.retain and code < 0x80:
                    await self._retain(it)
        return codes

    # -- the processor's Router seam: messages sent by other doors (AMQP amq.topic, ...)

    def route(self, m: Message) -> list[DispatchTarget]:
        """Dispatch targets for a message another door is storing with an ``mqtt_topic``.

        AMQP's ``amq.topic`` with routing key ``a.b.c`` is stored as MQTT ``a/b/c``
        (RabbitMQ's MQTT-plugin convention); MQTT subscribers must see it like any
        MQTT publish. QoS is the message's ``mqtt_qos`` (1 when absent: stored, acked).
        """
        if m.protocol == "mqtt":
            return []  # the door routed its own publishes already
        props = m.properties
        topic = props.get(P_TOPIC) if props else None
        if not topic:
            return []
        subs, groups = self._route(topic)
        if not subs and not groups:
            return []
        out = outgoing_from_stored(props, m.body, m.topic)
        targets: list[DispatchTarget] = []
        lmq_subs: list[tuple[Subscription, DispatchTarget]] = []
        direct: list[Subscription] = []
        for sub in subs:
            if self.acl is not None and not self.can_read(sub.session, topic):
                continue
            q = sub.qos if sub.qos < out.qos else out.qos
            if q == 0 or not sub.lmq or not sub.lmq_ready:
                if sub.session.conn is not None:
                    direct.append(sub)
                continue
            t = DispatchTarget(sub.lmq, 0)
            targets.append(t)
            lmq_subs.append((sub, t))
        for g in groups:
            if out.qos and g.qos and g.lmq_ready:
                targets.append(DispatchTarget(g.lmq, 0))
                g.pending += 1
        if len(self._xroute) > 10_000:  # sends that failed never reach after_send
            self._xroute.clear()
        self._xroute[id(m)] = (out, lmq_subs, direct, groups)
        return targets

    def after_send(self, messages: Any, results: Any) -> None:
        """Live delivery of what :meth:`route` dispatched, once it is stored."""
        if not self._xroute:
            return
        for m, res in zip(messages, results):
            plan = self._xroute.pop(id(m), None)
            if plan is None or res is None:
                continue
            out, lmq_subs, direct, groups = plan
            extra = list(m.extra_dispatch)
            offsets = res.extra_offsets
            for sub, t in lmq_subs:
                try:
                    off = offsets[extra.index(t)]
                except (ValueError, IndexError):
                    self._must_pull(sub.session, sub, res.broker)
                    self.wake(sub.session)
                    continue
                self._offer(sub.session, sub, out, off, res.broker)
            for sub in direct:
                conn = sub.session.conn
                if conn is not None:
                    conn.deliver(out, 0, False, self._sub_ids(sub.session, out.topic, sub))
            for g in groups:
                if out.qos == 0 or g.qos == 0 or not g.lmq_ready:
                    online = g.online()
                    if online:
                        g.rr += 1
                        sub = online[g.rr % len(online)]
                        sub.session.conn.deliver(out, 0, False, [sub.sub_id] if sub.sub_id else None)
                else:
                    self.wake_group(g)

    async def _retain(self, it: C.Publish) -> None:
        if not it.payload:  # an empty retained message clears the topic's
            self.retained.pop(it.topic, None)
            await self.processor.kv_put(self.ctx, KV_RETAINED, it.topic, None)
            return
        props = message_properties(it.topic, it.qos, True, it.properties)
        out = outgoing_from_stored(props, it.payload, it.topic)
        self.retained[it.topic] = out
        value = json.dumps({"b": base64.b64encode(it.payload).decode(), "x": props}, separators=(",", ":"))
        await self.processor.kv_put(self.ctx, KV_RETAINED, it.topic, value.encode())

    @staticmethod
    def _sub_ids(s: Session, topic: str, sub: Subscription) -> list[int] | None:
        if not s.has_sub_ids:
            return None
        ids = [x.sub_id for x in s.subs.values() if x.sub_id and not x.group and filter_matches(x.filter, topic)]
        if sub.group and sub.sub_id:
            ids.append(sub.sub_id)
        return ids or None

    # -- delivery from LMQs (pull by offset)

    def wake(self, s: Session) -> None:
        conn = s.conn
        if s.pumping or conn is None or not s.pending:
            return
        # hysteresis: wait until an eighth of the window is free, so that the store is
        # read (and the task scheduled) once per batch, not once per acknowledgement
        if conn.window - s.outstanding() < (conn.window >> 3 or 1) and s.outstanding():
            return
        s.pumping = True
        self.spawn(self._pump(s))

    def _lane(self, s: Session, sub: Subscription, broker: str) -> Cursor | None:
        """``sub``'s lane on ``broker``, made on the first message that broker stored for it.

        A new lane starts at offset 0: the LMQ's part on that broker began with this
        subscription (its LMQ name is new), and earlier entries sent by concurrent
        publishes the door has not seen yet must not be skipped. None: ``sub`` is gone.
        """
        key = (sub.lmq, broker)
        cur = s.cursors.get(key)  # type: ignore[arg-type]
        if cur is None and sub.lmq and not sub.group and s.subs.get(sub.filter) is sub:
            lmq = sub.lmq
            others = [c for k, c in s.cursors.items() if k[0] == lmq]
            if others and lmq not in s.runs:
                # a second lane: from now on the order across lanes is recorded (see Session.runs);
                # what the first lane holds unread came before
                runs = s.runs[lmq] = LaneRuns()
                for c in others:
                    if c.end > c.read:
                        runs.note(c.broker, c.end - c.read)
            cur = s.cursors[key] = Cursor(broker)  # type: ignore[index]
            if s.persistent:  # the lane list is part of the saved session (read back after a restart)
                self.spawn(self._save_session(s))
        return cur

    def _must_pull(self, s: Session, sub: Subscription, broker: str) -> None:
        cur = self._lane(s, sub, broker)
        if cur is not None:
            cur.must_pull = True
            key = (sub.lmq, broker)
            s.pending[key] = s.pending.get(key, 0) + 1  # type: ignore[index]

    def _offer(self, s: Session, sub: Subscription, out: Outgoing, offset: int, broker: str) -> None:
        """A message was just stored at ``offset`` of ``sub``'s lane on ``broker``: send it, queue it,
        or leave it to a pull."""
        key = (sub.lmq, broker)
        cur = s.cursors.get(key)  # type: ignore[arg-type]
        if cur is None:
            cur = self._lane(s, sub, broker)
            if cur is None:
                return
        if offset >= cur.end:
            cur.end = offset + 1
        conn = s.conn
        mem = cur.window
        runs = s.runs.get(key[0]) if s.runs else None  # type: ignore[arg-type]
        if (conn is not None and not mem and cur.read == offset and not cur.must_pull and not s.pumping
                and conn.writable and s.outstanding() < conn.window and not conn.closed and not runs):
            self._deliver_lmq(s, conn, sub, cur, key, offset, out)  # type: ignore[arg-type]
            cur.read = offset + 1
            return
        if runs is not None:  # this LMQ has several lanes: remember the order across them
            runs.note(broker)
        if conn is None:
            return  # offline: it waits in the store
        if offset > mem[-1][0] if mem else offset >= cur.read:
            # a gap before it (messages past the budget) is read back from the store
            self._mem_push(cur, offset, out)
        s.pending[key] = s.pending.get(key, 0) + 1  # type: ignore[index]
        self.wake(s)

    def _mem_push(self, cur: Cursor, offset: int, out: Outgoing) -> None:
        """Keep a just-stored message for a session that is behind, within the byte budget
        (past it, it stays in the store only; the pump reads it from there)."""
        cur.hold(self.mem, offset, out, len(out.payload) + MEM_ENTRY_OVERHEAD)

    def _mem_popleft(self, cur: Cursor) -> tuple[int, Outgoing]:
        item = cur.window.popleft()
        cur.release(self.mem, len(item[1].payload) + MEM_ENTRY_OVERHEAD)
        return item

    def _mem_clear(self, cur: Cursor) -> None:
        cur.clear_window(self.mem)

    def _deliver_lmq(self, s: Session, conn: "Connection", sub: Subscription | None, cur: Cursor,
                     lmq: tuple[str, str], off: int, out: Outgoing) -> None:
        s.dirty.add(lmq)
        if not self._dirty_sessions:
            self._dirty_wake.set()
        self._dirty_sessions.add(s)
        if out.expiry_at and out.expired(_now_ms()):
            cur.settle(off)
            return
        q = out.qos if sub is None or sub.qos >= out.qos else sub.qos
        retain = bool(sub is not None and sub.rap and out.retain)
        sids = self._sub_ids(s, out.topic, sub) if sub is not None and s.has_sub_ids else None
        if q == 0:
            conn.deliver(out, 0, retain, sids)
            cur.settle(off)
            return
        pid = s.alloc_pid()
        s.inflight[pid] = Inflight(out, q, lmq, off, None, sids)
        if conn.version != C.MQTT_5:  # no properties, no packet size limit: the short way
            self.pub_out += 1
            conn.send(encode_publish(out.tb, out.payload, q, retain, False, pid, None))
        else:
            conn.send_publish(out, q, retain, False, pid, sids)

    async def _pump(self, s: Session) -> None:
        """Feed a connected session from its LMQs: in-memory queue first, then the store."""
        try:
            while True:
                conn = s.conn
                if conn is None or conn.closed or not s.pending:
                    return
                room = conn.window - s.outstanding()
                if room <= 0 or not conn.writable:
                    return  # an ack or resume_writing wakes us again
                progressed = False
                for lmq in list(s.pending):  # lanes (lmq, broker)
                    cur = s.cursors.get(lmq)
                    if cur is None:
                        s.pending.pop(lmq, None)
                        continue
                    sub = self._sub_of_lmq(s, lmq[0])
                    mem = cur.window
                    runs = s.runs.get(lmq[0]) if s.runs else None
                    limit = room
                    if runs:
                        head = self._run_head(s, lmq[0], runs)
                        if head is not None:
                            if head[0] != cur.broker:
                                continue  # another lane's messages were stored first
                            limit = min(room, head[1])
                    start = cur.read
                    if mem and room > 0:
                        took = 0
                        freed = 0
                        while mem and took < limit:
                            off, out = mem[0]
                            if off != cur.read:
                                if off > cur.read:
                                    break  # a gap: the store holds what comes before
                                mem.popleft()  # already delivered from the store
                                freed += len(out.payload) + MEM_ENTRY_OVERHEAD
                                continue
                            mem.popleft()
                            freed += len(out.payload) + MEM_ENTRY_OVERHEAD
                            self._deliver_lmq(s, conn, sub, cur, lmq, off, out)
                            cur.read = off + 1
                            took += 1
                        cur.release(self.mem, freed)
                        room -= took
                        if took or freed:
                            progressed = True
                    if runs:
                        runs.taken(cur.broker, cur.read - start)
                        limit -= cur.read - start
                    if room <= 0:
                        break
                    if (cur.must_pull or cur.read < cur.end) and limit > 0:
                        want = min(room, limit, 512)
                        if mem and mem[0][0] > cur.read:
                            want = min(want, mem[0][0] - cur.read)  # up to the in-memory part
                        start = cur.read
                        try:
                            r = await pull_lane(self.processor, lmq[0], cur, cur.read, want, s.ctx or self.ctx,
                                                self.ctx)
                        except TopicNotFoundError:
                            cur.must_pull = False
                            cur.end = cur.read
                            s.pending.pop(lmq, None)
                            continue
                        if s.conn is not conn or conn.closed or s.cursors.get(lmq) is not cur:
                            return
                        msgs = r.messages
                        if not msgs and r.next_offset > cur.read:
                            cur.skip_to(r.next_offset)  # retention removed what was never read
                            progressed = True
                        for m in msgs:
                            off = m.queue_offset
                            if off < cur.read:
                                continue
                            cur.skip_to(off)
                            self._deliver_lmq(s, conn, sub, cur, lmq, off,
                                              outgoing_from_stored(m.properties, m.body, m.topic))
                            cur.read = off + 1
                        while mem and mem[0][0] < cur.read:
                            self._mem_popleft(cur)
                        if msgs:
                            progressed = True
                            room -= len(msgs)
                        if len(msgs) < want:
                            cur.must_pull = False
                            if cur.end < cur.read:
                                cur.end = cur.read
                        if runs:
                            runs.taken(cur.broker, cur.read - start)
                    if cur.caught_up():
                        s.pending.pop(lmq, None)
                    if room <= 0:
                        break
                if not progressed:
                    return
        finally:
            s.pumping = False

    @staticmethod
    def _run_head(s: Session, lmq: str, runs: LaneRuns[str]) -> list[Any] | None:
        """The oldest run whose lane still has something to read."""

        def live(broker: str) -> bool:
            key = (lmq, broker)
            c = s.cursors.get(key)
            return c is not None and key in s.pending and not c.caught_up()

        return runs.head(live)

    @staticmethod
    def _sub_of_lmq(s: Session, lmq: str) -> Subscription | None:
        for sub in s.subs.values():
            if sub.lmq == lmq:
                return sub
        return None

    def acked(self, s: Session, f: Inflight) -> None:
        """A QoS 1 PUBACK or QoS 2 PUBREC arrived for ``f``."""
        if f.receipt is not None:
            self.spawn(self._ack_shared(s, f))
        elif f.lmq is not None:
            cur = s.cursors.get(f.lmq)
            if cur is not None:
                cur.settle(f.offset)
                s.dirty.add(f.lmq)
                if not self._dirty_sessions:
                    self._dirty_wake.set()
                self._dirty_sessions.add(s)

    # -- shared subscriptions (pop/ack)

    def wake_group(self, g: SharedGroup) -> None:
        if g.pumping:
            return
        g.pumping = True
        self.spawn(self._pump_group(g))

    async def _pump_group(self, g: SharedGroup) -> None:
        """Pop the group's LMQ into its online members, a small batch each, round robin."""
        try:
            while True:
                members = [m for m in g.online() if m.session.conn.writable]
                if not members:
                    return
                round_pending = g.pending
                progressed = False
                start = g.rr
                g.rr += 1
                for i in range(len(members)):
                    sub = members[(start + i) % len(members)]
                    s = sub.session
                    conn = s.conn
                    if conn is None or conn.closed:
                        continue
                    room = conn.window - s.outstanding()
                    if room <= 0:
                        continue
                    try:
                        got = await self.processor.pop(s.ctx or self.ctx, g.cgroup, g.lmq, min(room, 8), 3_600_000)
                    except TopicNotFoundError:
                        g.pending = 0
                        return
                    if s.conn is not conn or conn.closed:
                        for p in got:
                            await self.processor.change_invisible(self.ctx, g.cgroup, g.lmq, p.receipt_handle, 0)
                        continue
                    now = _now_ms()
                    for p in got:
                        out = outgoing_from_stored(p.message.properties, p.message.body, p.message.topic)
                        q = min(out.qos, sub.qos)
                        if out.expired(now) or q == 0:
                            if not out.expired(now):
                                conn.deliver(out, 0, False, [sub.sub_id] if sub.sub_id else None)
                            await self.processor.ack(self.ctx, g.cgroup, g.lmq, p.receipt_handle)
                            continue
                        pid = s.alloc_pid()
                        sids = [sub.sub_id] if sub.sub_id else None
                        s.inflight[pid] = Inflight(out, q, g.lmq, 0, p.receipt_handle, sids)
                        conn.send_publish(out, q, False, p.delivery_attempt > 1, pid, sids)
                    if got:
                        progressed = True
                if not progressed:
                    if g.pending == round_pending:
                        g.pending = 0
                        return
        finally:
            g.pumping = False

    def _group_of(self, lmq: str) -> SharedGroup | None:
        for g in self.groups.values():
            if g.lmq == lmq:
                return g
        return None

    async def _ack_shared(self, s: Session, f: Inflight) -> None:
        g = self._group_of(f.lmq or "")
        cgroup = g.cgroup if g else None
        if cgroup is None:
            return
        try:
            await self.processor.ack(self.ctx, cgroup, f.lmq, f.receipt)
        except UnimqError as e:
            log.debug("mqtt: shared ack failed: %s", e)
        if g is not None:
            self.wake_group(g)

    async def _release_shared(self, s: Session, f: Inflight) -> None:
        g = self._group_of(f.lmq or "")
        if g is None or f.receipt is None:
            return
        try:
            await self.processor.change_invisible(self.ctx, g.cgroup, g.lmq, f.receipt, 0)
        except UnimqError as e:
            log.debug("mqtt: shared release failed: %s", e)
        g.pending += 1

    # -- connection lifecycle

    def _acl_rules(self, s: Session) -> list[tuple[int, str]]:
        rules = s.acl_rules
        if rules is None:
            rules = s.acl_rules = self.acl.rules(s.username, s.client_id)  # type: ignore[union-attr]
        return rules

    def can_read(self, s: Session, topic: str) -> bool:
        """May ``s`` receive messages on ``topic``? (Always, without an ACL file.)"""
        acl = self.acl
        return acl is None or acl.can_topic(self._acl_rules(s), topic, READ)

    def can_write(self, s: Session, topic: str) -> bool:
        acl = self.acl
        if acl is None:
            return True
        ok = s.acl_write.get(topic)
        if ok is None:
            ok = acl.can_topic(self._acl_rules(s), topic, WRITE)
            if len(s.acl_write) > 1024:  # topics are the client's: keep the cache bounded
                s.acl_write.clear()
            s.acl_write[topic] = ok
        return ok

    def can_subscribe(self, s: Session, flt: str) -> bool:
        acl = self.acl
        return acl is None or acl.can_subscribe(self._acl_rules(s), flt)

    @property
    def users_configured(self) -> bool:
        return bool(self.config.users or self.hashed_users)

    def _password_ok(self, user: str, password: bytes | None) -> bool:
        if password is None:
            return False
        plain = self.config.users.get(user)
        if plain is not None:
            return hmac.compare_digest(plain.encode(), password)
        entry = self.hashed_users.get(user)
        return entry is not None and verify_password(entry, password)

    async def connect(self, conn: "Connection", pkt: C.Connect) -> None:
        cfg = self.config
        v5 = pkt.protocol_level == C.MQTT_5
        props = pkt.properties
        conn.problem_info = props.get("request_problem_information", 1) != 0
        if v5 and "authentication_method" in props:
            conn.refuse(C.RC_BAD_AUTH_METHOD, "enhanced authentication is not supported")
            return
        # authentication
        if pkt.username is not None:
            if self.users_configured:
                if not self._password_ok(pkt.username, pkt.password):
                    conn.refuse(C.RC_BAD_USERNAME_OR_PASSWORD, "bad user name or password")
                    return
            elif not cfg.allow_anonymous:
                conn.refuse(C.RC_BAD_USERNAME_OR_PASSWORD, "bad user name or password")
                return
        elif not cfg.allow_anonymous:
            conn.refuse(C.RC_NOT_AUTHORIZED if v5 else C.RC_BAD_USERNAME_OR_PASSWORD,
                        "anonymous clients are not allowed")
            return
        cid = pkt.client_id
        assigned = None
        if not cid:
            if not v5 and not pkt.clean_start:
                conn.refuse(C.RC_CLIENT_ID_NOT_VALID, "an empty client id needs clean session")
                return
            cid = assigned = "unimq-" + uuid.uuid4().hex[:20]
        if v5:
            expiry = min(props.get("session_expiry_interval", 0), cfg.max_session_expiry)
        else:
            expiry = 0 if pkt.clean_start else SESSION_NEVER_EXPIRES
        # takeover
        old = self.sessions.get(cid)
        if old is not None and old.conn is not None:
            oc = old.conn
            oc.close(C.RC_SESSION_TAKEN_OVER, "session taken over", publish_will=True)
            self.detach(oc)
            old = self.sessions.get(cid)  # a session that ended with that connection is gone
        if old is not None and old.will_handle is not None:
            old.will_handle.cancel()  # a new connection to the session cancels a delayed will
            old.will_handle = None
        present = False
        if old is not None and not pkt.clean_start:
            s = old
            present = True
            s.version = pkt.protocol_level
        else:
            if old is not None:
                await self.end_session(old)
            s = Session(cid, pkt.protocol_level, expiry)
            self.sessions[cid] = s
        s.expiry = expiry
        s.ctx = RequestContext(protocol="mqtt", client_id=cid, remote_address=conn.peer, principal=pkt.username)
        if s.username != pkt.username:  # its ACL rights follow the user name it connects with now
            s.username = pkt.username
            s.acl_rules = None
            s.acl_write.clear()
            if self.acl is not None and s.subs:
                self._routes_changed()  # dispatch plans decided what this session may read
        if s.expiry_handle is not None:
            s.expiry_handle.cancel()
            s.expiry_handle = None
        if conn.closed:  # the client went away while we were busy
            s.disconnected_at = _now_ms()
            if not s.persistent:
                await self.end_session(s)
            else:
                self._arm_expiry(s)
            return
        conn.attach(s, pkt)
        # CONNACK
        cprops: dict[str, Any] = {}
        if v5:
            if assigned:
                cprops["assigned_client_identifier"] = assigned
            if props.get("session_expiry_interval", 0) != expiry:
                cprops["session_expiry_interval"] = expiry
            cprops["receive_maximum"] = cfg.receive_maximum
            cprops["topic_alias_maximum"] = cfg.topic_alias_maximum
            cprops["maximum_packet_size"] = cfg.max_packet_size
            cprops["retain_available"] = 1
            cprops["wildcard_subscription_available"] = 1
            cprops["subscription_identifier_available"] = 1
            cprops["shared_subscription_available"] = 1
            if cfg.server_keepalive or conn.keepalive != pkt.keepalive:
                cprops["server_keep_alive"] = conn.keepalive
        conn.send(encode(C.Connack(present, 0, cprops), pkt.protocol_level))
        self.connections.add(conn)
        if s.persistent:
            s.disconnected_at = 0
            await self._save_session(s)
        elif present is False and old is None:
            pass
        # resume: PUBRELs, then unacknowledged PUBLISHes with DUP, then the queues
        for pid in sorted(s.pubrel):
            conn.send(encode(C.PubRel(pid), conn.version))
        for pid, f in list(s.inflight.items()):
            if f.receipt is not None:
                continue
            conn.send_publish(f.msg, f.qos, f.msg.retain and False, True, pid, f.sub_ids)
        for lmq, cur in s.cursors.items():
            cur.must_pull = True
            s.pending[lmq] = s.pending.get(lmq, 0) + 1
        self.wake(s)
        for sub in s.subs.values():
            if sub.group:
                g = self.groups.get((sub.group, sub.filter))
                if g is not None:
                    g.pending += 1
                    self.wake_group(g)

    def detach(self, conn: "Connection") -> None:
        """The connection is gone (closed by either side): will, session end or expiry."""
        self.connections.discard(conn)
        s = conn.session
        if s is None or s.conn is not conn:
            return
        s.conn = None
        s.disconnected_at = _now_ms()
        if not self._dirty_sessions:
            self._dirty_wake.set()
        self._dirty_sessions.add(s)
        s.dirty.update(s.cursors)
        for cur in s.cursors.values():
            self._mem_clear(cur)  # an offline session reads from the store when it is back
        # shared in-flight messages go back to the group at once
        for pid, f in list(s.inflight.items()):
            if f.receipt is not None:
                del s.inflight[pid]
                self.spawn(self._release_shared_and_wake(s, f))
        if conn.will is not None and conn.publish_will:
            will = conn.will
            delay = will.properties.get("will_delay_interval", 0) if conn.version == C.MQTT_5 else 0
            delay = min(delay, s.expiry) if s.expiry != SESSION_NEVER_EXPIRES else delay
            if delay > 0:
                assert self.loop is not None
                s.will_handle = self.loop.call_later(delay, lambda: self._fire_will(s, will))
            else:
                self.spawn(self._publish_will(s.client_id, will))
        conn.will = None
        if not s.persistent:
            self.spawn(self.forget_session(s))
        else:
            self._arm_expiry(s)
            self.spawn(self._save_session(s))

    async def _release_shared_and_wake(self, s: Session, f: Inflight) -> None:
        await self._release_shared(s, f)
        g = self._group_of(f.lmq or "")
        if g is not None:
            self.wake_group(g)

    def _fire_will(self, s: Session, will: C.Will) -> None:
        s.will_handle = None
        self.spawn(self._publish_will(s.client_id, will))

    async def _publish_will(self, cid: str, will: C.Will) -> None:
        props = dict(will.properties)
        props.pop("will_delay_interval", None)
        ctx = RequestContext(protocol="mqtt", client_id=cid)
        await self.publish(ctx, cid, [PubItem(will.topic, will.payload, will.qos, will.retain, props or None)])


# ------------------------------------------------------------------ connection


class Connection:
    """One MQTT network connection, independent of the transport (TCP or WebSocket).

    The transport calls :meth:`feed` with received bytes and :meth:`lost` when
    it is gone; the connection writes through ``transport.write`` and closes with
    ``transport.close``. Packets are handled in order by one worker task at a
    time; consecutive PUBLISH packets are stored as one batch.
    """

    def __init__(self, broker: MQTTBroker, transport: Any, peer: str) -> None:
        self.broker = broker
        self.transport = transport
        self.peer = peer
        self.decoder = Decoder(max_packet_size=broker.config.max_packet_size)
        self.version = C.MQTT_311
        self.session: Session | None = None
        self.will: C.Will | None = None
        self.publish_will = True
        self.closed = False
        self.connected = False
        self.writable = True
        self.window = broker.config.max_inflight
        self.problem_info = True
        self.keepalive = 0
        self.last_rx = time.monotonic()
        self.alias_in: dict[int, str] = {}
        self.alias_out: dict[str, int] = {}
        self.alias_out_max = 0
        self.max_out_packet = 0
        self.inbox: deque[Any] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._wbuf: list[bytes] = []
        self._wsize = 0
        self._flush_scheduled = False
        self._paused = False
        self._freed = False  # acknowledgements freed window room during this inbox run
        self._timer: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()
        self._timer = self.loop.call_later(broker.config.connect_timeout_s, self._connect_timeout)

    # -- transport side

    def feed(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_rx = time.monotonic()
        n = len(data)
        self.broker.bytes_in += n
        if (not n & 3 and data[0] == 0x40 and self._worker is None and not self.inbox and self.session is not None
                and not self.decoder.buffered and data[0::4] == b"\x40" * (n >> 2)
                and data[1::4] == b"\x02" * (n >> 2)):
            # Nothing but whole success PUBACKs (4 bytes each), nothing queued before them:
            # what a subscriber sends back, read straight off the bytes.
            done = self._on_pubacks(data)
            if done == n:
                return
            data = data[done:]  # a packet id 0: the decoder says what is wrong with it
        try:
            pkts = self.decoder.feed(data)
            err = None
        except MQTTProtocolError as e:
            pkts, err = e.packets, e
        if pkts:
            if self._worker is None and not self.inbox and self.session is not None:
                # Nothing is queued before them: a subscriber's PUBACKs are settled right
                # here, without a task or a coroutine per packet (the delivery hot path).
                i = 0
                n = len(pkts)
                while i < n and type(pkts[i]) is C.PubAck:
                    self._on_puback(pkts[i])
                    i += 1
                if i:
                    if self._freed and i == n and err is None:
                        self._freed = False
                        if not self.closed:
                            self.broker.wake(self.session)
                    pkts = pkts[i:]
            if pkts:
                self.inbox.extend(pkts)
        if err is not None:
            self.inbox.append(err)
        if self.inbox and self._worker is None:
            self._worker = self.loop.create_task(self._work())
        if len(self.inbox) > 4096 and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def lost(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.closed = True
        if self._worker is not None and not self._worker.done() and self._worker is not asyncio.current_task():
            self._worker.cancel()
        if self.connected:
            self.broker.detach(self)
        self.connected = False

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        s = self.session
        if s is not None:
            self.broker.wake(s)
            for sub in s.subs.values():
                if sub.group:
                    g = self.broker.groups.get((sub.group, sub.filter))
                    if g is not None:
                        self.broker.wake_group(g)

    # -- writing

    def send(self, data: bytes) -> None:
        if self.closed:
            return
        self._wbuf.append(data)
        self._wsize += len(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._wbuf and not self.closed:
            data = b"".join(self._wbuf) if len(self._wbuf) > 1 else self._wbuf[0]
            self._wbuf = []
            self._wsize = 0
            self.broker.bytes_out += len(data)
            self.transport.write(data)

    def close(self, reason_code: int | None = None, message: str = "", *, publish_will: bool = True) -> None:
        """Close this connection, with a v5 DISCONNECT carrying ``reason_code`` when it has one."""
        if self.closed:
            return
        self.publish_will = publish_will
        if reason_code is not None and self.connected and self.version == C.MQTT_5:
            props = {"reason_string": message} if (message and self.problem_info) else None
            self.send(encode(C.Disconnect(reason_code, props), C.MQTT_5))
        self._flush()
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            self.transport.close()
        except Exception:  # pragma: no cover
            pass

    def refuse(self, code: int, message: str) -> None:
        """Answer a CONNECT with a failure CONNACK and close."""
        if self.version == C.MQTT_5:
            props = {"reason_string": message} if self.problem_info else None
            self.send(encode(C.Connack(False, code, props), C.MQTT_5))
        else:
            self.send(encode(C.Connack(False, C.V5_TO_V3_CONNACK.get(code, C.CONNACK_V3_SERVER_UNAVAILABLE)),
                             self.version))
        self.close(publish_will=False)

    def deliver(self, out: Outgoing, qos: int, retain: bool, sub_ids: list[int] | None) -> None:
        """Send an application message outside the LMQ path (QoS 0 fast path, retained)."""
        if self.closed:
            return
        s = self.session
        if qos == 0:
            if self.transport.get_write_buffer_size() + self._wsize > self.broker.config.qos0_drop_buffer:
                self.broker.stats["qos0_dropped"] += 1
                return
            self.send_publish(out, 0, retain, False, 0, sub_ids)
            return
        assert s is not None
        pid = s.alloc_pid()
        s.inflight[pid] = Inflight(out, qos, None, 0, None, sub_ids)
        self.send_publish(out, qos, retain, False, pid, sub_ids)

    def send_publish(self, out: Outgoing, qos: int, retain: bool, dup: bool, pid: int,
                     sub_ids: list[int] | None) -> None:
        self.broker.pub_out += 1
        if self.version != C.MQTT_5:
            data = encode_publish(out.tb, out.payload, qos, retain, dup, pid, None)
        else:
            tb = out.tb
            if out.expiry_at or sub_ids or self.alias_out_max:
                base = out.v5props()
                props = dict(base) if base else {}
                if out.expiry_at:
                    props["message_expiry_interval"] = max(0, (out.expiry_at - _now_ms() + 999) // 1000)
                if sub_ids:
                    props["subscription_identifier"] = sub_ids
                if self.alias_out_max:
                    alias = self.alias_out.get(out.topic)
                    if alias is not None:
                        tb = b""
                        props["topic_alias"] = alias
                    elif len(self.alias_out) < self.alias_out_max:
                        alias = len(self.alias_out) + 1
                        self.alias_out[out.topic] = alias
                        props["topic_alias"] = alias
                pb = encode_properties(props)
            else:
                pb = out._v5
                if pb is None:
                    pb = out._v5 = encode_properties(out.v5props())
            data = encode_publish(tb, out.payload, qos, retain, dup, pid, pb)
        if self.max_out_packet and len(data) > self.max_out_packet:
            # v5 3.1.2.25: a message too big for the client is discarded as if delivered
            if qos and self.session is not None:
                f = self.session.inflight.pop(pid, None)
                if f is not None:
                    self.broker.acked(self.session, f)
            return
        self.send(data)

    # -- protocol

    def _connect_timeout(self) -> None:
        self._timer = None
        if not self.connected and not self.closed:
            self.close()

    def _keepalive_check(self) -> None:
        self._timer = None
        if self.closed or not self.keepalive:
            return
        limit = self.keepalive * 1.5
        idle = time.monotonic() - self.last_rx
        if idle >= limit:
            log.info("mqtt: %s silent for %.1fs (keepalive %ds): disconnecting", self.peer, idle, self.keepalive)
            self.close(C.RC_KEEP_ALIVE_TIMEOUT, "keep alive timeout")
            self.lost()
            return
        self._timer = self.loop.call_later(limit - idle, self._keepalive_check)

    def attach(self, s: Session, pkt: C.Connect) -> None:
        cfg = self.broker.config
        self.session = s
        s.conn = self
        self.connected = True
        self.will = pkt.will
        props = pkt.properties
        ka = effective_keepalive(pkt.keepalive, pkt.protocol_level == C.MQTT_5, cfg)
        if pkt.protocol_level == C.MQTT_5:
            self.window = min(cfg.max_inflight, props.get("receive_maximum", 65535))
            self.alias_out_max = min(props.get("topic_alias_maximum", 0), 65535)
            self.max_out_packet = props.get("maximum_packet_size", 0)
        self.keepalive = ka
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if ka:
            self._timer = self.loop.call_later(ka * 1.5, self._keepalive_check)

    async def _work(self) -> None:
        inbox = self.inbox
        try:
            while inbox and not self.closed:
                pkt = inbox.popleft()
                if type(pkt) is C.PubAck:
                    self._on_puback(pkt)
                elif isinstance(pkt, C.Publish):
                    batch = [pkt]
                    while inbox and len(batch) < 512 and type(inbox[0]) is C.Publish:
                        batch.append(inbox.popleft())
                    await self._on_publish(batch)
                elif isinstance(pkt, MQTTProtocolError):
                    self._protocol_error(pkt)
                else:
                    await self._dispatch(pkt)
                if self._paused and len(inbox) < 1024 and not self.closed:
                    self._paused = False
                    self.transport.resume_reading()
            if self._freed:
                self._freed = False
                if self.session is not None and not self.closed:
                    self.broker.wake(self.session)
        except MQTTProtocolError as e:
            self._protocol_error(e)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("mqtt: error handling a packet from %s", self.peer)
            self.close(C.RC_UNSPECIFIED_ERROR, "internal error")
            self.lost()
        finally:
            self._worker = None

    def _protocol_error(self, e: MQTTProtocolError) -> None:
        """Close this connection only, with the reason code where the protocol has one.

        Before a successful CONNECT: a v5 client gets a CONNACK with the reason code, a
        3.1/3.1.1 client a CONNACK only for an unacceptable protocol level (its one
        defined answer), anything else is closed silently. After it: a v5 client gets a
        DISCONNECT with the reason code (and reason string), a 3.1.1 client is closed.
        """
        log.info("mqtt: protocol error from %s: %s", self.peer, e.message)
        if not self.connected:
            version = self.decoder.version
            if version == C.MQTT_5:
                props = {"reason_string": e.message} if self.problem_info else None
                self.send(encode(C.Connack(False, e.reason_code, props), C.MQTT_5))
            elif e.connack_v3 is not None:
                self.send(encode(C.Connack(False, e.connack_v3), C.MQTT_311))
            self.close(publish_will=False)
        else:
            self.close(e.reason_code, e.message)
        self.lost()

    async def _dispatch(self, pkt: Any) -> None:
        t = pkt.type
        b = self.broker
        if t == C.CONNECT:
            self.version = pkt.protocol_level
            if pkt.protocol_level == C.MQTT_5:
                self.problem_info = pkt.properties.get("request_problem_information", 1) != 0
            await b.connect(self, pkt)
            return
        s = self.session
        if s is None:  # pragma: no cover - the decoder requires CONNECT first
            raise MQTTProtocolError(C.RC_PROTOCOL_ERROR, "packet before CONNECT")
        if t == C.PUBACK:
            self._on_puback(pkt)
        elif t == C.PUBREC:
            f = s.inflight.get(pkt.packet_id)
            if f is not None and f.qos == 2:
                del s.inflight[pkt.packet_id]
                if pkt.reason_code < 0x80:
                    s.pubrel.add(pkt.packet_id)
                    if s.persistent:  # the PUBREL to send outlives a restart (see session.py)
                        await b._save_session(s)
                    b.acked(s, f)
                    self.send(encode(C.PubRel(pkt.packet_id), self.version))
                else:
                    b.acked(s, f)
                    self._freed = True
            elif pkt.packet_id in s.pubrel:
                self.send(encode(C.PubRel(pkt.packet_id), self.version))
            else:
                self.send(encode(C.PubRel(pkt.packet_id, C.RC_PACKET_ID_NOT_FOUND), self.version))
        elif t == C.PUBCOMP:
            if pkt.packet_id in s.pubrel:
                s.pubrel.discard(pkt.packet_id)
                self._freed = True
        elif t == C.PUBREL:
            if pkt.packet_id in s.qos2_in:
                s.qos2_in.discard(pkt.packet_id)
                if s.persistent:  # released before PUBCOMP: the id may be reused right after
                    await b._save_session(s)
                self.send(encode(C.PubComp(pkt.packet_id), self.version))
            else:
                self.send(encode(C.PubComp(pkt.packet_id, C.RC_PACKET_ID_NOT_FOUND), self.version))
        elif t == C.SUBSCRIBE:
            await b.subscribe(self, pkt)
        elif t == C.UNSUBSCRIBE:
            await b.unsubscribe(self, pkt)
        elif t == C.PINGREQ:
            self.send(b"\xd0\x00")
        elif t == C.DISCONNECT:
            await self._on_disconnect(pkt)
        elif t == C.AUTH:
            raise MQTTProtocolError(C.RC_PROTOCOL_ERROR, "AUTH without enhanced authentication")

    def _on_pubacks(self, data: bytes) -> int:
        """Settle a run of 4-byte PUBACKs (see :meth:`feed`), then wake the pump once.

        Returns the bytes consumed: all of them, or up to a PUBACK with packet id 0
        (malformed; left to the decoder)."""
        s = self.session
        assert s is not None
        inflight = s.inflight
        acked = self.broker.acked
        freed = False
        done = 0
        for hi, lo in zip(data[2::4], data[3::4]):
            pid = hi << 8 | lo
            if not pid:
                break
            f = inflight.get(pid)
            if f is not None and f.qos == 1:
                del inflight[pid]
                acked(s, f)
                freed = True
            done += 4
        if freed and not self.closed:
            self.broker.wake(s)
        return done

    def _on_puback(self, pkt: C.PubAck) -> None:
        s = self.session
        if s is None:  # pragma: no cover - the decoder requires CONNECT first
            raise MQTTProtocolError(C.RC_PROTOCOL_ERROR, "packet before CONNECT")
        f = s.inflight.get(pkt.packet_id)
        if f is not None and f.qos == 1:
            del s.inflight[pkt.packet_id]
            self.broker.acked(s, f)
            self._freed = True  # the pump is woken once the inbox is drained

    async def _on_disconnect(self, pkt: C.Disconnect) -> None:
        s = self.session
        assert s is not None
        if self.version == C.MQTT_5:
            new = pkt.properties.get("session_expiry_interval")
            if new is not None:
                if s.expiry == 0 and new != 0:
                    raise MQTTProtocolError(C.RC_PROTOCOL_ERROR, "session expiry set on DISCONNECT after 0 at CONNECT")
                s.expiry = min(new, self.broker.config.max_session_expiry)
        self.publish_will = pkt.reason_code == C.RC_DISCONNECT_WITH_WILL
        self._flush()
        self.closed = True
        try:
            self.transport.close()
        except Exception:  # pragma: no cover
            pass
        self.lost()

    async def _on_publish(self, batch: list[C.Publish]) -> None:
        s = self.session
        assert s is not None
        v5 = self.version == C.MQTT_5
        items: list[C.Publish] = []
        broker = self.broker
        cfg = broker.config
        broker.pub_in += len(batch)
        acl = broker.acl
        denied: list[bool] | None = None  # per item, once the ACL file refused one
        # Every per-packet rule is judged per packet, as if each had arrived alone: the QoS 2
        # ids this batch adds count against Receive Maximum, and a packet that breaks a rule
        # ends the batch there (the ones before it are stored and acknowledged, then the error).
        q2_new: set[int] = set()
        err: MQTTProtocolError | None = None
        for p in batch:
            props = p.properties
            if props is not None:  # v5 only
                topic = p.topic
                if "topic_alias" in props:
                    alias = props["topic_alias"]
                    if alias > cfg.topic_alias_maximum:
                        err = MQTTProtocolError(C.RC_TOPIC_ALIAS_INVALID, f"topic alias {alias} is out of range")
                        break
                    if topic:
                        self.alias_in[alias] = topic
                    else:
                        topic = self.alias_in.get(alias)  # type: ignore[assignment]
                        if topic is None:
                            err = MQTTProtocolError(C.RC_PROTOCOL_ERROR, f"unknown topic alias {alias}")
                            break
                        p.topic = topic  # resolved from a topic alias
                if v5 and props.get("payload_format_indicator") == 1:
                    try:
                        p.payload.decode("utf-8")
                    except UnicodeDecodeError:
                        if p.qos:
                            self.send(encode(C.PubAck(p.packet_id, C.RC_PAYLOAD_FORMAT_INVALID) if p.qos == 1 else
                                             C.PubRec(p.packet_id, C.RC_PAYLOAD_FORMAT_INVALID), self.version))
                        continue
            if p.qos == 2:
                pid = p.packet_id
                if pid in s.qos2_in:
                    self.send(encode(C.PubRec(pid), self.version))  # duplicate: stored already
                    continue
                if pid in q2_new:
                    continue  # resent within this batch: the first one's PUBREC answers both
                if v5 and len(s.qos2_in) + len(q2_new) >= cfg.receive_maximum:
                    err = MQTTProtocolError(C.RC_RECEIVE_MAX_EXCEEDED, "receive maximum exceeded")
                    break
                q2_new.add(pid)
            if acl is not None and not broker.can_write(s, p.topic):
                if denied is None:
                    denied = [False] * len(items)
                denied.append(True)
            elif denied is not None:
                denied.append(False)
            items.append(p)
        if items:
            await self._store_and_ack(items, denied)
        if err is not None:
            raise err

    async def _store_and_ack(self, items: list[C.Publish], denied: list[bool] | None) -> None:
        """Store a batch of accepted PUBLISHes and send their PUBACKs / PUBRECs in one write."""
        s = self.session
        assert s is not None
        broker = self.broker
        v5 = self.version == C.MQTT_5
        if denied is None:
            codes = await broker.publish(s.ctx, s.client_id, items)
        else:  # refused by the ACL file: 0x87 for v5; 3.1.1 has no code, the message is dropped
            allowed = [p for p, d in zip(items, denied) if not d]
            stored = iter(await broker.publish(s.ctx, s.client_id, allowed) if allowed else ())
            refused = C.RC_NOT_AUTHORIZED if v5 else 0
            codes = [refused if d else next(stored) for d in denied]
        out: list[bytes] = []
        version = self.version
        qos2_stored = False
        for p, code in zip(items, codes):
            qos = p.qos
            if not qos:
                continue
            if not v5:
                if code >= 0x80:
                    raise MQTTProtocolError(code, "the message could not be stored")
                code = 0
            if qos == 1:
                out.append(encode(C.PubAck(p.packet_id, code), version) if code else _PUBACK(0x40, 2, p.packet_id))
            else:
                if code < 0x80:
                    s.qos2_in.add(p.packet_id)
                    qos2_stored = True
                out.append(encode(C.PubRec(p.packet_id, code), version))
        if qos2_stored and s.persistent:
            # the ids awaiting PUBREL are durable before the PUBRECs go out (see session.py)
            await self.broker._save_session(s)
        if out:
            self.send(b"".join(out))
