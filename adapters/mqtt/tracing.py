"""Message-trace events of the MQTT door (gateway/trace.py): subscribers read their LMQs
through the door (a pull by offset per session, or a message handed on from memory), so the
processor does not see these deliveries and the door records them itself.

A traced message's outbound form (:class:`~.mapping.Outgoing`) carries ``trace`` = (message
id, topic), set only while tracing is on; otherwise the slot stays unset and no hook costs more
than its caller's ``tracer.on`` check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from core_broker.system_topics import is_lmq
from gateway.naming import unified_topic_of_mqtt
from gateway.trace import Tracer, origin_topic

if TYPE_CHECKING:
    from core_broker.model import StoredMessage

    from .mapping import Outgoing
    from .session import Inflight, Session

__all__ = ["acked", "delivered", "mark_read", "mark_sent"]


def mark_sent(results: Sequence[Any], outs: Iterable[Outgoing | None]) -> None:
    """Publishes just stored: their outbound forms name the stored message."""
    for res, out in zip(results, outs):
        if out is not None:
            out.trace = (res.message_id, res.topic)


def mark_read(out: Outgoing, m: StoredMessage) -> Outgoing:
    """A message read back from a subscriber's LMQ (read there, it names the LMQ as its topic:
    the topic it was stored in is the MQTT topic's first level, the door's rule)."""
    topic = origin_topic(m)
    out.trace = (m.message_id, unified_topic_of_mqtt(out.topic) if is_lmq(topic) else topic)
    return out


def delivered(tracer: Tracer, s: Session, filt: str, out: Outgoing, qos: int, event: str = "delivered") -> None:
    """A PUBLISH went to ``s`` for its subscription ``filt`` (or, ``event`` "expired", was dropped)."""
    t = getattr(out, "trace", None)
    if t is not None and tracer.sampled(t[1], t[0]):
        tracer.event(t[0], t[1], event, "mqtt", client=s.client_id, group=filt, via="subscription", qos=qos,
                     mqtt_topic=out.topic)


def acked(tracer: Tracer, s: Session, f: Inflight) -> None:
    """A QoS 1 PUBACK (or QoS 2 PUBREC) for an in-flight PUBLISH."""
    t = getattr(f.msg, "trace", None)
    if t is not None and tracer.sampled(t[1], t[0]):
        tracer.event(t[0], t[1], "acked", "mqtt", client=s.client_id, qos=f.qos)
