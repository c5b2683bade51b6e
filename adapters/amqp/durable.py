"""How the door's durable objects are named and encoded in the processor's key-value state.

Why one module: exchanges, queues, bindings and queue cursors survive a restart
as entries of the kv namespace ``amqp``, written as they change and read back
once at start (``AmqpBroker._load``), so the key layout (a kind letter, the
vhost, the names, separated by the ASCII unit separator) and the encoding of
AMQP argument tables are defined here, once, for both directions.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from pamqp import decode as pdecode
from pamqp import encode as pencode

if TYPE_CHECKING:
    from .routing import Binding

__all__ = ["KV_NS", "SEP", "args_key", "args_decode", "queue_key", "cursor_key", "exchange_key", "binding_key"]

KV_NS = "amqp"
SEP = "\x1f"


def args_key(args: dict[str, Any] | None) -> str:
    """An argument table as text (a key part and a JSON value): its AMQP field-table encoding in base64."""
    if not args:
        return ""
    return base64.b64encode(pencode.field_table(args)).decode("ascii")


def args_decode(s: str) -> dict[str, Any]:
    """The table :func:`args_key` encoded."""
    if not s:
        return {}
    return pdecode.field_table(base64.b64decode(s))[1]


def queue_key(vhost: str, name: str) -> str:
    """A durable queue's definition (JSON: auto_delete, args)."""
    return SEP.join(("q", vhost, name))


def cursor_key(vhost: str, name: str) -> str:
    """A durable queue's cursor over its LMQ (JSON: {"l": {broker: lane record}}, see gateway.lmq_reader.Lane)."""
    return SEP.join(("c", vhost, name))


def exchange_key(vhost: str, name: str) -> str:
    """A durable exchange (JSON: type, auto_delete, internal, args)."""
    return SEP.join(("x", vhost, name))


def binding_key(vhost: str, b: Binding) -> str:
    """A binding between durable objects (the value is ``{}``: everything is in the key)."""
    return SEP.join(("b", vhost, b.source, b.kind, b.destination, b.routing_key, b.arguments_key))
