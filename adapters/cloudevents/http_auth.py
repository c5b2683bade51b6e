"""The HTTP door's login: ``Authorization: Basic`` (a user's password), ``Bearer`` (an API key), and
on HTTPS with ``http_cert_identity`` the client certificate (``http_certs``).

Why an ASGI middleware: every route (and the plain-Starlette ingest fast path)
needs the caller's identity in its :class:`RequestContext`, and a failed login
must be answered before any route reads a body. It only *authenticates*: a
request without credentials goes on anonymously, one with credentials that do
not verify gets 401 at once; what an identity may do is decided in the
processor's authorizer (``gateway.access``), which the routes' processor
calls ask (403 when refused, 401 for an anonymous caller who must log in).
Once it knows who a connection's first request is, it takes the connection's
slot under the traffic limits (``http_connections``; 429 when refused).

:func:`parse_authorization` is sans-io and strict: RFC 7617 Basic (base64 of
``user:password``, UTF-8) and RFC 6750 Bearer (a token68); anything else is
malformed, never a login. Failed logins are counted (``auth_failed{protocol}``)
and logged without the password.
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from fastapi.responses import JSONResponse

from gateway.access.certs import known_identity
from gateway.access.tokens import TokenError, looks_like_jwt
from gateway.access.traffic import QuotaExceededError
from gateway.context import RequestContext

__all__ = ["AuthMiddleware", "Basic", "Bearer", "MalformedCredentials", "WWW_AUTHENTICATE", "parse_authorization",
           "unauthorized"]

log = logging.getLogger("unimq.audit")

WWW_AUTHENTICATE = 'Basic realm="unimq", charset="UTF-8", Bearer realm="unimq"'
MAX_HEADER = 8192
_TOKEN68 = re.compile(rb"[A-Za-z0-9\-._~+/]+=*")
PRINCIPAL_KEY = "unimq.principal"


class MalformedCredentials(ValueError):
    """An Authorization header in no form the door accepts."""


@dataclass(frozen=True)
class Basic:
    user: str
    password: str = ""

    def __repr__(self) -> str:  # never the password
        return f"Basic(user={self.user!r})"


@dataclass(frozen=True)
class Bearer:
    token: str

    def __repr__(self) -> str:
        return "Bearer(...)"


def parse_authorization(value: bytes) -> Basic | Bearer:
    """The credentials of an ``Authorization`` header value; MalformedCredentials otherwise."""
    if len(value) > MAX_HEADER:
        raise MalformedCredentials("Authorization header too long")
    scheme, sep, rest = value.strip().partition(b" ")
    rest = rest.strip(b" ")
    if not sep or not rest or not _TOKEN68.fullmatch(rest):
        raise MalformedCredentials("expected 'Basic <base64>' or 'Bearer <token>'")
    kind = scheme.lower()
    if kind == b"bearer":
        return Bearer(rest.decode("ascii"))
    if kind != b"basic":
        raise MalformedCredentials("unsupported authorization scheme (Basic or Bearer)")
    try:
        decoded = base64.b64decode(rest, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise MalformedCredentials("Basic credentials are not base64 of UTF-8 user:password") from None
    user, sep, password = decoded.partition(":")
    if not sep or not user or any(ord(c) < 32 or ord(c) == 127 for c in decoded):
        raise MalformedCredentials("Basic credentials must be user:password")
    return Basic(user, password)


def unauthorized(message: str, invalid_token: bool = False) -> JSONResponse:
    """401 in the door's problem JSON; for a bad bearer token RFC 6750's ``error="invalid_token"``."""
    challenge = 'Bearer realm="unimq", error="invalid_token"' if invalid_token else WWW_AUTHENTICATE
    return JSONResponse({"error": "UNAUTHORIZED", "message": message}, status_code=401,
                        headers={"www-authenticate": challenge})


def too_many_connections(e: QuotaExceededError) -> JSONResponse:
    """429 for a connection a connection limit or rate refuses; the connection is closed after it."""
    retry = e.retry_after_s
    return JSONResponse({"error": e.code, "message": str(e), "retry_after_s": retry}, status_code=429,
                        headers={"retry-after": str(max(1, math.ceil(retry))), "connection": "close"})


def principal_of(scope: dict[str, Any]) -> str | None:
    return scope.get(PRINCIPAL_KEY)


class AuthMiddleware:
    """Authenticates ``Authorization`` against the process's identity store (``state.identities``)."""

    def __init__(self, app: Callable[..., Awaitable[None]], state: Any, certs: Any = None, leases: Any = None) -> None:
        self.app = app
        self.state = state
        self.certs = certs  # http_certs.PeerCerts: HTTPS client certificates as identities, or None
        self.leases = leases  # http_connections.PeerLeases: connections under the traffic limits, or None

    async def _admitted(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The request, once its connection holds its slot (taken at the connection's first request)."""
        leases = self.leases
        if leases is not None:
            try:
                leases.admit(self.state.identities.traffic, scope.get("client"), scope.get(PRINCIPAL_KEY))
            except QuotaExceededError as e:
                processor = self.state.processor
                if processor is not None:
                    processor.metrics.inc("quota_exceeded", "http")
                log.warning("refused: protocol=http from=%s: %s", (scope.get("client") or ("-",))[0], e)
                await too_many_connections(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = None
        for k, v in scope["headers"]:
            if k == b"authorization":
                header = v
                break
        if header is None:
            certs = self.certs
            name = certs.name_of(scope.get("client")) if certs is not None else None
            if name is not None:  # no Authorization: the connection's verified client certificate
                if not known_identity(self.state.identities, name):
                    log.warning("login failed: protocol=http certificate=%r: no such user", name)
                    await unauthorized(f"the client certificate's name {name!r} is no user")(scope, receive, send)
                    return
                scope[PRINCIPAL_KEY] = name
            await self._admitted(scope, receive, send)
            return
        identities = self.state.identities
        principal, why, invalid_token = None, "no identity store", False
        client = scope.get("client")
        ip = client[0] if client else ""
        if identities is not None:
            await identities.throttle.wait("http", ip)
            try:
                cred = parse_authorization(header)
            except MalformedCredentials as e:
                why = str(e)
            else:
                if isinstance(cred, Basic):
                    user = await identities.authenticate_password(cred.user, cred.password)
                    why = "bad user name or password"
                    principal = user.name if user is not None else None
                elif identities.jwt is not None and looks_like_jwt(cred.token):
                    try:  # a JWT of a configured issuer (gateway.access.tokens)
                        principal = await identities.authenticate_token(cred.token)
                    except TokenError as e:
                        why, invalid_token = f"invalid bearer token: {e}", True
                else:
                    user = identities.authenticate_key(cred.token)
                    why = "unknown or revoked API key"
                    principal = user.name if user is not None else None
        if principal is None:
            if identities is not None:
                identities.throttle.failed("http", ip)
            peer = f"{client[0]}:{client[1]}" if client else "-"
            processor = self.state.processor
            if processor is not None:
                processor.metrics.inc("auth_failed", "http")
            log.warning("login failed: protocol=http from=%s reason=%r", peer, why)
            await unauthorized(why, invalid_token)(scope, receive, send)
            return
        identities.throttle.succeeded("http", ip)
        scope[PRINCIPAL_KEY] = principal
        await self._admitted(scope, receive, send)


def context_of(scope: dict[str, Any], protocol: str) -> RequestContext:
    """The processor context of a request: who logged in (if anyone), from where."""
    client = scope.get("client")
    return RequestContext(protocol=protocol, remote_address=f"{client[0]}:{client[1]}" if client else "",
                          principal=scope.get(PRINCIPAL_KEY))
