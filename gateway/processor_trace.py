"""The processor's trace call: a message's timeline read back from the trace topic.

Why a mixin of :class:`gateway.processor.MessagingProcessor`: the processor module holds
every door's hot paths and is at its size limit; this call is rare and reads nothing the
hot paths keep. It is part of the contract (``gateway/api.py``) like every other call, so
namespaces and the processor RPC treat it the same.

Authorization: a timeline shows who sent and who consumed a message, so it asks what
reading the message asks (``SUBSCRIBE`` on its topic, as ``query_message_by_id`` does);
no events is an empty answer for anyone (it names no topic and shows nothing).
"""

from __future__ import annotations

from typing import Callable

from core_broker.system_topics import TRACE_TOPIC

from .auth import Action, Resource
from .broker_client import BrokerClient
from .context import RequestContext
from .trace import Tracer, parse_events, sort_timeline

__all__ = ["TraceCalls", "MAX_EVENTS"]

#: events read per message (a message redelivered hundreds of times shows its first ones)
MAX_EVENTS = 1000


class TraceCalls:
    """``message_trace`` over the processor's broker client."""

    broker: BrokerClient
    tracer: Tracer
    _check: Callable[[RequestContext, Action, Resource, str], None]

    async def message_trace(self, ctx: RequestContext, message_id: str) -> list[dict]:
        """The trace events of ``message_id`` sorted by time (empty: not traced, or unknown)."""
        await self.tracer.flush()  # what this process buffered is part of the answer
        found = await self.broker.query_by_key(TRACE_TOPIC, message_id, 0, 2**62, MAX_EVENTS)
        events = parse_events(found, message_id)
        for t in {e.get("topic", "") for e in events}:
            self._check(ctx, Action.SUBSCRIBE, Resource.TOPIC, str(t))
        return sort_timeline(events)
