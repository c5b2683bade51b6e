"""JWTs as identities: bearer tokens from configured issuers, verified against their keys (issue 19).

A token is accepted when its signature verifies with a key of a configured
issuer (``jwt_key_files``: PEM public keys or JWKS documents; or the issuer's
OIDC discovery document, ``<iss>/.well-known/openid-configuration``, and the
JWKS its ``jwks_uri`` names, fetched at start and again for an unknown key id,
when ``jwt_oidc_discovery`` is on and the issuer is reachable), its ``iss`` is
one of ``jwt_issuers``, ``exp`` and ``nbf`` hold (with ``jwt_leeway_s``), and
``aud`` names ``jwt_audience`` when one is set. The user is the
``jwt_user_claim`` (``sub``); roles, optionally, the ``jwt_roles_claim`` (a
list or a space-separated string), given on top of the user's own roles in the
store. The issuers are trusted to say who a subject is: a token for ``root``
carries root's permissions.

The cryptography and the claim checks are PyJWT's (a well-kept library; the
``jwt`` extra). Verifying is a public-key operation of tens of microseconds,
done on the event loop; fetching discovery documents and JWKS is network I/O,
done in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core_broker.errors import ConfigurationError

__all__ = ["JwtSettings", "JwtVerifier", "TokenError", "looks_like_jwt"]

log = logging.getLogger("unimq.auth")

_ASYMMETRIC = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
_REFETCH_S = 30.0  # an unknown key id fetches the issuers' keys again at most this often


class TokenError(Exception):
    """A bearer token that is not a valid JWT of a configured issuer (the reason, for the 401)."""


def looks_like_jwt(token: str) -> bool:
    """Three base64url parts (JWS compact form): a token to verify as a JWT, not an API key."""
    return token.count(".") == 2 and not token.startswith("umk_")


@dataclass(frozen=True)
class JwtSettings:
    issuers: tuple[str, ...] = ()
    key_files: tuple[str, ...] = ()
    audience: str = ""
    oidc_discovery: bool = False
    algorithms: tuple[str, ...] = tuple(_ASYMMETRIC)
    user_claim: str = "sub"
    roles_claim: str = ""
    leeway_s: float = 30.0

    @property
    def enabled(self) -> bool:
        return bool(self.issuers)


@dataclass
class _Keys:
    by_kid: dict[str, Any] = field(default_factory=dict)
    anonymous: list[Any] = field(default_factory=list)  # keys without a kid (PEM files, JWKs without one)


def _jwt() -> Any:
    try:
        import jwt
    except ImportError:
        raise ConfigurationError("jwt_issuers is set but PyJWT is not installed: pip install 'unimq[jwt]'") from None
    return jwt


def _add_jwks(keys: _Keys, doc: Any, where: str) -> None:
    jwt = _jwt()
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ConfigurationError(f"{where}: not a JWKS document ({{\"keys\": [...]}})")
    for jwk in doc["keys"]:
        try:
            key = jwt.PyJWK(jwk)
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError) as e:
            log.warning("%s: skipping a key: %s", where, e)
            continue
        if key.key_id:
            keys.by_kid[key.key_id] = key.key
        else:
            keys.anonymous.append(key.key)


def _load_file(keys: _Keys, path: str) -> None:
    p = Path(path).expanduser()
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigurationError(f"jwt_key_files: cannot read {p}: {e}") from None
    if raw.lstrip().startswith(b"{"):
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise ConfigurationError(f"jwt_key_files: {p} is not JSON: {e}") from None
        _add_jwks(keys, doc, str(p))
        return
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        keys.anonymous.append(load_pem_public_key(raw))
    except ValueError:
        try:  # a certificate's public key
            from cryptography import x509

            keys.anonymous.append(x509.load_pem_x509_certificate(raw).public_key())
        except ValueError:
            raise ConfigurationError(f"jwt_key_files: {p} is neither a PEM public key, a certificate nor JWKS") from None


def _fitting(alg: str, keys: list[Any]) -> list[Any]:
    """The keys of the kind ``alg`` signs with (an RSA key never checks an ES256 token, and so on)."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

    kind: tuple[type, ...] = (rsa.RSAPublicKey,) if alg[:2] in ("RS", "PS") else \
        (ec.EllipticCurvePublicKey,) if alg.startswith("ES") else (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)
    return [k for k in keys if isinstance(k, kind)]


def _fetch_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (an https/http URL from the config)
        return json.loads(resp.read(1 << 20))


class JwtVerifier:
    """The configured issuers' keys, and the check of one token."""

    def __init__(self, settings: JwtSettings) -> None:
        self.settings = settings
        self._files = _Keys()
        self._fetched = _Keys()
        self._last_fetch = 0.0
        self._fetching: asyncio.Task[None] | None = None
        jwt = _jwt()
        self._jwt = jwt
        for path in settings.key_files:
            _load_file(self._files, path)

    async def start(self) -> None:
        """Fetch the issuers' keys by OIDC discovery, where asked for (unreachable: logged, retried later)."""
        if self.settings.oidc_discovery:
            await self._refetch()

    def _discover(self) -> _Keys:
        keys = _Keys()
        for iss in self.settings.issuers:
            where = iss.rstrip("/") + "/.well-known/openid-configuration"
            try:
                conf = _fetch_json(where)
                jwks_uri = conf.get("jwks_uri") if isinstance(conf, dict) else None
                if not isinstance(jwks_uri, str):
                    raise ValueError("no jwks_uri")
                _add_jwks(keys, _fetch_json(jwks_uri), jwks_uri)
            except (OSError, ValueError, ConfigurationError) as e:
                log.warning("OIDC discovery of %s failed: %s", iss, e)
        return keys

    async def _refetch(self) -> None:
        self._last_fetch = time.monotonic()
        self._fetched = await asyncio.to_thread(self._discover)

    def _candidates(self, kid: str | None) -> list[Any]:
        if kid is not None:
            for keys in (self._files, self._fetched):
                k = keys.by_kid.get(kid)
                if k is not None:
                    return [k]
        return self._files.anonymous + self._fetched.anonymous + (
            list(self._files.by_kid.values()) + list(self._fetched.by_kid.values()) if kid is None else [])

    async def verify(self, token: str) -> tuple[str, tuple[str, ...]]:
        """(user, roles) of a valid token; TokenError saying why otherwise."""
        jwt = self._jwt
        s = self.settings
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise TokenError(f"malformed token: {e}") from None
        alg = header.get("alg")
        if alg not in s.algorithms:
            raise TokenError(f"algorithm {alg!r} is not accepted")
        kid = header.get("kid") if isinstance(header.get("kid"), str) else None
        candidates = _fitting(alg, self._candidates(kid))
        if not candidates and s.oidc_discovery and time.monotonic() - self._last_fetch > _REFETCH_S:
            await self._refetch()  # a new key of an issuer (rotation)
            candidates = _fitting(alg, self._candidates(kid))
        if not candidates:
            raise TokenError("no key of a configured issuer matches the token")
        options = {"require": ["exp", "iss", s.user_claim] if s.user_claim == "sub" else ["exp", "iss"]}
        last: Exception | None = None
        for key in candidates:
            try:
                claims = jwt.decode(token, key, algorithms=list(s.algorithms), issuer=list(s.issuers),
                                    audience=s.audience or None, leeway=s.leeway_s, options=options)
                break
            except (jwt.InvalidSignatureError, jwt.InvalidKeyError) as e:
                last = e
                continue
            except jwt.PyJWTError as e:  # expired, not yet valid, wrong issuer or audience, ...
                raise TokenError(str(e) or type(e).__name__) from None
            except (ValueError, TypeError) as e:  # bytes no parser expected: a bad token, never a crash
                raise TokenError(f"malformed token: {e}") from None
        else:
            raise TokenError(f"invalid token: {last or 'signature verification failed'}")
        user = claims.get(s.user_claim)
        if not isinstance(user, str) or not user:
            raise TokenError(f"the token has no {s.user_claim!r} claim naming a user")
        roles: tuple[str, ...] = ()
        if s.roles_claim:
            raw = claims.get(s.roles_claim)
            if isinstance(raw, str):
                roles = tuple(r for r in raw.split() if r)
            elif isinstance(raw, list):
                roles = tuple(r for r in raw if isinstance(r, str) and r)
        return user, roles
