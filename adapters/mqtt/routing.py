"""Routing: subscriptions -> dispatch plans, with no scan of topics or subscriptions per message.

At publish time the topic-filter trie (``topics.TopicTrie``) finds the matching
subscriptions. Each QoS 1/2 subscription owns a light message queue
(``%LMQ%mqtt/<client>/<n>``); a message is multi-dispatched into the LMQs of
every matching subscription (``Message.extra_dispatch``: body stored once). QoS 0
deliveries go straight from memory to the subscribers online. A shared
subscription group (``$share/g/f``) has one LMQ that its members pop from.

A :class:`Plan` is where one PUBLISH of a QoS to a topic goes; plans are cached
per (topic, QoS) until the subscriptions change, so a batch of publishes to a few
topics builds its dispatch targets once, and read rights (ACL) are decided when a
plan is built, not per message.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from core_broker.model import DispatchTarget

from .acl import AccessControl
from .session import Session, Subscription
from .topics import TopicTrie, filter_matches, lmq_safe, unified_topic

__all__ = ["Routing", "Plan", "SharedGroup", "LMQ_PREFIX", "SHARE_LMQ_PREFIX"]

LMQ_PREFIX = "%LMQ%mqtt/"
SHARE_LMQ_PREFIX = "%LMQ%mqtt-share/"


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

    def next_online(self) -> Subscription | None:
        """The next member online, round robin (QoS 0 deliveries to the group)."""
        online = self.online()
        if not online:
            return None
        self.rr += 1
        return online[self.rr % len(online)]


class Plan:
    """Where one PUBLISH goes (see :meth:`Routing.plan`)."""

    __slots__ = ("ut", "tb", "targets", "lmq_subs", "direct", "wake_groups", "matched", "cacheable", "remote0")

    def __init__(self, ut: str, tb: bytes, targets: tuple[DispatchTarget, ...],
                 lmq_subs: tuple[Subscription | None, ...], direct: tuple[Subscription, ...],
                 wake_groups: tuple[SharedGroup, ...], matched: bool, cacheable: bool = True,
                 remote0: tuple[Subscription, ...] = ()) -> None:
        self.ut = ut  # unified topic
        self.tb = tb  # the MQTT topic, encoded
        self.targets = targets  # the LMQs, in the order of lmq_subs
        self.lmq_subs = lmq_subs  # QoS 1/2 subscriptions (None: a shared group's LMQ)
        self.direct = direct  # QoS 0 deliveries, straight from memory to those online
        self.wake_groups = wake_groups
        self.matched = matched
        # the same for every PUBLISH of its topic and QoS (no shared group's round robin, no
        # no-local subscription): reusable while the subscriptions do not change
        self.cacheable = cacheable
        # QoS 0 deliveries to subscriptions with a queue of sessions another gateway holds: each
        # goes into that queue, with a note to the owner, while the session is online there
        # (decided per publish batch, not here: a copy goes online and offline without the plans
        # being dropped); its gateway's tail does not read them (tail.py)
        self.remote0 = remote0

    def with_remote0(self, alive: Callable[[str], bool]) -> tuple[tuple[DispatchTarget, ...],
                                                                  tuple[Subscription | None, ...]]:
        """The targets and queued subscriptions of one publish batch's run of this plan, with its
        QoS 0 deliveries to sessions online at another live gateway (``alive``) added: into their
        queues, each with a note to its owner. Offline there, QoS 0 is not kept for them."""
        more = tuple(sub for sub in self.remote0 if sub.session.online and alive(sub.session.owner))  # type: ignore[arg-type]
        if not more:
            return self.targets, self.lmq_subs
        return self.targets + tuple(DispatchTarget(sub.lmq, 0) for sub in more), self.lmq_subs + more  # type: ignore[arg-type]


class Routing:
    """The subscriptions of every session, indexed for matching, and the plans made from them."""

    def __init__(self, access: AccessControl, ensure_lmq: Callable[[str], Awaitable[None]]) -> None:
        self.access = access
        self.ensure_lmq = ensure_lmq  # makes an LMQ exist before anything is dispatched into it
        self.trie = TopicTrie(_key_of)
        self.groups: dict[tuple[str, str], SharedGroup] = {}
        self._cache: dict[str, tuple[list[Subscription], list[SharedGroup]]] = {}
        self.plans: dict[tuple[str, int], Plan] = {}  # (topic, qos) -> plan (see plan)
        self.gen = 0  # bumped whenever subscriptions change (plans made before are stale)
        self._unified: dict[str, str] = {}  # MQTT topic -> unified topic (cache)
        # several gateways: groups whose filter names a first level are served fleet-wide from
        # the store topic (fleet_share.py), not by this gateway's dispatch
        self.fleet_groups = False
        # several gateways: this gateway's id (a subscription of a session with another owner is
        # a routing copy's, fleet.py)
        self.here: str | None = None

    # -- the index

    def changed(self) -> None:
        """Subscriptions (or what a session may read) changed: every cached answer is stale."""
        self._cache.clear()
        self.plans.clear()
        self.gen += 1

    def index(self, sub: Subscription) -> None:
        self.changed()
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

    def unindex(self, s: Session, sub: Subscription) -> str | None:
        """Take a subscription out; return the LMQ that is no longer needed, if any (its own,
        or its shared group's when it was the last member)."""
        self.changed()
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
        return sub.lmq

    @staticmethod
    def new_lmq(s: Session) -> str:
        """A new QoS 1/2 subscription's LMQ name (never used before by this session)."""
        s.lmq_seq += 1
        return f"{LMQ_PREFIX}{lmq_safe(s.client_id)}/{s.lmq_seq}"

    def group_of(self, lmq: str) -> SharedGroup | None:
        for g in self.groups.values():
            if g.lmq == lmq:
                return g
        return None

    # -- matching

    def match(self, topic: str) -> tuple[list[Subscription], list[SharedGroup]]:
        """The subscriptions matching ``topic`` (one per session: the highest QoS) and shared groups."""
        r = self._cache.get(topic)
        if r is None:
            r = self._match(topic)
            self._keep(topic, r)
        return r

    def _keep(self, topic: str, r: tuple[list[Subscription], list[SharedGroup]]) -> None:
        if len(self._cache) > 20000:
            self._cache.clear()
        self._cache[topic] = r

    def _match(self, topic: str) -> tuple[list[Subscription], list[SharedGroup]]:
        entries = self.trie.match(topic)
        if len(entries) == 1 and not isinstance(entries[0], SharedGroup):
            return entries, []  # (a device's own topic: one subscription, nothing to choose)
        best: dict[str, Subscription] = {}
        groups: list[SharedGroup] = []
        for e in entries:
            if isinstance(e, SharedGroup):
                if not self.fleet_groups or e.filter[0] in "+#$":
                    groups.append(e)
                continue
            cid = e.session.client_id
            cur = best.get(cid)
            if cur is None or e.qos > cur.qos or (e.qos == cur.qos and e.lmq and not cur.lmq):
                best[cid] = e
        return list(best.values()), groups

    def unified(self, topic: str) -> str:
        """The store topic of ``topic``: its first level's (cached per first level, so a fleet's
        one topic per device costs no entry of its own)."""
        first = topic.partition("/")[0]
        ut = self._unified.get(first)
        if ut is None:
            if len(self._unified) > 50_000:
                self._unified.clear()
            ut = self._unified[first] = unified_topic(first)
        return ut

    async def plan(self, topic: str, qos: int, publisher: str) -> Plan:
        """Where a PUBLISH of ``qos`` to ``topic`` goes: LMQs to dispatch into, QoS 0 subscribers.

        Cached per (topic, QoS) while the subscriptions do not change, when nothing in
        it depends on the message or its publisher (no shared groups: their round robin
        and pending count move per message; no no-local subscriptions).
        """
        gen = self.gen
        # (the match is kept for the tail and other doors only when the plan is not: a cached
        # plan answers for its topic, and a fleet's first messages each bring a new topic)
        matched = self._cache.get(topic)
        subs, groups = matched if matched is not None else self._match(topic)
        targets: list[DispatchTarget] = []
        lmq_subs: list[Subscription | None] = []
        direct: list[Subscription] = []
        remote0: list[Subscription] = []
        wake_groups: list[SharedGroup] = []
        cacheable = not groups
        access = self.access if self.access.enforced else None
        here = self.here
        for sub in subs:
            if access is not None and not access.can_read(sub.session, topic):
                continue
            if sub.no_local:
                cacheable = False
                if sub.session.client_id == publisher:
                    continue
            q = sub.qos if sub.qos < qos else qos
            if q == 0:
                owner = sub.session.owner
                if owner is not None and owner != here and here is not None and sub.lmq and sub.lmq_ready:
                    remote0.append(sub)
                else:
                    direct.append(sub)
                continue
            lmq = sub.lmq
            if lmq is None:  # pragma: no cover - QoS>0 subscriptions always have one
                continue
            if not sub.lmq_ready:
                await self.ensure_lmq(lmq)
                sub.lmq_ready = True
            targets.append(DispatchTarget(lmq, 0))
            lmq_subs.append(sub)
        for g in groups:
            if qos == 0 or g.qos == 0:
                m = g.next_online()
                if m is not None:
                    direct.append(m)
                continue
            if not g.lmq_ready:
                await self.ensure_lmq(g.lmq)
                g.lmq_ready = True
            targets.append(DispatchTarget(g.lmq, 0))
            lmq_subs.append(None)
            g.pending += 1
            wake_groups.append(g)
        plan = Plan(self.unified(topic), topic.encode(), tuple(targets), tuple(lmq_subs), tuple(direct),
                    tuple(wake_groups), bool(subs or groups), cacheable, tuple(remote0))
        if cacheable and gen == self.gen:
            if len(self.plans) > 20000:
                self.plans.clear()
            self.plans[(topic, qos)] = plan
        elif matched is None and gen == self.gen:
            self._keep(topic, (subs, groups))
        return plan

    @staticmethod
    def sub_ids(s: Session, topic: str, sub: Subscription) -> list[int] | None:
        """The v5 subscription identifiers a message on ``topic`` carries to ``s``."""
        if not s.has_sub_ids:
            return None
        ids = [x.sub_id for x in s.subs.values() if x.sub_id and not x.group and filter_matches(x.filter, topic)]
        if sub.group and sub.sub_id:
            ids.append(sub.sub_id)
        return ids or None


def _key_of(entry: Subscription | SharedGroup) -> str | tuple[str, str]:
    """A trie entry's key (see :meth:`Routing.index`): its session's client id, or its group's."""
    if isinstance(entry, SharedGroup):
        return ("$share", entry.group)
    return entry.session.client_id


def member_sub_ids(sub: Subscription) -> list[int] | None:
    """A shared group member's subscription identifier, as a PUBLISH carries it."""
    return [sub.sub_id] if sub.sub_id else None


