"""The identity model: users, API keys, roles and permissions, as values that serialise to JSON.

A :class:`User` has a password hash (``gateway.access.passwords``; never the
password), roles, and API keys (each kept as a SHA-256 of its secret: the secret
is 32 random bytes, so a fast hash is enough, unlike a password). A
:class:`Permission` is (subject, resource, pattern, actions): the subject is a
user name or ``role:<name>`` (``anonymous`` for clients without credentials,
when ``allow_anonymous`` lets them in); resources and the pattern syntax of each
are in ``gateway.access.permissions``. An AMQP vhost permission carries
RabbitMQ's three regular expressions (configure, write, read) instead of actions.

Values only: where they are kept (the brokers' door state) is
``gateway.access.store``; no I/O here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from core_broker.errors import InvalidArgumentError

__all__ = [
    "ACTIONS", "ANONYMOUS", "KEY_PREFIX", "RESOURCES", "AccessKey", "ApiKey", "Permission", "Snapshot", "User",
    "new_access_key", "new_api_key", "parse_actions", "split_api_key", "validate_name",
]

#: What a permission may grant (``consume`` is a synonym of ``subscribe``, ``all`` every one).
ACTIONS = ("publish", "subscribe", "create", "delete", "admin")
#: What a permission is about.
RESOURCES = ("topic", "group", "vhost", "admin")
#: The subject whose permissions clients without credentials get (with ``allow_anonymous``).
ANONYMOUS = "anonymous"
#: API keys look like ``umk_<id>_<secret>``: the id finds the key, the secret proves it.
KEY_PREFIX = "umk_"

_NAME = re.compile(r"[A-Za-z0-9_.@+=,-][A-Za-z0-9_.@+=,:-]{0,127}")


def validate_name(kind: str, name: str) -> str:
    """A user or role name: 1-128 letters, digits and ``_.@+=,-:`` (not starting with ``:``)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.startswith("role:"):
        raise InvalidArgumentError(
            f"invalid {kind} name {name!r}: 1 to 128 letters, digits or _.@+=,-: characters, not 'role:...'"
        )
    return name


def parse_actions(actions: Any) -> frozenset[str]:
    """A set of actions from a list or a comma-separated string; ``consume`` = subscribe, ``all`` = every one."""
    items = actions.split(",") if isinstance(actions, str) else list(actions or ())
    out: set[str] = set()
    for a in items:
        a = str(a).strip().lower()
        if a == "consume":
            a = "subscribe"
        if a == "all":
            out.update(ACTIONS)
        elif a in ACTIONS:
            out.add(a)
        elif a:
            raise InvalidArgumentError(f"unknown action {a!r}: one of {', '.join(ACTIONS)}, consume or all")
    if not out:
        raise InvalidArgumentError("a permission needs at least one action")
    return frozenset(out)


@dataclass(frozen=True)
class ApiKey:
    """An API key of a user: its id (public) and SHA-256 of its secret."""

    key_id: str
    secret_sha256: str
    created_ms: int = 0

    def matches(self, secret: str) -> bool:
        got = hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()
        return hmac.compare_digest(got, self.secret_sha256)


def new_api_key(created_ms: int = 0) -> tuple[str, ApiKey]:
    """(the key to hand to the user once, what is stored of it)."""
    key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    token = f"{KEY_PREFIX}{key_id}_{secret}"
    return token, ApiKey(key_id, hashlib.sha256(secret.encode()).hexdigest(), created_ms)


def split_api_key(token: str) -> tuple[str, str] | None:
    """(key id, secret) of a token in the API key form, else None."""
    if not token.startswith(KEY_PREFIX):
        return None
    key_id, sep, secret = token[len(KEY_PREFIX):].partition("_")
    if not sep or len(key_id) != 16 or not secret:
        return None
    return key_id, secret


@dataclass(frozen=True)
class AccessKey:
    """A RocketMQ access key pair (the gRPC door's ``MQv2-HMAC-SHA1`` signature).

    The secret is kept as it is: an HMAC can only be checked by whoever holds its
    key (RocketMQ's own ACL file keeps it so too). It is a random credential made
    here, never a password a person chose; protect the data directory accordingly.
    """

    access_key: str
    secret_key: str
    created_ms: int = 0


def new_access_key(created_ms: int = 0) -> AccessKey:
    return AccessKey("AK" + secrets.token_hex(10).upper(), secrets.token_urlsafe(30), created_ms)


@dataclass(frozen=True)
class User:
    name: str
    password_hash: str = ""  # empty: no password login (API keys only)
    roles: tuple[str, ...] = ()
    api_keys: tuple[ApiKey, ...] = ()
    created_ms: int = 0
    access_keys: tuple[AccessKey, ...] = ()

    def to_json(self) -> bytes:
        return json.dumps({
            "name": self.name, "password_hash": self.password_hash, "roles": list(self.roles),
            "api_keys": [[k.key_id, k.secret_sha256, k.created_ms] for k in self.api_keys],
            "access_keys": [[k.access_key, k.secret_key, k.created_ms] for k in self.access_keys],
            "created_ms": self.created_ms,
        }, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> User:
        d = json.loads(raw)
        return cls(d["name"], d.get("password_hash", ""), tuple(d.get("roles", ())),
                   tuple(ApiKey(*k) for k in d.get("api_keys", ())), d.get("created_ms", 0),
                   tuple(AccessKey(*k) for k in d.get("access_keys", ())))

    def public(self) -> dict[str, Any]:
        """What the admin API shows of a user (never a hash or a secret)."""
        return {"name": self.name, "roles": list(self.roles), "has_password": bool(self.password_hash),
                "api_keys": [k.key_id for k in self.api_keys],
                "access_keys": [k.access_key for k in self.access_keys], "created_ms": self.created_ms}


@dataclass(frozen=True)
class Permission:
    """``subject`` may do ``actions`` on ``resource`` names matching ``pattern``.

    For ``resource == "vhost"`` the pattern is the vhost name and ``configure``,
    ``write``, ``read`` are RabbitMQ's regular expressions (``actions`` unused).
    """

    subject: str
    resource: str
    pattern: str
    actions: frozenset[str] = frozenset()
    configure: str = ""
    write: str = ""
    read: str = ""

    def __post_init__(self) -> None:
        if self.resource not in RESOURCES:
            raise InvalidArgumentError(f"unknown resource {self.resource!r}: one of {', '.join(RESOURCES)}")
        subject = self.subject[len("role:"):] if self.subject.startswith("role:") else self.subject
        validate_name("role" if subject is not self.subject else "user", subject)
        if not isinstance(self.pattern, str) or not self.pattern or len(self.pattern) > 1024:
            raise InvalidArgumentError("a permission's pattern is 1 to 1024 characters")
        if self.resource == "vhost":
            for what in ("configure", "write", "read"):
                try:
                    re.compile(getattr(self, what))
                except re.error as e:
                    raise InvalidArgumentError(f"vhost permission: bad {what} regular expression: {e}") from None
        elif not self.actions or not self.actions <= set(ACTIONS):
            raise InvalidArgumentError(f"a permission needs actions among {', '.join(ACTIONS)}")

    @property
    def key(self) -> str:
        """The store key: one permission per (subject, resource, pattern)."""
        h = hashlib.sha256(json.dumps([self.subject, self.resource, self.pattern]).encode()).hexdigest()[:32]
        return f"perm:{h}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"subject": self.subject, "resource": self.resource, "pattern": self.pattern}
        if self.resource == "vhost":
            d.update(configure=self.configure, write=self.write, read=self.read)
        else:
            d["actions"] = sorted(self.actions)
        return d

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Permission:
        if not isinstance(d, dict):
            raise InvalidArgumentError("a permission is a JSON object")
        resource = str(d.get("resource", ""))
        if resource == "vhost":
            return cls(str(d.get("subject", "")), resource, str(d.get("pattern", "")),
                       configure=str(d.get("configure", "")), write=str(d.get("write", "")),
                       read=str(d.get("read", "")))
        return cls(str(d.get("subject", "")), resource, str(d.get("pattern", "")), parse_actions(d.get("actions")))

    @classmethod
    def from_json(cls, raw: bytes) -> Permission:
        return cls.from_dict(json.loads(raw))


@dataclass
class Snapshot:
    """Every user and permission at one moment (what the store caches and the authorizer reads)."""

    users: dict[str, User] = field(default_factory=dict)
    permissions: dict[str, Permission] = field(default_factory=dict)  # key -> permission
    # traffic limits: (kind "user"|"client", name or "*") -> gateway.access.limits.Limits
    limits: dict[tuple[str, str], Any] = field(default_factory=dict)
