"""Traffic limits of one user or one client id, as a value that serialises to JSON (issue 19).

A :class:`Limits` names what one identity may use at the gateway: open
connections, new connections per second, publish messages and bytes per
second, subscriptions per connection. ``None`` is "no limit" for that figure.
Limits are set for a *subject*: ``user:<name>``, ``client:<client id>``,
``address:<IP address>`` (connections and the connection rate only: a client's
address says nothing about what it publishes once in), or a default for every
user (``user:*``), client id (``client:*``) or address (``address:*``), which
each identity gets a budget of its own from (a default is not shared).

Kept with the users and permissions (``gateway.access.store``: door state, so
they replicate and reach every gateway like the ACL); applied by
``gateway.access.traffic``. Values only; no I/O.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, fields
from typing import Any

from core_broker.errors import InvalidArgumentError

from .model import validate_name

__all__ = ["ADDRESS_FIGURES", "FIGURES", "KINDS", "Limits", "parse_subject"]

#: The kinds of subject a limit is set for.
KINDS = ("user", "client", "address")
#: Each figure, with what the admin API and the CLI call it.
FIGURES = ("connections", "connections_per_s", "publish_msgs_per_s", "publish_bytes_per_s", "subscriptions")
#: The figures an address limit may have (what is known of a client before it logs in).
ADDRESS_FIGURES = ("connections", "connections_per_s")

_MAX_CLIENT_ID = 256


def parse_subject(kind: str, name: str) -> tuple[str, str]:
    """(kind, name) of a limit's subject, checked: ``user`` and a user name or ``*``; ``client`` and a client id;
    ``address`` and an IP address (in its normal form)."""
    if kind not in KINDS:
        raise InvalidArgumentError(f"a limit is set for a user, a client or an address, not {kind!r}")
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"a {kind} limit needs a name ('*': every {kind})")
    if name == "*":
        return kind, name
    if kind == "user":
        validate_name("user", name)
    elif kind == "address":
        try:
            return kind, str(ipaddress.ip_address(name))
        except ValueError:
            raise InvalidArgumentError(f"an address limit needs an IP address, not {name!r}") from None
    elif len(name) > _MAX_CLIENT_ID or any(ord(c) < 32 for c in name):
        raise InvalidArgumentError(f"a client id is 1 to {_MAX_CLIENT_ID} printable characters")
    return kind, name


@dataclass(frozen=True)
class Limits:
    """What one identity may use; ``None``: no limit on that figure."""

    connections: int | None = None  # open connections at once (per gateway process)
    connections_per_s: float | None = None  # new connections per second (token bucket, per gateway process)
    publish_msgs_per_s: float | None = None  # messages published per second (token bucket)
    publish_bytes_per_s: float | None = None  # message body bytes published per second
    subscriptions: int | None = None  # subscriptions (MQTT) / consumers (AMQP) on one connection

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0 or v > 1e15:
                raise InvalidArgumentError(f"{f.name} must be a number >= 0 (or null for no limit), got {v!r}")
            if f.name in ("connections", "subscriptions") and v != int(v):
                raise InvalidArgumentError(f"{f.name} must be a whole number, got {v!r}")

    @property
    def empty(self) -> bool:
        return all(getattr(self, f) is None for f in FIGURES)

    @property
    def rated(self) -> bool:
        """Has a publish rate."""
        return self.publish_msgs_per_s is not None or self.publish_bytes_per_s is not None

    def check_kind(self, kind: str) -> None:
        """InvalidArgumentError when a figure does not apply to that kind of subject (an address's)."""
        if kind == "address":
            extra = [f for f in FIGURES if f not in ADDRESS_FIGURES and getattr(self, f) is not None]
            if extra:
                raise InvalidArgumentError(f"an address limit has only {' and '.join(ADDRESS_FIGURES)}, not {extra[0]}")

    def merged(self, other: Limits) -> Limits:
        """``other``'s figures where it has them, this one's elsewhere (a change of some figures)."""
        return Limits(**{f: getattr(other, f) if getattr(other, f) is not None else getattr(self, f)
                         for f in FIGURES})

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in FIGURES if getattr(self, f) is not None}

    @classmethod
    def from_dict(cls, d: Any) -> Limits:
        if not isinstance(d, dict):
            raise InvalidArgumentError("limits are a JSON object")
        unknown = set(d) - set(FIGURES) - {"kind", "name"}
        if unknown:
            raise InvalidArgumentError(f"unknown limit {sorted(unknown)[0]!r}: one of {', '.join(FIGURES)}")
        values: dict[str, Any] = {}
        for f in FIGURES:
            v = d.get(f)
            if v is not None:
                if f in ("connections", "subscriptions") and isinstance(v, float) and v == int(v):
                    v = int(v)
            values[f] = v
        return cls(**values)

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Limits:
        return cls.from_dict(json.loads(raw))
