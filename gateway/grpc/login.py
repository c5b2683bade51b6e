"""Who a gRPC call comes from: a JWT, the RocketMQ access-key signature, or the client certificate.

The official RocketMQ 5 clients sign every call (``signature.py``); this module
puts the door's other logins in front of that check, in the order the HTTP
door uses (explicit credentials win over the connection's certificate):

1. ``authorization: Bearer <JWT>`` metadata (any gRPC client can add it), or the
   RocketMQ client's own header carrying a JWT as its access key
   (``Credential=<JWT>``: the one field of that header that reaches the server; a
   secret key never does, so the token cannot be the secret): a token of a
   configured issuer (``jwt_issuers``, ``gateway.access.tokens``) names the user.
   Its HMAC signature is not checked then: the token's own signature is.
2. Otherwise a signed call's access key (``signature.verify``).
3. A call without a usable signature (no header, or the empty access key the
   official clients sign with when given no credentials), on a TLS connection
   whose client certificate grpcio verified (``tls_verify_client = required``),
   with ``grpc_cert_identity`` on: the certificate's common name is the user
   (as ``gateway.access.certs`` for the other doors).
4. Otherwise ``signature.verify`` decides (UNAUTHORIZED once signatures are
   required, anonymous when they are not).
"""

from __future__ import annotations

from typing import Any, Mapping

from gateway.access.certs import known_identity
from gateway.access.tokens import TokenError, looks_like_jwt
from gateway.auth import UnauthorizedError

from .signature import KeyRing, parse_authorization, verify

__all__ = ["certificate_name", "identify"]


def certificate_name(context: Any) -> str | None:
    """The CN of the client certificate grpcio verified for this call's connection, else None."""
    try:
        auth = context.auth_context() or {}
    except Exception:  # noqa: BLE001 - a context without TLS details
        return None
    names = auth.get("x509_common_name") or ()
    for n in names:
        name = n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n)
        if name:
            return name
    return None


async def _token_user(identities: Any, token: str) -> str:
    try:
        return str(await identities.authenticate_token(token))
    except TokenError as e:
        raise UnauthorizedError(f"invalid bearer token: {e}") from None


async def identify(md: Mapping[str, str], context: Any, credentials: KeyRing, identities: Any,
                   cert_identity: bool) -> str | None:
    """The user (or configured access key) a call comes from; None: anonymous (auth is off);
    UnauthorizedError when its credentials do not verify."""
    header = md.get("authorization", "")
    jwt_on = identities is not None and identities.jwt is not None
    access_key = ""
    if header:
        scheme, _, rest = header.strip().partition(" ")
        if scheme.lower() == "bearer":
            if not jwt_on:
                raise UnauthorizedError("no JWT issuer is configured")
            return await _token_user(identities, rest.strip())
        try:
            access_key = parse_authorization(header).get("Credential", "")
        except UnauthorizedError:
            access_key = ""
        if jwt_on and looks_like_jwt(access_key):
            return await _token_user(identities, access_key)
    if cert_identity and not access_key:
        name = certificate_name(context)
        if name is not None:
            if not known_identity(identities, name):
                raise UnauthorizedError(f"the client certificate's name {name!r} is no user")
            return name
    principal = verify(md, credentials)
    return credentials.principal(principal) if principal is not None else None
