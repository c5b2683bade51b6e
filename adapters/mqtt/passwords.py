"""Mosquitto password files, so a fleet moved from Mosquitto keeps its credentials.

A line is ``user:hash`` as ``mosquitto_passwd`` writes it:

- ``$7$<iterations>$<salt>$<hash>``: PBKDF2-HMAC-SHA512 (Mosquitto 2's default),
  salt and hash base64;
- ``$6$<salt>$<hash>``: SHA-512 of password + salt (Mosquitto 1.6 and earlier).

Why by hand: the format is two hashlib calls and a split; no maintained Python
library reads it. The hashes are checked by the identity store's module
(``gateway.access.passwords``), which also imports these files. Comparisons are constant-time (``hmac.compare_digest``). The
file is read when the door starts (Mosquitto re-reads it on SIGHUP; here a
restart picks up changes). A line in neither form is refused at start with its
line number, so a typo cannot silently lock a user out or let one in.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from core_broker.errors import ConfigurationError
from gateway.access.imports import parse_mosquitto_passwords
from gateway.access.passwords import mosquitto_entry_ok, verify_password

__all__ = ["PasswordFileError", "Credentials", "load_password_file", "verify"]


class PasswordFileError(ConfigurationError):
    """The password file cannot be used (missing, or a line in no known form)."""


def load_password_file(path: str | Path) -> dict[str, str]:
    """user -> hash entry, every entry checked for form."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as e:
        raise PasswordFileError(f"mqtt_password_file: cannot read {path}: {e.strerror}") from None
    try:
        return parse_mosquitto_passwords(text, f"mqtt_password_file {path}")
    except ValueError as e:
        raise PasswordFileError(f"{e}; plain-text passwords go in [mqtt_users]") from None


def verify(entry: str, password: bytes) -> bool:
    """Does ``password`` match the stored ``entry``? (the identity store's check, gateway.access.passwords)"""
    return mosquitto_entry_ok(entry) and verify_password(entry, password)


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
