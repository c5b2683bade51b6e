"""Messages other doors send on MQTT topics reach MQTT subscribers: the door's processor Router.

AMQP's ``amq.topic`` with routing key ``a.b.c`` (and any door's message with an
``mqtt_topic`` property) is stored as MQTT ``a/b/c``; MQTT subscribers must get it as they
get an MQTT publish. The processor asks :meth:`CrossDoorRouter.route` before storing it
(which LMQs of matching QoS 1/2 subscriptions and shared groups it must also go to) and
calls :meth:`CrossDoorRouter.after_send` once it is stored (live delivery, wake-ups, QoS 0
fan-out). Kept apart from :mod:`.broker` (CONNECT, SUBSCRIBE, PUBLISH of the door's own
clients) because it is the other direction: the store's side of the door.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from core_broker.model import DispatchTarget, Message
from gateway.api import SendResult

from .mapping import P_ORIGIN, P_TOPIC, Outgoing, outgoing_from_stored
from .routing import Routing, SharedGroup, member_sub_ids
from .session import Subscription
from .tracing import delivered as trace_delivered, mark_sent as trace_mark_sent

if TYPE_CHECKING:
    from .broker import MQTTBroker

__all__ = ["CrossDoorRouter"]

_Plan = tuple[Outgoing, list[tuple[Subscription, DispatchTarget]], list[Subscription], list[SharedGroup]]


class CrossDoorRouter:
    """The MQTT door as a processor Router (``gateway.api.Router``) for other doors' messages."""

    def __init__(self, broker: "MQTTBroker") -> None:
        self.broker = broker
        # messages other doors are sending to MQTT subscribers: id(message) -> what route() decided
        self._plans: dict[int, _Plan] = {}

    def routes_from(self, protocol: str) -> bool:
        """Every door's messages but the door's own (routed at publish) may reach MQTT subscribers."""
        return protocol != "mqtt"

    def route(self, m: Message) -> Sequence[DispatchTarget]:
        """Dispatch targets for a message another door is storing with an ``mqtt_topic``.

        AMQP's ``amq.topic`` with routing key ``a.b.c`` is stored as MQTT ``a/b/c``
        (RabbitMQ's MQTT-plugin convention); MQTT subscribers must see it like any
        MQTT publish. QoS is the message's ``mqtt_qos`` (1 when absent: stored, acked).
        """
        if m.protocol == "mqtt":
            return ()  # the door routed its own publishes already
        b = self.broker
        props = m.properties
        topic = props.get(P_TOPIC) if props else None
        if not topic:
            return ()
        if b.tail.several:  # other gateways deliver it to their subscribers from their tails
            props[P_ORIGIN] = b.tail.stamp(m.topic)
        subs, groups = b.routing.match(topic)
        if not subs and not groups:
            return ()
        out = outgoing_from_stored(props, m.body, m.topic)
        out.ut = m.topic
        targets: list[DispatchTarget] = []
        lmq_subs: list[tuple[Subscription, DispatchTarget]] = []
        direct: list[Subscription] = []
        access = b.access if b.access.enforced else None
        fleet = b.fleet
        for sub in subs:
            if access is not None and not access.can_read(sub.session, topic):
                continue
            q = sub.qos if sub.qos < out.qos else out.qos
            if not sub.lmq or not sub.lmq_ready or (q == 0 and not fleet.remote(sub.session)):
                if sub.session.conn is not None:
                    direct.append(sub)
                continue
            if q == 0 and not fleet.alive(sub.session.owner):  # type: ignore[arg-type]
                continue  # (QoS 0 to a session online at another gateway: into its queue, as publish)
            t = DispatchTarget(sub.lmq, 0)
            targets.append(t)
            lmq_subs.append((sub, t))
        for g in groups:
            if out.qos and g.qos and g.lmq_ready:
                targets.append(DispatchTarget(g.lmq, 0))
                g.pending += 1
        if len(self._plans) > 10_000:  # sends that failed never reach after_send
            self._plans.clear()
        self._plans[id(m)] = (out, lmq_subs, direct, groups)
        return targets

    def after_send(self, messages: Sequence[Message], results: Sequence[SendResult]) -> None:
        """Live delivery of what :meth:`route` dispatched, once it is stored."""
        if not self._plans:
            return
        b = self.broker
        delivery = b.delivery
        for m, res in zip(messages, results):
            plan = self._plans.pop(id(m), None)
            if plan is None or res is None:
                continue
            out, lmq_subs, direct, groups = plan
            if delivery.tracer.on:
                trace_mark_sent((res,), (out,))
            extra = list(m.extra_dispatch)
            offsets = res.extra_offsets
            for sub, t in lmq_subs:
                if not b.fleet.owns(sub.session):
                    if b.fleet.alive(sub.session.owner):  # type: ignore[arg-type]
                        b.fleet.note(res.broker, sub.session, sub.lmq)  # type: ignore[arg-type]
                    continue
                try:
                    off = offsets[extra.index(t)]
                except (ValueError, IndexError):
                    delivery.must_pull(sub.session, sub, res.broker)
                    delivery.wake(sub.session)
                    continue
                delivery.offer(sub.session, sub, out, off, res.broker)
            for sub in direct:
                conn = sub.session.conn
                if conn is not None:
                    conn.deliver(out, 0, False, Routing.sub_ids(sub.session, out.topic, sub))
                    if delivery.tracer.on:
                        trace_delivered(delivery.tracer, sub.session, sub.filter, out, 0)
            for g in groups:
                if out.qos == 0 or g.qos == 0 or not g.lmq_ready:
                    member = g.next_online()
                    if member is not None and member.session.conn is not None:
                        member.session.conn.deliver(out, 0, False, member_sub_ids(member))
                else:
                    b.shared.wake(g)
        b.fleet.flush_notes()
        delivery.count_out()
