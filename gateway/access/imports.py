"""Importing users and permissions from Mosquitto's files and RabbitMQ's definitions export (no I/O).

- A Mosquitto password file (``user:$7$...`` / ``user:$6$...`` lines, as
  ``mosquitto_passwd`` writes them): users keep their hashes, still verifiable.
- A Mosquitto ACL file: ``topic read|write|readwrite`` lines become ``topic``
  permissions (read: subscribe, write: publish) of their user, or of
  ``anonymous`` before the first ``user`` line. What the store cannot express is
  skipped and reported: ``deny`` lines (the store has grants only) and
  ``pattern`` lines (``%c``/``%u`` are per connection; keep the file as
  ``mqtt_acl_file`` for those).
- RabbitMQ definitions JSON (``rabbitmqctl export_definitions``): ``users`` with
  their ``password_hash`` (``rabbit_password_hashing_sha256``/``_sha512``; MD5
  hashes of RabbitMQ < 3.6 are refused), the ``administrator`` tag as a
  superuser, and ``permissions`` as vhost permissions with the same
  configure/write/read regular expressions.

Each importer returns users and permissions to store (:class:`Imported`); the
admin API writes them (``IdentityStore``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core_broker.errors import InvalidArgumentError

from ..topic_acl import READ, WRITE, AclFileError, parse_acl
from .model import ANONYMOUS, Permission, validate_name
from .passwords import mosquitto_entry_ok

__all__ = ["Imported", "mosquitto", "parse_mosquitto_passwords", "rabbitmq_definitions"]

_RABBIT_SCHEMES = {
    "rabbit_password_hashing_sha256": "$rabbit-sha256$",
    "rabbit_password_hashing_sha512": "$rabbit-sha512$",
}


@dataclass
class Imported:
    users: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)  # name -> (hash, roles)
    permissions: list[Permission] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # what could not be carried over, said for a user


def parse_mosquitto_passwords(text: str, source: str = "password file") -> dict[str, str]:
    """user -> hash of a Mosquitto password file; ValueError naming the line of a bad one."""
    users: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, entry = line.partition(":")
        if not sep or not user:
            raise ValueError(f"{source}, line {n}: expected user:hash")
        if not mosquitto_entry_ok(entry):
            raise ValueError(
                f"{source}, line {n}: the hash of {user!r} is not one mosquitto_passwd writes "
                "($7$ PBKDF2-SHA512 or $6$ SHA-512)"
            )
        users[user] = entry
    return users


def mosquitto(password_file: str = "", acl_file: str = "") -> Imported:
    """Users of a password file and topic permissions of an ACL file (either may be empty)."""
    out = Imported()
    try:
        for name, h in parse_mosquitto_passwords(password_file).items():
            out.users[validate_name("user", name)] = (h, ())
        rules = parse_acl(acl_file) if acl_file else None
    except (ValueError, AclFileError) as e:
        raise InvalidArgumentError(str(e)) from None
    if rules is None:
        return out
    for subject, lines in [(ANONYMOUS, rules.anonymous), *rules.users.items()]:
        acts: dict[str, set[str]] = {}
        for access, topic in lines:
            if not access:
                out.skipped.append(f"deny rule for {subject} on {topic!r} (the store grants only)")
                continue
            a = acts.setdefault(topic, set())
            if access & READ:
                a.add("subscribe")
            if access & WRITE:
                a.add("publish")
        for topic, a in acts.items():
            out.permissions.append(Permission(validate_name("user", subject), "topic", topic, frozenset(a)))
    for _, topic in rules.patterns:
        out.skipped.append(f"pattern rule {topic!r} (per-connection %c/%u: keep it in mqtt_acl_file)")
    return out


def rabbitmq_definitions(defs: Any) -> Imported:
    """Users and vhost permissions of a RabbitMQ definitions export (its parsed JSON)."""
    if not isinstance(defs, dict):
        raise InvalidArgumentError("RabbitMQ definitions are a JSON object")
    out = Imported()
    for u in defs.get("users") or ():
        if not isinstance(u, dict) or not isinstance(u.get("name"), str):
            raise InvalidArgumentError("a RabbitMQ user needs a name")
        name = validate_name("user", u["name"])
        algorithm = u.get("hashing_algorithm", "rabbit_password_hashing_sha256")
        raw = u.get("password_hash") or ""
        if raw and algorithm not in _RABBIT_SCHEMES:
            out.skipped.append(f"user {name}: hashing algorithm {algorithm} is not supported (reset the password)")
            continue
        h = _RABBIT_SCHEMES[algorithm] + raw if raw else ""
        tags = u.get("tags") or []
        if isinstance(tags, str):
            tags = [t for t in tags.split(",") if t]
        out.users[name] = (h, ())
        if "administrator" in tags:
            out.permissions.append(Permission(name, "admin", "*", frozenset({"admin"})))
    for p in defs.get("permissions") or ():
        if not isinstance(p, dict):
            raise InvalidArgumentError("a RabbitMQ permission is an object")
        out.permissions.append(Permission(
            validate_name("user", str(p.get("user", ""))), "vhost", str(p.get("vhost", "/")) or "/",
            configure=str(p.get("configure", "")), write=str(p.get("write", "")), read=str(p.get("read", "")),
        ))
    if defs.get("topic_permissions"):
        out.skipped.append("topic_permissions (RabbitMQ's topic authorisation): grant topic permissions instead")
    return out
