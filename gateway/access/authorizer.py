"""The processor's authorizer over the identity store: one decision for every door, audited and counted.

Installed with ``processor.set_authorizer`` by the process (merged and gateway
roles). Each question (``gateway.auth``: identity in the context, an action, a
resource, a name) is answered from the store's cached rules:

- a context marked ``trusted`` (a door's own work) is let through;
- with no users in the store, every client is served when the doors listen on
  loopback only, or with ``allow_anonymous``; otherwise only clients from a
  loopback address (start-up refuses a non-loopback listener without users or
  ``allow_anonymous``, see ``unimq.security``; this covers the last user deleted
  at run time);
- with users, a client without credentials is refused (UNAUTHORIZED) unless
  ``allow_anonymous`` lets it in with the permissions of ``anonymous``; a known
  identity gets what its permissions grant (``gateway.access.permissions``),
  else FORBIDDEN.

Every refusal is logged on ``unimq.audit`` (who, from where, what; at most
:data:`AUDIT_PER_S` lines a second, the rest counted in the next line) and
counted in the processor's metrics as ``auth_denied{protocol}``. Decisions are
cached per question until the rules change.
"""

from __future__ import annotations

import ipaddress
import logging
import time

from ..auth import AMQP_SEP, Action, Resource, UnauthorizedError, forbidden
from ..context import RequestContext
from ..metrics import Metrics
from .store import IdentityStore

__all__ = ["StoreAuthorizer", "host_is_loopback", "is_loopback_address"]

audit = logging.getLogger("unimq.audit")

AUDIT_PER_S = 20
_DECISIONS_MAX = 100_000

#: gateway.auth resources -> (the permission resource they are matched against, as MQTT names)
_KIND = {
    Resource.TOPIC: ("topic", False),
    Resource.MQTT_TOPIC: ("topic", True),
    Resource.GROUP: ("group", False),
    Resource.DOOR_STATE: ("admin", False),
    Resource.CLUSTER: ("admin", False),
}

#: AMQP questions -> RabbitMQ's permission kinds
_VHOST_RIGHT = {Action.CREATE: "configure", Action.DELETE: "configure", Action.PUBLISH: "write",
                Action.SUBSCRIBE: "read"}


def host_is_loopback(host: str) -> bool:
    """Is a listening host a loopback address (127.0.0.0/8, ::1, localhost)?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_address(address: str) -> bool:
    """Is a peer ``host:port`` (``[v6]:port``, ``v6:port``, or a bare host) on loopback?"""
    host = address.rpartition(":")[0].strip("[]")
    for candidate in (host, address.strip("[]")):
        if candidate.startswith("::ffff:") and "." in candidate:
            candidate = candidate[len("::ffff:"):]
        try:
            return ipaddress.ip_address(candidate).is_loopback
        except ValueError:
            continue
    return address == "localhost" or address.startswith("localhost:")


class StoreAuthorizer:
    """An :class:`~gateway.auth.Authorizer` answering from an :class:`IdentityStore`."""

    def __init__(self, store: IdentityStore, metrics: Metrics, *, allow_anonymous: bool = False,
                 loopback_only: bool = True) -> None:
        self.store = store
        self.metrics = metrics
        self.allow_anonymous = allow_anonymous
        # every door listens on loopback only: with no users, every client is a local one
        self.loopback_only = loopback_only
        self._decisions: dict[tuple[str | None, Action, Resource, str], bool] = {}
        self._rules = store.rules
        self._second = 0
        self._logged = 0
        self._suppressed = 0

    def check(self, ctx: RequestContext, action: Action, resource: Resource, name: str) -> None:
        if ctx.trusted:
            return
        store = self.store
        if not store.snapshot.users:
            if self.allow_anonymous or self.loopback_only or is_loopback_address(ctx.remote_address):
                return
            self._deny(ctx, action, resource, name, "no users configured: anonymous clients are served on loopback only")
        principal = ctx.principal
        if principal is None and not self.allow_anonymous:
            self._deny(ctx, action, resource, name, "authentication required")
        rules = store.rules
        if rules is not self._rules:
            self._decisions.clear()
            self._rules = rules
        key = (principal, action, resource, name)
        ok = self._decisions.get(key)
        if ok is None:
            if resource is Resource.AMQP:
                vhost, _, what = name.partition(AMQP_SEP)
                ok = rules.vhost_allows(principal, vhost, _VHOST_RIGHT.get(action, "configure"), what)
            else:
                kind, mqtt = _KIND.get(resource, ("admin", False))
                ok = rules.allows(principal, action.value, kind, name, mqtt=mqtt)
            if len(self._decisions) >= _DECISIONS_MAX:
                self._decisions.clear()
            self._decisions[key] = ok
        if not ok:
            self._deny(ctx, action, resource, name, None)

    def _deny(self, ctx: RequestContext, action: Action, resource: Resource, name: str, unauthenticated: str | None) -> None:
        self.metrics.inc("auth_denied", ctx.protocol)
        now = int(time.monotonic())
        if now != self._second:
            self._second, self._logged = now, 0
        if self._logged < AUDIT_PER_S:
            self._logged += 1
            more = f" ({self._suppressed} more denials not logged)" if self._suppressed else ""
            self._suppressed = 0
            audit.warning("denied: user=%s protocol=%s client=%s from=%s action=%s resource=%s name=%r%s%s",
                          ctx.principal if ctx.principal is not None else "-", ctx.protocol, ctx.client_id or "-",
                          ctx.remote_address or "-", action.value, resource.value, name,
                          f" reason={unauthenticated!r}" if unauthenticated else "", more)
        else:
            self._suppressed += 1
        if unauthenticated is not None:
            raise UnauthorizedError(unauthenticated, action=action.value, resource=resource.value, name=name)
        raise forbidden(ctx, action, resource, name)
