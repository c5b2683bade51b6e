"""Receipt handles: the opaque token a popped message is acked or re-hidden with.

It names the broker, topic, queue and offset of the delivery plus a version
that changes whenever the message is re-hidden or redelivered, so a stale
handle (from a delivery that already timed out) cannot ack the newer one.

Format: ``1.<b64 broker>.<b64 topic>.<queue>.<offset>.<version>.<visible at ms>``.
Every pop makes one handle per message and every ack reads one, so the base64
parts (a handful of distinct brokers and topics) are encoded and decoded once
and cached; only the numbers are formatted and parsed per handle.
"""

from __future__ import annotations

import base64
from typing import NamedTuple

from .errors import UnimqError

_CACHE_LIMIT = 4096  # distinct (broker, topic) prefixes / b64 fields kept


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
        return f"{handle_prefix(self.broker, self.topic)}{self.queue_id}.{self.offset}.{self.version}.{self.visible_at_ms}"

    @classmethod
    def decode(cls, s: str) -> "ReceiptHandle":
        try:
            v, b, t, q, o, ver, vis = s.split(".")
            if v != "1":
                raise ValueError(v)
            return cls(_unb64(b), _unb64(t), int(q), int(o), int(ver), int(vis))
        except (ValueError, TypeError, UnicodeDecodeError, AttributeError) as e:
            raise InvalidReceiptHandleError(f"malformed receipt handle {str(s)[:64]!r}") from e


_prefixes: dict[tuple[str, str], str] = {}


def handle_prefix(broker: str, topic: str) -> str:
    """``1.<b64 broker>.<b64 topic>.``: the part of a handle shared by one queue's deliveries."""
    p = _prefixes.get((broker, topic))
    if p is None:
        if len(_prefixes) >= _CACHE_LIMIT:
            _prefixes.clear()
        b = base64.urlsafe_b64encode(broker.encode()).decode().rstrip("=")
        t = base64.urlsafe_b64encode(topic.encode()).decode().rstrip("=")
        p = _prefixes[(broker, topic)] = f"1.{b}.{t}."
    return p


def broker_of(handle: str) -> str:
    """The broker a handle names (what a gateway routes an ack by), without decoding the rest."""
    try:
        v, b, _ = handle.split(".", 2)
        if v != "1":
            raise ValueError(v)
        return _unb64(b)
    except (ValueError, TypeError, UnicodeDecodeError, AttributeError) as e:
        raise InvalidReceiptHandleError(f"malformed receipt handle {str(handle)[:64]!r}") from e


_decoded: dict[str, str] = {}


def _unb64(s: str) -> str:
    r = _decoded.get(s)
    if r is None:
        r = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4)).decode()
        if len(_decoded) >= _CACHE_LIMIT:
            _decoded.clear()
        _decoded[s] = r
    return r
