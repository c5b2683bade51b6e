"""Mosquitto password files, so a fleet moved from Mosquitto keeps its credentials.

A line is ``user:hash`` as ``mosquitto_passwd`` writes it:

- ``$7$<iterations>$<salt>$<hash>``: PBKDF2-HMAC-SHA512 (Mosquitto 2's default),
  salt and hash base64;
- ``$6$<salt>$<hash>``: SHA-512 of password + salt (Mosquitto 1.6 and earlier).

Why by hand: the format is two hashlib calls and a split; no maintained Python
library reads it. Comparisons are constant-time (``hmac.compare_digest``). The
file is read when the door starts (Mosquitto re-reads it on SIGHUP; here a
restart picks up changes). A line in neither form is refused at start with its
line number, so a typo cannot silently lock a user out or let one in.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from pathlib import Path

from core_broker.errors import ConfigurationError

__all__ = ["PasswordFileError", "Credentials", "load_password_file", "verify"]


class PasswordFileError(ConfigurationError):
    """The password file cannot be used (missing, or a line in no known form)."""


def _parse(entry: str) -> tuple[str, int, bytes, bytes]:
    """(scheme, iterations, salt, digest) of one hash; raises ValueError when malformed."""
    parts = entry.split("$")
    if len(parts) == 5 and parts[0] == "" and parts[1] == "7":
        iterations = int(parts[2])
        if iterations < 1:
            raise ValueError("iterations must be positive")
        return "7", iterations, base64.b64decode(parts[3], validate=True), base64.b64decode(parts[4], validate=True)
    if len(parts) == 4 and parts[0] == "" and parts[1] == "6":
        return "6", 1, base64.b64decode(parts[2], validate=True), base64.b64decode(parts[3], validate=True)
    raise ValueError("not a $6$ or $7$ hash")


def load_password_file(path: str | Path) -> dict[str, str]:
    """user -> hash entry, every entry checked for form."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as e:
        raise PasswordFileError(f"mqtt_password_file: cannot read {path}: {e.strerror}") from None
    users: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, entry = line.partition(":")
        if not sep or not user:
            raise PasswordFileError(f"mqtt_password_file {path}, line {n}: expected user:hash")
        try:
            _parse(entry)
        except (ValueError, binascii.Error):
            raise PasswordFileError(
                f"mqtt_password_file {path}, line {n}: the hash of {user!r} is not one mosquitto_passwd writes "
                "($7$ PBKDF2-SHA512 or $6$ SHA-512); plain-text passwords go in [mqtt_users]"
            ) from None
        users[user] = entry
    return users


def verify(entry: str, password: bytes) -> bool:
    """Does ``password`` match the stored ``entry``?"""
    try:
        scheme, iterations, salt, digest = _parse(entry)
    except (ValueError, binascii.Error):
        return False
    if scheme == "7":
        got = hashlib.pbkdf2_hmac("sha512", password, salt, iterations, dklen=len(digest))
    else:
        got = hashlib.sha512(password + salt).digest()
    return hmac.compare_digest(got, digest)


class Credentials:
    """Who may connect: plain-text ``users`` and a Mosquitto password file's users."""

    __slots__ = ("plain", "hashed")

    def __init__(self, plain: dict[str, str], password_file: str = "") -> None:
        self.plain = plain
        # read at start: a bad file stops the door there
        self.hashed = load_password_file(password_file) if password_file else {}

    @property
    def configured(self) -> bool:
        return bool(self.plain or self.hashed)

    def check(self, user: str, password: bytes | None) -> bool:
        if password is None:
            return False
        plain = self.plain.get(user)
        if plain is not None:
            return hmac.compare_digest(plain.encode(), password)
        entry = self.hashed.get(user)
        return entry is not None and verify(entry, password)
