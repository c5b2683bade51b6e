"""Receipt handles: the opaque token a popped message is acked or re-hidden with.

It names the broker, topic, queue and offset of the delivery plus a version
that changes whenever the message is re-hidden or redelivered, so a stale
handle (from a delivery that already timed out) cannot ack the newer one.
"""

from __future__ import annotations

import base64
from typing import NamedTuple

from .errors import UnimqError


class InvalidReceiptHandleError(UnimqError):
    code = "INVALID_RECEIPT_HANDLE"


class ReceiptHandle(NamedTuple):
    broker: str
    topic: str
    queue_id: int
    offset: int
    version: int
    visible_at_ms: int

    def encode(self) -> str:
        t = base64.urlsafe_b64encode(self.topic.encode()).decode().rstrip("=")
        b = base64.urlsafe_b64encode(self.broker.encode()).decode().rstrip("=")
        return f"1.{b}.{t}.{self.queue_id}.{self.offset}.{self.version}.{self.visible_at_ms}"

    @classmethod
    def decode(cls, s: str) -> "ReceiptHandle":
        try:
            v, b, t, q, o, ver, vis = s.split(".")
            if v != "1":
                raise ValueError(v)
            return cls(_unb64(b), _unb64(t), int(q), int(o), int(ver), int(vis))
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            raise InvalidReceiptHandleError(f"malformed receipt handle {s[:64]!r}") from e


def _unb64(s: str) -> str:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4)).decode()
