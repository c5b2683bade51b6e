"""Password hashes: unimq's own (scrypt) and the ones brought in from Mosquitto and RabbitMQ.

A stored hash is a ``$``-prefixed string naming its scheme, so one user store
holds hashes of several origins and each stays verifiable:

- ``$scrypt$n=<N>,r=<r>,p=<p>$<salt>$<hash>`` (base64): what unimq writes. scrypt
  is memory-hard and in the standard library (``hashlib.scrypt``, OpenSSL's);
  salt (16 random bytes) and parameters are stored beside the hash, so raising
  the cost later keeps old hashes verifiable.
- ``$7$<iterations>$<salt>$<hash>``: Mosquitto 2's PBKDF2-HMAC-SHA512 (``mosquitto_passwd``).
- ``$6$<salt>$<hash>``: Mosquitto 1.x's SHA-512 of password + salt.
- ``$rabbit-sha256$<base64>`` / ``$rabbit-sha512$<base64>``: RabbitMQ definitions'
  ``password_hash`` (``rabbit_password_hashing_sha256`` / ``_sha512``): base64 of a
  4-byte salt followed by SHA-256/512(salt + password).

Comparisons are constant-time (``hmac.compare_digest``); a malformed entry never
matches. A password holding a NUL never matches and cannot be set: HMAC (inside
PBKDF2 and scrypt) pads its key with zero bytes, so ``pw`` and ``pw\x00`` would
be the same key (found by the login fuzz test). Nothing here logs. Why by hand: each scheme is a split and one or two
hashlib calls; passlib (the library that would read them all) is unmaintained.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

__all__ = [
    "SCRYPT_N", "hash_password", "is_hash", "mosquitto_entry_ok", "needs_rehash", "rabbit_hash", "verify_password",
]

#: scrypt cost (2**14, r 8, p 1: about 16 MiB and tens of milliseconds per check, OWASP's floor).
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1
_MAXMEM = 64 * 1024 * 1024
_SCHEMES = ("$scrypt$", "$7$", "$6$", "$rabbit-sha256$", "$rabbit-sha512$")


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _unb64(s: str) -> bytes:
    return base64.b64decode(s, validate=True)


def hash_password(password: str | bytes, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """A new ``$scrypt$`` entry for ``password`` with a fresh random salt (ValueError for a NUL in it)."""
    pw = password.encode("utf-8") if isinstance(password, str) else password
    if b"\x00" in pw:
        raise ValueError("a password may not contain NUL characters")
    salt = os.urandom(16)
    digest = hashlib.scrypt(pw, salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=32)
    return f"$scrypt$n={n},r={r},p={p}${_b64(salt)}${_b64(digest)}"


def rabbit_hash(password: str | bytes, salt: bytes | None = None, algorithm: str = "sha256") -> str:
    """RabbitMQ's ``password_hash`` for ``password`` (what a definitions export holds), base64."""
    pw = password.encode("utf-8") if isinstance(password, str) else password
    salt = os.urandom(4) if salt is None else salt
    return _b64(salt + hashlib.new(algorithm, salt + pw).digest())


def is_hash(entry: str) -> bool:
    """Is ``entry`` a hash in one of the known schemes (checked for form, not verified)?"""
    try:
        return _parse(entry) is not None
    except (ValueError, binascii.Error):
        return False


def mosquitto_entry_ok(entry: str) -> bool:
    """Is ``entry`` a hash ``mosquitto_passwd`` writes ($7$ or $6$)?"""
    return entry.startswith(("$7$", "$6$")) and is_hash(entry)


def needs_rehash(entry: str) -> bool:
    """Should a successful login re-hash the password (an imported or weaker scheme)?"""
    return not entry.startswith(f"$scrypt$n={SCRYPT_N},r={SCRYPT_R},p={SCRYPT_P}$")


def _parse(entry: str) -> tuple[str, tuple[int, ...], bytes, bytes]:
    """(scheme, parameters, salt, digest); raises ValueError (or binascii.Error) when malformed."""
    if not entry.startswith(_SCHEMES):
        raise ValueError("unknown scheme")
    parts = entry.split("$")
    scheme = parts[1]
    if scheme == "scrypt" and len(parts) == 5:
        params = dict(kv.split("=", 1) for kv in parts[2].split(","))
        n, r, p = int(params["n"]), int(params["r"]), int(params["p"])
        if n < 2 or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 16 or 128 * r * n > _MAXMEM:
            raise ValueError("scrypt parameters out of range")
        return scheme, (n, r, p), _unb64(parts[3]), _unb64(parts[4])
    if scheme == "7" and len(parts) == 5:
        iterations = int(parts[2])
        if not 1 <= iterations <= 10_000_000:
            raise ValueError("iterations out of range")
        return scheme, (iterations,), _unb64(parts[3]), _unb64(parts[4])
    if scheme == "6" and len(parts) == 4:
        return scheme, (), _unb64(parts[2]), _unb64(parts[3])
    if scheme in ("rabbit-sha256", "rabbit-sha512") and len(parts) == 3:
        raw = _unb64(parts[2])
        size = 32 if scheme == "rabbit-sha256" else 64
        if len(raw) != 4 + size:
            raise ValueError("RabbitMQ hash of the wrong length")
        return scheme, (), raw[:4], raw[4:]
    raise ValueError("malformed hash")


def verify_password(entry: str, password: str | bytes) -> bool:
    """Does ``password`` match the stored ``entry``? Constant-time; False for a malformed entry."""
    pw = password.encode("utf-8") if isinstance(password, str) else password
    if b"\x00" in pw:  # HMAC pads keys with zeros: "pw" and "pw\0" are one PBKDF2/scrypt key
        return False
    try:
        scheme, params, salt, digest = _parse(entry)
    except (ValueError, KeyError, binascii.Error):
        return False
    if scheme == "scrypt":
        n, r, p = params
        got = hashlib.scrypt(pw, salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=len(digest))
    elif scheme == "7":
        got = hashlib.pbkdf2_hmac("sha512", pw, salt, params[0], dklen=len(digest))
    elif scheme == "6":
        got = hashlib.sha512(pw + salt).digest()
    else:
        got = hashlib.new(scheme[len("rabbit-"):], salt + pw).digest()
    return hmac.compare_digest(got, digest)
