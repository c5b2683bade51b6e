"""The AMQP connection handshake's decisions: what the server announces, who the client is, tuning.

Why apart from the connection: these are pure decisions over the client's
StartOk and TuneOk and the door's settings (no I/O), so they are kept out of
the transport loop and tested directly; the connection (``connection``) sends
the methods and moves its state (``state``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from pamqp import decode as pdecode

from . import codec
from .errors import AmqpError

__all__ = ["SERVER_PROPERTIES", "Tuning", "credentials", "authenticate", "tune"]

SERVER_PROPERTIES = {
    "product": "unimq",
    "version": "0.1.0",
    "platform": "Python",
    "cluster_name": "unimq",
    "copyright": "unimq contributors",
    "information": "AMQP 0-9-1 door of unimq (https://www.rabbitmq.com/amqp-0-9-1-reference.html dialect)",
    "capabilities": {
        "publisher_confirms": True,
        "exchange_exchange_bindings": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
        "per_consumer_qos": True,
        "consumer_priorities": False,
        "direct_reply_to": False,
    },
}


def credentials(mechanism: str, response: str | bytes | None) -> tuple[str | None, str | None]:
    """(user, password) from a StartOk's SASL response (PLAIN or AMQPLAIN); (None, None) if unreadable.

    Any other mechanism is refused with 403 ACCESS_REFUSED."""
    raw = response.encode("utf-8") if isinstance(response, str) else bytes(response or b"")
    user: Any = None  # an AMQPLAIN table may hold any field type: then no user matches
    password: Any = None
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) == 3:
            user, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    elif mechanism == "AMQPLAIN":
        try:
            table = pdecode.field_table(struct.pack(">I", len(raw)) + raw)[1]
            user, password = table.get("LOGIN"), table.get("PASSWORD")
            if isinstance(user, bytes):
                user = user.decode("utf-8", "replace")
            if isinstance(password, bytes):
                password = password.decode("utf-8", "replace")
        except (ValueError, TypeError):
            pass
    else:
        raise AmqpError(codec.ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'", 10, 11,
                        hard=True)
    return user, password


def authenticate(m: Any, settings: Any, peer: str) -> str:
    """The user a Connection.StartOk ``m`` logs in as, from ``peer`` ("host:port"); else 403 (hard).

    ``settings``: ``amqp_users`` (user -> password) and ``amqp_loopback_users`` (users
    allowed from localhost only, as RabbitMQ's guest)."""
    user, password = credentials(m.mechanism, m.response)
    users = settings.amqp_users
    if user is None or users.get(user) != password:
        raise AmqpError(codec.ACCESS_REFUSED,
                        f"Login was refused using authentication mechanism {m.mechanism}. For details see the "
                        "broker logfile.", 10, 11, hard=True)
    if user in settings.amqp_loopback_users:
        host = peer.rsplit(":", 1)[0]
        if not (host.startswith("127.") or host in ("::1", "localhost") or host.startswith("::ffff:127.")):
            raise AmqpError(codec.ACCESS_REFUSED, f"user '{user}' can only connect via localhost", 10, 11,
                            hard=True)
    return user


@dataclass(frozen=True)
class Tuning:
    """What a connection runs with after Connection.TuneOk."""

    frame_max: int
    channel_max: int
    heartbeat: int


def tune(m: Any, settings: Any) -> Tuning:
    """The limits a Connection.TuneOk ``m`` agrees to within the door's (0: the server's value);
    a frame_max outside [FRAME_MIN_SIZE, amqp_frame_max] is 530 NOT_ALLOWED (hard)."""
    fm = m.frame_max or settings.amqp_frame_max
    if fm < codec.FRAME_MIN_SIZE:
        raise AmqpError(codec.NOT_ALLOWED, f"frame_max={fm} < {codec.FRAME_MIN_SIZE} min size", 10, 31, hard=True)
    if fm > settings.amqp_frame_max:
        raise AmqpError(codec.NOT_ALLOWED, f"frame_max={fm} > {settings.amqp_frame_max} max size", 10, 31,
                        hard=True)
    cm = m.channel_max or settings.amqp_channel_max
    return Tuning(fm, min(cm, settings.amqp_channel_max), m.heartbeat)
