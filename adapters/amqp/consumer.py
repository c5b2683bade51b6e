"""One consumer (Basic.Consume) of a queue on a channel, and its credit.

Why its own module: a queue's pump (``queue_state``) hands messages to
consumers round-robin by their credit, and the channel that owns them settles
their unacknowledged messages; the credit rule (prefetch per consumer, the
channel's global prefetch, flow and a writable transport) is defined here once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .queue_state import UNBOUNDED_CREDIT

if TYPE_CHECKING:
    from .channel import Channel
    from .queue_state import QueueState

__all__ = ["Consumer"]


class Consumer:
    """Basic.Consume's subscription of a channel to a queue, with its prefetch window."""

    __slots__ = ("channel", "queue", "tag", "no_ack", "exclusive", "prefetch", "unacked")

    def __init__(self, channel: Channel, queue: QueueState, tag: str, no_ack: bool, exclusive: bool,
                 prefetch: int) -> None:
        self.channel = channel
        self.queue = queue
        self.tag = tag
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.unacked = 0

    def credit(self) -> int:
        """How many more messages this consumer may be handed now (0: none; its channel is paused)."""
        ch = self.channel
        if not ch.active or ch.closing or not ch.conn.writable:
            return 0
        if self.no_ack:
            return UNBOUNDED_CREDIT
        n = self.prefetch - self.unacked if self.prefetch else UNBOUNDED_CREDIT
        if ch.global_prefetch:
            n = min(n, ch.global_prefetch - len(ch.unacked))
        return n if n > 0 else 0
