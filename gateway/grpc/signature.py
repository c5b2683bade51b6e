"""Verifying the RocketMQ 5 client's ``MQv2-HMAC-SHA1`` authorization header.

Every v2 client call carries metadata ``x-mq-date-time`` and
``authorization: MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time,
Signature=<hex hmac-sha1(secret, date-time)>``. The scheme is tiny and has no
library on PyPI, hence these few lines. The date-time is the client's *local*
time with a literal ``Z`` (see the contract notes), so it is signed but not
checked for skew. With no credentials configured every caller is accepted
(clients still send an HMAC made with empty keys then).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Callable, Iterator, Mapping

from gateway.auth import UnauthorizedError

ALGORITHM = "MQv2-HMAC-SHA1"


def parse_authorization(header: str) -> dict[str, str]:
    """``{"Credential": ak, "SignedHeaders": ..., "Signature": hex}`` from the header value."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme != ALGORITHM:
        raise UnauthorizedError(f"authorization scheme must be {ALGORITHM}")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        k, sep, v = part.strip().partition("=")
        if sep:
            fields[k.strip()] = v.strip()
    return fields


def sign(secret: str, date_time: str) -> str:
    return hmac.new(secret.encode(), date_time.encode(), hashlib.sha1).hexdigest()


class KeyRing(Mapping[str, str]):
    """The secrets the door accepts: ``grpc_credentials`` from the config, then the identity store's
    access keys (``store(ak) -> (user, secret) | None``; ``active()``: does the store have users).

    Empty (so signatures are not checked) only when neither has any."""

    def __init__(self, configured: Mapping[str, str], store: Callable[[str], tuple[str, str] | None] | None = None,
                 active: Callable[[], bool] | None = None) -> None:
        self.configured = dict(configured)
        self.store = store
        self.active = active

    def __getitem__(self, ak: str) -> str:
        v = self.configured.get(ak)
        if v is not None:
            return v
        found = self.store(ak) if self.store is not None else None
        if found is None:
            raise KeyError(ak)
        return found[1]

    def __len__(self) -> int:
        return len(self.configured) + (1 if self.active is not None and self.active() else 0)

    def __iter__(self) -> Iterator[str]:
        return iter(self.configured)

    def principal(self, ak: str) -> str:
        """Who an access key stands for: the store's user owning it, else the configured key itself."""
        if ak in self.configured or self.store is None:
            return ak
        found: Any = self.store(ak)
        return found[0] if found is not None else ak


def verify(metadata: Mapping[str, str], credentials: Mapping[str, str]) -> str | None:
    """Check a call's signature; returns the access key (the principal), or None when auth is off.

    Raises :class:`gateway.auth.UnauthorizedError` for a missing or malformed header,
    an unknown access key or a signature that the key's secret does not produce.
    """
    if not credentials:
        return None
    header = metadata.get("authorization")
    if not header:
        raise UnauthorizedError("missing authorization header")
    fields = parse_authorization(header)
    ak = fields.get("Credential", "")
    signature = fields.get("Signature", "")
    secret = credentials.get(ak)
    if not ak or secret is None:
        raise UnauthorizedError(f"unknown access key {ak!r}")
    date_time = metadata.get("x-mq-date-time", "")
    if not date_time or not hmac.compare_digest(sign(secret, date_time), signature.lower()):
        raise UnauthorizedError("signature does not match")
    return ak
