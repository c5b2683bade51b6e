"""Message-trace events of the AMQP door (gateway/trace.py): its consumers are its own
(messages delivered from memory, acked without a store call), so the processor never sees
these deliveries and the door records them itself.

Each function is called behind a ``tracer.on`` check by its caller, so a door without
traced topics pays one attribute read per delivery or settle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.trace import Tracer

if TYPE_CHECKING:
    from .lease import Lease

__all__ = ["delivered", "settled"]


def delivered(tracer: Tracer, ctx: Any, lease: Lease, via: str, no_ack: bool) -> None:
    """A message went out to a consumer (``basic.deliver``) or a ``basic.get``."""
    q = lease.queue
    tracer.message(lease.msg, "delivered", "amqp", client=ctx.client_id, address=ctx.remote_address,
                   group=q.name, via=via, attempt=lease.attempt, redelivered=lease.attempt > 1)
    if no_ack:
        tracer.message(lease.msg, "acked", "amqp", client=ctx.client_id, group=q.name, auto=True)


def settled(tracer: Tracer, ctx: Any, lease: Lease, event: str, **fields: Any) -> None:
    """An ack, a requeue (``retried``), a reject without requeue (``nacked``), an expiry or a
    dead-lettering of one message of a queue."""
    tracer.message(lease.msg, event, "amqp", client=ctx.client_id, group=lease.queue.name, **fields)
