"""The MQTT door: sessions meet routing, delivery and the store through the processor.

How MQTT maps onto the one model (README, "MQTT door"), and where each part lives:

- ``mapping``: a PUBLISH to ``a/b/c`` is one stored message in unified topic
  ``a`` with the MQTT topic and QoS as properties; any processor pop or pull of
  ``a`` reads it.
- ``routing``: the topic-filter trie finds the matching subscriptions; the
  message is multi-dispatched into the light message queue (LMQ) of every
  matching QoS 1/2 subscription (body stored once); QoS 0 goes straight from
  memory to the subscribers online (a QoS 0 message for an offline session is
  dropped, as Mosquitto does).
- ``delivery``: a connected session reads its LMQs by offset, in order, through
  ``gateway.lmq_reader``; ``shared``: a ``$share`` group's LMQ is popped by its
  members.
- ``session_store``, ``retained``: persistent sessions and retained messages,
  small state written through the processor's durable key-value store.
- ``wills``, ``acl`` (topic rights), ``passwords`` (who may connect).
- ``connection`` and ``state``: one network connection and its protocol state.
- Messages other doors send with an ``mqtt_topic`` property (AMQP ``amq.topic``
  with routing key ``a.b.c`` is MQTT ``a/b/c``) reach MQTT subscribers through
  the processor's router seam (``xroute``: :class:`CrossDoorRouter`).

This module is what ties them: CONNECT (authentication, takeover, resume),
the connection's end, SUBSCRIBE / UNSUBSCRIBE, and publishing a batch.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from asyncio import Future
from typing import Any, Coroutine

from core_broker.errors import MessageTooLargeError, StoreFullError, UnimqError
from core_broker.model import Message
from gateway.access.certs import cert_identity, is_tls, known_identity
from gateway.access.traffic import QuotaExceededError
from gateway.api import MessagingAPI
from gateway.auth import AllOf, Authorizer
from gateway.context import RequestContext
from gateway.topic_acl import TopicAclAuthorizer

from . import codec as C
from .acl import AccessControl
from .codec import MQTTProtocolError, encode
from .config import MQTTConfig
from .connection import Connection
from .deadlines import ConnectDeadlines
from .delivery import Delivery
from .fleet import Fleet
from .tail import Tail
from .xroute import CrossDoorRouter
from .tracing import mark_sent as trace_mark_sent
from .mapping import (
    P_EXPIRY_AT,
    P_MQTT_CLIENT_ID,
    P_ORIGIN,
    P_QOS,
    P_TOPIC,
    QOS_STR,
    USER_KEYS,
    Outgoing,
    PubItem,
    forward_props,
    message_properties,
    now_ms,
    outgoing_from_stored,
    v5_props_of,
)
from .passwords import Credentials
from .retained import RetainedStore
from .routing import Routing, SharedGroup, member_sub_ids
from .session import NONE, SESSION_NEVER_EXPIRES, Session, Subscription
from .session_store import SessionStore
from .shared import SharedDelivery
from .sys_topics import Counters, SysTopics
from .topics import filter_matches, parse_shared, validate_filter
from .wills import Wills

log = logging.getLogger("unimq.mqtt")

__all__ = ["MQTTConfig", "MQTTBroker", "Connection", "outgoing_from_stored", "message_properties", "v5_props_of", "PubItem"]


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("unimq")
    except Exception:  # run from a checkout that was never installed
        return "dev"


class MQTTBroker:
    """The door's sessions and what serves them; talks to the store only through the processor."""

    def __init__(self, processor: MessagingAPI, config: MQTTConfig | None = None, identities: Any = None,
                 allow_anonymous: bool = True) -> None:
        self.processor = processor
        self.config = cfg = config or MQTTConfig()
        # The process's identity store (gateway.access.store.IdentityStore): with users in it,
        # CONNECT logins are checked against it and topic rights come from its permissions.
        self.identities = identities
        self.allow_anonymous = allow_anonymous  # the process's allow_anonymous (with users in the store)
        self.ctx = RequestContext(protocol="mqtt", client_id="mqtt-door", trusted=True)
        self.counters = Counters()
        self.credentials = Credentials(cfg.users, cfg.password_file)
        # a Mosquitto ACL file: its rules join the processor's authorizer while the door runs
        self.topic_acl = TopicAclAuthorizer.from_file(cfg.acl_file) if cfg.acl_file else None
        self._outer_authorizer: Authorizer | None = None
        self.access = AccessControl(processor, enforced=self.topic_acl is not None)
        self.session_store = SessionStore(processor, self.ctx)
        self.sessions: dict[str, Session] = self.session_store.sessions
        self.retained = RetainedStore(processor, self.ctx)
        self.routing = Routing(self.access, self._ensure_lmq)
        self.shared = SharedDelivery(processor, self.ctx, self.routing, self.spawn)
        self.delivery = Delivery(processor, self.ctx, cfg, self.counters, self.spawn, self.session_store.save,
                                 Routing.sub_ids, self.shared)
        self.wills = Wills(self.spawn, self.publish)
        self.connections: set[Connection] = set()
        self.connect_deadlines = ConnectDeadlines()  # connections yet to send CONNECT
        self._tasks: set[asyncio.Task[Any]] = set()
        self.sys = SysTopics(self, cfg.sys_interval_s, _version())
        self.fleet = Fleet(self)  # several gateways sharing these sessions
        self.tail = Tail(self)  # ... and what other gateways store for subscribers only this one serves
        self.xroute = CrossDoorRouter(self)  # what other doors send on MQTT topics
        self.session_store.gid = self.routing.here = self.fleet.gid if self.fleet.enabled else None
        if self.fleet.enabled:  # the feed does not bring this gateway's own record writes back
            self.session_store.batch.writer = self.fleet.gid
            self.delivery.save_lanes = False  # a new owner reads every broker's lanes (adopt_owned)

    # -- lifecycle

    async def start(self) -> None:
        if self.identities is not None:
            self.identities.listeners.append(self._identities_changed)
            self._identities_changed()
        if self.topic_acl is not None:
            # MessagingProcessor's installed authorizer (MessagingAPI declares only the setter)
            self._outer_authorizer = self.processor.authorizer  # type: ignore[attr-defined]
            self.processor.set_authorizer(AllOf(self._outer_authorizer, self.topic_acl))
        await self._load()
        self.delivery.start()
        await self.fleet.start()
        await self.tail.start()
        self.sys.start()
        self.processor.add_router(self.xroute)  # messages other doors send on MQTT topics

    def _identities_changed(self) -> None:
        """Users or permissions changed: ask again for every session (open connections included)."""
        ids = self.identities
        self.access.enforced = self.topic_acl is not None or ids.has_users
        for s in self.sessions.values():
            s.acl_write.clear()
        self.routing.changed()  # dispatch plans decided what each session may read
        if ids.has_users:  # a deleted user's connections (and anonymous ones, unless allowed) end now
            creds = self.credentials
            for conn in list(self.connections):
                s = conn.session
                if s is None or s.conn is not conn:
                    continue
                name = s.username
                if name is None:
                    gone = not self.allow_anonymous
                else:
                    gone = name not in ids.snapshot.users and name not in creds.plain and name not in creds.hashed
                if gone:
                    conn.close(C.RC_NOT_AUTHORIZED, "not authorized: the user no longer exists" if name is not None
                               else "not authorized: anonymous clients are no longer allowed", publish_will=False)
                    self.detach(conn)

    async def stop(self) -> None:
        if self.identities is not None and self._identities_changed in self.identities.listeners:
            self.identities.listeners.remove(self._identities_changed)
        self.processor.remove_router(self.xroute)
        await self.tail.stop()
        await self.fleet.stop()
        await self.sys.stop()
        for conn in list(self.connections):
            conn.close(C.RC_SERVER_SHUTTING_DOWN, "server shutting down", publish_will=False)
        await self.delivery.stop()
        for s in list(self.sessions.values()):
            for f in s.inflight.values():
                if f.receipt and f.lmq:
                    await self.shared.release(s, f)
            self.delivery.dirty(s)
            if s.persistent:
                self.spawn(self.session_store.save(s))
        await self.delivery.commit_offsets()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        if self._outer_authorizer is not None:
            self.processor.set_authorizer(self._outer_authorizer)
            self._outer_authorizer = None

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
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
        await self.retained.load()
        fleet = self.fleet
        for s, lanes in await self.session_store.load():
            # a session another gateway owned (with a fleet: every one, this gateway's id is new) is
            # a routing copy until its CONNECT claims it, and the claim reads its lanes' floors then
            # (adopt_owned): reading them here too cost every start a few RPCs per session, one after
            # another, before the MQTT port opened (issue 21)
            restore = not fleet.enabled or fleet.owns(s)
            for sub in s.subs.values():
                self.routing.index(sub)
                if restore and sub.lmq and not sub.group:
                    await self.delivery.restore_lanes(s, sub, lanes.get(sub.lmq) or [])
            self.session_store.arm_expiry(s, self._expire)
        if self.sessions:
            log.info("mqtt: restored %d sessions, %d retained messages", len(self.sessions), len(self.retained))

    async def _ensure_lmq(self, name: str) -> None:
        await self.processor.create_topic(self.ctx, name, queues=1, exist_ok=True)

    # -- sessions

    def _expire(self, s: Session) -> None:
        if s.conn is None and self.sessions.get(s.client_id) is s:
            if self.fleet.remote(s) and self.fleet.alive(s.owner):  # type: ignore[arg-type]
                return  # online at another gateway: its expiry is armed when it goes offline there
            self.spawn(self.end_session(s))

    # -- sessions other gateways own (fleet.py)

    async def adopt_owned(self, s: Session, brokers: list[str]) -> None:
        """Take in a session this gateway now owns, as stored by its last owner: every broker's
        lane of each subscription is read from its committed floor."""
        self.sessions[s.client_id] = s
        for sub in s.subs.values():
            self.routing.index(sub)
            if sub.lmq and not sub.group:
                sub.lmq_ready = True
                await self.delivery.restore_lanes(s, sub, brokers)

    def drop_copy(self, s: Session) -> None:
        """Forget ``s`` here only (another gateway owns or ended it): no LMQ or record is touched."""
        self.session_store.remove(s)
        self.wills.cancel(s)
        s.inflight.clear()
        for sub in s.subs.values():
            self._unindex_sub(s, sub)  # (a copy's shared subscriptions were not indexed: a no-op)
        for key in list(s.cursors):
            self.delivery.drop_lane(s, key)
        s.pending.clear()
        s.dirty = NONE

    async def end_session(self, s: Session) -> None:
        """Discard a session: subscriptions, LMQs, durable record, shared in-flight messages."""
        await self.forget_session(s)

    def forget_session(self, s: Session) -> Coroutine[Any, Any, None]:
        """Take ``s`` out of routing *now*; return the coroutine that cleans up the rest.

        The synchronous part matters: a CONNECT that takes over or replaces a session
        must not find the old one any more, whenever the cleanup task runs.
        """
        self.session_store.remove(s)
        self.wills.cancel(s)
        shared = [f for f in s.inflight.values() if f.receipt]
        s.inflight.clear()
        lmqs = [self._unindex_sub(s, sub) for sub in s.subs.values()]
        s.subs.clear()
        for key in list(s.cursors):
            self.delivery.drop_lane(s, key)
        s.pending.clear()
        s.dirty = NONE

        async def cleanup() -> None:
            for f in shared:
                await self.shared.release_and_wake(s, f)
            for lmq in lmqs:
                if lmq:
                    await self.delivery.delete_lmq(lmq)
            await self.session_store.delete(s.client_id)

        return cleanup()

    # -- subscriptions

    def _unindex_sub(self, s: Session, sub: Subscription) -> str | None:
        """Remove a subscription from routing; return the LMQ that is no longer needed, if any."""
        lmq = self.routing.unindex(s, sub)
        if lmq and not sub.group:
            self.delivery.drop_lanes(s, lmq)
        return lmq

    async def subscribe(self, conn: Connection, pkt: C.Subscribe) -> None:
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
        routing = self.routing
        traffic = self.identities.traffic if self.identities is not None else None
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
            if not self.access.can_subscribe(s, flt):
                codes.append(C.RC_NOT_AUTHORIZED if v5 else 0x80)
                continue
            old = s.subs.get(key)
            if old is None and traffic is not None and traffic.active:
                most = conn.meter_of(traffic).subscriptions()
                if most is not None and len(s.subs) >= most:  # a limit on this client (gateway.access.traffic)
                    self.processor.metrics.inc("quota_exceeded", "mqtt")
                    codes.append(C.RC_QUOTA_EXCEEDED if v5 else 0x80)
                    continue
            if old is not None:
                existed = True
                old.qos, old.no_local, old.rap, old.rh, old.sub_id = (opts.qos, opts.no_local,
                                                                     opts.retain_as_published,
                                                                     opts.retain_handling, sid)
                if old.sub_id:
                    s.has_sub_ids = True
                sub = old
                if group:
                    sub.lmq = routing.groups[(group, flt)].lmq
                elif opts.qos > 0 and not sub.lmq:
                    # its lanes (one per broker storing its messages) start with the first message
                    sub.lmq = routing.new_lmq(s)
                routing.changed()
            else:
                existed = False
                sub = Subscription(flt, opts.qos, s, no_local=opts.no_local, rap=opts.retain_as_published,
                                   rh=opts.retain_handling, sub_id=sid, group=group)
                if opts.qos > 0 and not group:
                    sub.lmq = routing.new_lmq(s)
                s.subs[key] = sub
                routing.index(sub)
            changed = True
            codes.append(opts.qos)
            new_subs.append((sub, existed))
        # create the LMQs now, so that any door's router may dispatch into them at once
        for sub, _ in new_subs:
            if sub.group:
                g = routing.groups.get((sub.group, sub.filter))
                if g is not None and not g.lmq_ready and sub.qos > 0:
                    await self._ensure_lmq(g.lmq)
                    g.lmq_ready = True
            elif sub.lmq and not sub.lmq_ready:
                await self._ensure_lmq(sub.lmq)
                sub.lmq_ready = True
        # several gateways: what the others store for these subscriptions is read from now on
        await self.tail.subscribed(s, [sub for sub, existed in new_subs if not existed])
        if changed and s.persistent:
            # stored before the SUBACK: other gateways route by the stored record (fleet.py)
            await self.session_store.save(s)
        conn.send(encode(C.Suback(pkt.packet_id, codes), conn.version))
        # retained messages (not for shared subscriptions)
        can_read = self.access.can_read
        for sub, existed in new_subs:
            if sub.group or sub.rh == 2 or (sub.rh == 1 and existed):
                continue
            sids = member_sub_ids(sub)
            for topic, out in self.retained.matching(sub.filter):
                if can_read(s, topic):
                    conn.deliver(out, min(out.qos, sub.qos), True, sids)
            if sub.filter[:1] == "$":  # a leading wildcard never matches $SYS (MQTT 4.7.2)
                for topic, out in self.sys.retained.items():
                    if filter_matches(sub.filter, topic) and can_read(s, topic):
                        conn.deliver(out, 0, True, sids)
        self.delivery.count_out()

    async def unsubscribe(self, conn: Connection, pkt: C.Unsubscribe) -> None:
        s = conn.session
        assert s is not None
        codes = []
        for key in pkt.filters:
            sub = s.subs.pop(key, None)
            if sub is None:
                codes.append(C.RC_NO_SUBSCRIPTION_EXISTED)
                continue
            self.tail.unsubscribed(s, sub)
            lmq = self._unindex_sub(s, sub)
            if lmq:
                await self.delivery.delete_lmq(lmq)
            codes.append(C.RC_SUCCESS)
        s.has_sub_ids = any(x.sub_id for x in s.subs.values())
        conn.send(encode(C.Unsuback(pkt.packet_id, codes), conn.version))
        if s.persistent:
            await self.session_store.save(s)

    # -- publishing

    async def publish(self, ctx: RequestContext, publisher: str, items: list[C.Publish]) -> list[int]:
        """Store ``items`` (one batch), dispatch them, deliver QoS 0 to online subscribers. Returns a
        v5 reason code per item (0, 0x10 no matching subscribers, or an error >= 0x80): no raise."""
        msgs: list[Message] = []
        fast: list[tuple[Outgoing, tuple[Subscription, ...]]] = []
        wake: set[Session] = set()
        wake_groups: set[SharedGroup] = set()
        # per message: matched, its QoS 1/2 subscriptions (in extra_dispatch order), outbound form
        lanes: list[tuple[bool, tuple[Subscription | None, ...]]] = []
        outs: list[Outgoing | None] = []
        routing, plan_cache, retained = self.routing, self.routing.plans, False
        last_topic, last_qos, gen, plan = None, -1, -1, None
        stamp = self.tail.stamp if self.tail.several else None  # several gateways: the origin of each
        plain: dict[str, str] | None = None  # the properties of a plain PUBLISH of this run
        for it in items:
            topic = it.topic
            qos = it.qos
            if topic != last_topic or qos != last_qos or gen != routing.gen or not plan.cacheable:  # type: ignore[union-attr]
                # (a batch is mostly runs of one topic: its plan is looked up once per run)
                gen = routing.gen
                plan = plan_cache.get((topic, qos))
                if plan is None:
                    plan = await routing.plan(topic, qos, publisher)
                last_topic, last_qos = topic, qos
                plain = None  # (and the plan's fields, read once per run:)
                ut, tb, targets, direct, lmq_subs = plan.ut, plan.tb, plan.targets, plan.direct, plan.lmq_subs
                targets, lmq_subs = plan.with_remote0(self.fleet.alive) if plan.remote0 else (targets, lmq_subs)
                if plan.wake_groups:
                    wake_groups.update(plan.wake_groups)
            iprops = it.properties
            keys: tuple[str, ...] = ()
            if iprops is None and not it.retain:
                # one dict per run unless stamped below (the store encodes its header once: door_head)
                if plain is None or stamp is not None:
                    plain = {P_TOPIC: topic, P_QOS: QOS_STR[qos], P_MQTT_CLIENT_ID: publisher}
                props = plain
                expiry = 0
            else:
                props = message_properties(topic, qos, it.retain, iprops)
                props[P_MQTT_CLIENT_ID] = publisher
                expiry = int(props.get(P_EXPIRY_AT, 0))
                retained = retained or it.retain
                if USER_KEYS in props:  # MQTT 5 user property "keys": the message keys (query by key)
                    keys = tuple(k for k in props[USER_KEYS].split(",") if k)
            if stamp is not None:
                props[P_ORIGIN] = stamp(ut)
            msgs.append(Message(ut, it.payload, properties=props, protocol="mqtt", extra_dispatch=targets,
                                keys=keys))
            out = None
            if lmq_subs or direct:
                out = Outgoing(topic, it.payload, qos, it.retain, forward_props(iprops) if iprops else None, expiry,
                               tb, ut)
                if direct:
                    fast.append((out, direct))
            lanes.append((plan.matched, lmq_subs))
            outs.append(out)
        codes: list[int]
        delivery = self.delivery
        fleet = self.fleet
        gid = fleet.gid
        try:
            results = await self.processor.send(ctx, msgs)
            if delivery.tracer.on:
                trace_mark_sent(results, outs)
            codes = [0 if matched else C.RC_NO_MATCHING_SUBSCRIBERS for matched, _ in lanes]
            for res, (_, subs_), out in zip(results, lanes, outs):
                if not subs_:
                    continue
                # our targets come first in extra_dispatch (other doors' routers append theirs)
                offsets = res.extra_offsets if len(res.extra_offsets) >= len(subs_) else None
                for j, sub in enumerate(subs_):
                    if sub is None:
                        continue
                    s = sub.session
                    if s.owner is not gid and s.owner is not None and s.owner != gid:
                        # another gateway's: tell it to read its lane (online or not, as this
                        # copy says: the copy may be older than the owner's own state)
                        if fleet.alive(s.owner):
                            fleet.note(res.broker, s, sub.lmq)  # type: ignore[arg-type]
                        continue  # a dead owner's session waits in the store for its next CONNECT
                    if offsets is not None:
                        delivery.offer(s, sub, out, offsets[j], res.broker)  # type: ignore[arg-type]
                    else:  # no offsets (a remote broker that does not report them): read the store
                        delivery.must_pull(s, sub, res.broker)
                        wake.add(s)
        except MessageTooLargeError:
            codes = [C.RC_PACKET_TOO_LARGE] * len(items)
        except StoreFullError:
            codes = [C.RC_QUOTA_EXCEEDED] * len(items)
        except UnimqError as e:
            log.warning("mqtt: publish refused: %s", e)
            codes = [C.RC_NOT_AUTHORIZED if e.code in ("FORBIDDEN", "UNAUTHORIZED") else C.RC_UNSPECIFIED_ERROR] \
                * len(items)
        if fast:
            delivery.direct(fast)
        for s in wake:
            delivery.wake(s)
        fleet.flush_notes()
        for g in wake_groups:
            self.shared.wake(g)
        delivery.count_out()
        if retained:
            for it, code in zip(items, codes):
                if it.retain and code < 0x80:
                    await self.retained.retain(it)
        return codes

    # -- connection lifecycle

    async def connect(self, conn: Connection, pkt: C.Connect) -> None:
        cfg = self.config
        v5 = pkt.protocol_level == C.MQTT_5
        props = pkt.properties
        conn.problem_info = props.get("request_problem_information", 1) != 0
        if v5 and "authentication_method" in props:
            conn.refuse(C.RC_BAD_AUTH_METHOD, "enhanced authentication is not supported")
            return
        # authentication: the identity store (when it has users), then the door's own users
        ids = self.identities
        store_on = ids is not None and ids.has_users
        if cfg.use_identity_as_username and is_tls(conn.transport):
            # Mosquitto's use_identity_as_username: the certificate is the login, its CN the user name
            cn = cert_identity(conn.transport)
            if not known_identity(ids, cn):
                self.processor.metrics.inc("auth_failed", "mqtt")
                log.warning("login failed: protocol=mqtt from=%s certificate=%r", conn.peer, cn)
                conn.refuse(C.RC_NOT_AUTHORIZED, "a client certificate naming a user is required")  # 3.1.1: 5
                return
            pkt.username, pkt.password = cn, None
        elif pkt.username is not None:
            if ids is not None:
                await ids.throttle.wait("mqtt", conn.peer)
            ok = await self._token_login(pkt.username, pkt.password) if ids is not None and ids.jwt else False
            if not ok:
                ok = store_on and await ids.authenticate_password(pkt.username, pkt.password or b"") is not None
            if not ok and self.credentials.configured:
                ok = self.credentials.check(pkt.username, pkt.password)
            if not ok and (store_on or self.credentials.configured or not cfg.allow_anonymous):
                if ids is not None:
                    ids.throttle.failed("mqtt", conn.peer)
                self.processor.metrics.inc("auth_failed", "mqtt")
                log.warning("login failed: protocol=mqtt from=%s user=%r", conn.peer, pkt.username)
                conn.refuse(C.RC_BAD_USERNAME_OR_PASSWORD, "bad user name or password")
                return
            if ids is not None:
                ids.throttle.succeeded("mqtt", conn.peer)
        elif not cfg.allow_anonymous:
            conn.refuse(C.RC_NOT_AUTHORIZED if v5 else C.RC_BAD_USERNAME_OR_PASSWORD,
                        "anonymous clients are not allowed")
            return
        elif store_on and not self.allow_anonymous:
            conn.refuse(C.RC_NOT_AUTHORIZED, "anonymous clients are not allowed: log in")  # 3.1.1: 5
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
        if not self._lease(conn, pkt, cid):
            return
        # another gateway's session comes here first (fleet.py), then the takeover here; a new
        # device's record is created where the brokers hold nothing of it, without a read first
        ctx = RequestContext(protocol="mqtt", client_id=cid, remote_address=conn.peer, principal=pkt.username)
        fresh = None
        if expiry and not pkt.clean_start and self.fleet.unknown(cid):
            fresh = await self._create(cid, pkt, expiry, ctx)
        await self._connect_rest(conn, pkt, ctx, expiry, assigned, fresh)

    def _lease(self, conn: Connection, pkt: C.Connect, cid: str) -> bool:
        """A connection slot of the user and client id (a takeover frees its own); False: refused."""
        ids = self.identities
        if ids is None:
            return True
        prev = self.sessions.get(cid)
        try:
            conn.lease = ids.traffic.connect(pkt.username, cid, address=conn.peer,
                                             replaces=prev is not None and prev.conn is not None)
        except QuotaExceededError as e:
            self.processor.metrics.inc("quota_exceeded", "mqtt")
            log.warning("refused: protocol=mqtt client=%s from=%s: %s", cid, conn.peer, e)
            rate = e.details.get("what") == "connection_rate"  # 0x9F Connection rate exceeded
            conn.refuse(C.RC_CONNECTION_RATE_EXCEEDED if rate else C.RC_QUOTA_EXCEEDED, str(e))  # 3.1.1: 3
            return False
        return True

    async def _connect_rest(self, conn: Connection, pkt: C.Connect, ctx: RequestContext, expiry: int,
                            assigned: str | None, fresh: tuple[Session, bytes] | None) -> None:
        """A CONNECT once admitted (``fresh``: the new session whose record it created)."""
        cid = ctx.client_id
        if fresh is None:
            await self.fleet.claim(cid, pkt.clean_start)
            if conn.closed:
                return
        old = self.sessions.get(cid)
        if old is not None and old.conn is not None:
            oc = old.conn
            oc.close(C.RC_SESSION_TAKEN_OVER, "session taken over", publish_will=True)
            self.detach(oc)
            old = self.sessions.get(cid)  # a session that ended with that connection is gone
        if old is not None:
            self.wills.cancel(old)  # a new connection to the session cancels a delayed will
        present = False
        if old is not None and not pkt.clean_start:
            s = old
            present = True
            s.version = pkt.protocol_level
        else:
            if old is not None:
                await self.end_session(old)
            s = fresh[0] if fresh is not None and old is None else Session(cid, pkt.protocol_level, expiry, ctx)
            self.sessions[cid] = s
        self._enter(s, ctx, expiry, pkt)
        if conn.closed:  # the client went away while we were busy
            s.disconnected_at = now_ms()
            if not s.persistent:
                await self.end_session(s)
            else:
                self.session_store.arm_expiry(s, self._expire)
                if fresh is not None and s is fresh[0]:
                    self.session_store.save_soon(s)  # its created record says online here
            return
        connack = self._accept(conn, pkt, s, present, assigned)
        if s.persistent and (fresh is None or s is not fresh[0] or s.to_json() != fresh[1]):
            await self._save_then_resume(conn, s, connack)  # (else: created as is, durable)
        else:
            self._resume(conn, s, connack)

    def _enter(self, s: Session, ctx: RequestContext, expiry: int, pkt: C.Connect) -> None:
        """``s`` is the CONNECT's session: its expiry and identity from now on, no expiry timer."""
        s.expiry = expiry
        s.ctx = ctx
        if self.access.login(s, pkt.username) and self.access.enforced and s.subs:
            self.routing.changed()  # dispatch plans decided what this session may read
        if s.expiry_handle is not None:
            s.expiry_handle.cancel()
            s.expiry_handle = None

    def _accept(self, conn: Connection, pkt: C.Connect, s: Session, present: bool, assigned: str | None) -> bytes:
        """Attach ``s`` to ``conn``; returns the CONNACK to send. A persistent session's waits for
        its record naming this gateway as the online owner to be durable (written in a batch with
        other CONNECTs' records: session_store.py); meanwhile what is sent to it waits behind it."""
        if s.persistent:
            s.disconnected_at = 0
            conn.hold()
        self.fleet.new_owner(s)
        conn.attach(s, pkt)
        self.tail.attach(s)
        if pkt.protocol_level == C.MQTT_5:
            cprops = self.config.connack_properties(pkt.properties, s.expiry, conn.keepalive, pkt.keepalive, assigned)
            connack = encode(C.Connack(present, 0, cprops), C.MQTT_5)
        else:
            connack = C.CONNACK_V3_OK[present]
        self.connections.add(conn)
        self.processor.metrics.inc("connections", "mqtt")
        return connack

    async def _save_then_resume(self, conn: Connection, s: Session, connack: bytes) -> None:
        try:
            await self.session_store.save(s)
        except (UnimqError, OSError) as e:
            log.warning("mqtt: session %r could not be stored, CONNECT refused: %s", s.client_id, e)
            conn.refuse(C.RC_SERVER_UNAVAILABLE, "the session could not be stored")
            conn.lost()
            return
        if not conn.closed:
            self._resume(conn, s, connack)

    def _resume(self, conn: Connection, s: Session, connack: bytes) -> None:
        """The CONNACK, then what the session has to resend and its queues."""
        conn.send_first(connack)
        # resume: PUBRELs, then unacknowledged PUBLISHes with DUP, then the queues
        for pid in sorted(s.pubrel):
            conn.send(encode(C.PubRel(pid), conn.version))
        for pid, f in list(s.inflight.items()):
            if f.receipt is not None:
                continue
            conn.send_publish(f.msg, f.qos, False, True, pid, f.sub_ids)
        self.delivery.resume(s)
        self.shared.wake_session(s, reconnected=True)

    async def _create(self, cid: str, pkt: C.Connect, expiry: int, ctx: RequestContext) -> tuple[Session, bytes] | None:
        """A new persistent session for ``cid`` (unknown here: ``Fleet.unknown``) with its record,
        created where the brokers hold nothing of it (one batched call instead of a read and then a
        write: a storm of new devices); None when refused (a record the feed has not brought here
        yet, or a tombstone: ``Fleet.claim`` reads it). The record is what the CONNECT writes
        after attaching the session, so it is not written again unless the session changed."""
        s, record, f = self._start_create(pkt, expiry, ctx)
        try:
            created = await f
        except (UnimqError, OSError) as e:
            log.warning("mqtt: session %r could not be created, reading it: %s", cid, e)
            return None
        return (s, record) if created else None

    def _start_create(self, pkt: C.Connect, expiry: int, ctx: RequestContext) -> tuple[Session, bytes, Future[bool]]:
        s = Session(ctx.client_id, pkt.protocol_level, expiry, ctx)
        s.username = pkt.username
        self.fleet.new_owner(s)
        record = s.to_json(online=True)
        return s, record, self.session_store.create(s, record)

    def connect_now(self, conn: Connection, pkt: C.Connect) -> bool:
        """A 3.1/3.1.1 CONNECT of a new device's persistent session (anonymous, unknown here: a storm)
        without a worker task: its record is created and the rest runs from the create's callback
        (:meth:`_created`). False: nothing done (the worker runs :meth:`connect`)."""
        cfg, ids, cid = self.config, self.identities, pkt.client_id
        if (pkt.username is not None or pkt.clean_start or not cid or pkt.protocol_level == C.MQTT_5
                or not cfg.allow_anonymous or cfg.use_identity_as_username or not self.fleet.unknown(cid)
                or (ids is not None and ids.has_users and not self.allow_anonymous)):
            return False
        if not self._lease(conn, pkt, cid):
            return True
        ctx = RequestContext(protocol="mqtt", client_id=cid, remote_address=conn.peer)
        s, record, f = self._start_create(pkt, SESSION_NEVER_EXPIRES, ctx)
        f.add_done_callback(lambda f: self._created(conn, pkt, s, record, f))
        return True

    def _created(self, conn: Connection, pkt: C.Connect, s: Session, record: bytes, f: Future[bool]) -> None:
        """:meth:`connect_now`'s create is done: the CONNACK at once (durable as created), or the
        rest of :meth:`connect` in a worker task (refused, failed, gone, or a session of it here)."""
        cid = s.client_id
        e = None if f.cancelled() else f.exception()
        if f.cancelled() or (e is not None and not isinstance(e, (UnimqError, OSError))):  # (stopping)
            if e is not None:
                log.error("mqtt: creating the session of %r failed", cid, exc_info=e)
            conn.close(C.RC_UNSPECIFIED_ERROR, "internal error")
            conn.lost()
            return
        if e is not None:
            log.warning("mqtt: session %r could not be created, reading it: %s", cid, e)
        fresh = (s, record) if e is None and f.result() else None
        if fresh is None or conn.closed or cid in self.sessions:
            conn.work_on(self._connect_rest(conn, pkt, s.ctx, s.expiry, None, fresh))
            return
        self.sessions[cid] = s
        self._enter(s, s.ctx, s.expiry, pkt)
        connack = self._accept(conn, pkt, s, False, None)
        if s.to_json() != record:
            conn.work_on(self._save_then_resume(conn, s, connack))
        else:
            self._resume(conn, s, connack)
            conn.work_on(None)

    async def _token_login(self, username: str, password: bytes | None) -> bool:
        """A JWT of a configured issuer as the password (as EMQX's JWT authentication): valid, and its
        subject is the CONNECT's user name (``gateway.access.tokens``)."""
        return await self.identities.token_names(password, username)

    def detach(self, conn: Connection) -> None:
        """The connection is gone (closed by either side): will, session end or expiry."""
        self.connections.discard(conn)
        conn.release_lease()
        s = conn.session
        if s is None or s.conn is not conn:
            return
        s.conn = None
        self.tail.detach(s)
        s.disconnected_at = now_ms()
        self.delivery.offline(s)
        # shared in-flight messages go back to the group at once
        for pid, f in list(s.inflight.items()):
            if f.receipt is not None:
                del s.inflight[pid]
                self.spawn(self.shared.release_and_wake(s, f))
        if conn.will is not None and conn.publish_will:
            self.wills.gone(s, conn.will, conn.version == C.MQTT_5)
        conn.will = None
        if not s.persistent:
            self.spawn(self.forget_session(s))
        else:
            self.session_store.arm_expiry(s, self._expire)
            if s.dirty:
                self.spawn(self._save_offline(s))
            else:  # no floor to commit first: the record joins the next batch, no task of its own
                self.session_store.save_soon(s)

    async def _save_offline(self, s: Session) -> None:
        """A persistent session went offline: its acknowledged floors first, then its record, so
        a gateway that takes it from the record does not send acknowledged messages again."""
        await self.delivery.commit_offsets()
        await self.session_store.save(s)
