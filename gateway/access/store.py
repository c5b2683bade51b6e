"""The identity store: users and permissions kept in the brokers' door state, cached in the gateway.

Why door state: it is what the doors' own durable state (MQTT sessions, AMQP
definitions, push subscriptions) already uses (``MessagingAPI.kv_*``), so users
and permissions live in the broker's journal and snapshot in ``unimq up``, are
written to every broker (last writer wins per entry, read repair) in the
separated shape, and follow a replicated group's master like the rest.

Layout, namespace :data:`NAMESPACE`: ``user:<name>`` (a :class:`User` as JSON),
``perm:<hash of subject, resource, pattern>`` (a :class:`Permission`), and
``rev``: a random token rewritten after every change. Each gateway (and
``unimq up``) polls ``rev`` every ``auth_refresh_s`` (0.5 s) and reloads the
namespace when it changed, so a change made through any gateway reaches the
open connections of every gateway within a second; a change made here is
applied here at once.

Password hashing and checking (scrypt, tens of milliseconds) run in worker
threads, never on the event loop. A password that verified is remembered by an
HMAC of it under a key that lives only in this process (never the password),
so a client sending the same credentials on every request (HTTP Basic) pays
the KDF once, until the user's hash changes. An imported hash (Mosquitto's,
RabbitMQ's: fast hashes) is replaced by scrypt at the user's first successful
login, as Django and RabbitMQ do when their hashing changes.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import secrets
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Iterable

from core_broker.deadline_loop import DeadlineLoop
from core_broker.errors import InvalidArgumentError, UnimqError

from ..context import RequestContext
from .model import AccessKey, ApiKey, Permission, Snapshot, User, new_access_key, new_api_key, split_api_key, validate_name
from .passwords import hash_password, needs_rehash, verify_password
from .permissions import Rules
from .login_throttle import LoginThrottle
from .limits import Limits, parse_subject
from .tokens import JwtVerifier, TokenError, looks_like_jwt
from .traffic import TrafficControl

if TYPE_CHECKING:
    from ..api import MessagingAPI

__all__ = ["IdentityStore", "NAMESPACE", "UserExistsError", "UserNotFoundError"]

log = logging.getLogger("unimq.auth")

NAMESPACE = "unimq.auth"
_CTX = RequestContext(protocol="internal", client_id="identity-store", trusted=True)
_VERIFIED_MAX = 10_000


class UserExistsError(UnimqError):
    code = "USER_EXISTS"


class UserNotFoundError(UnimqError):
    code = "USER_NOT_FOUND"


def _now_ms() -> int:
    return int(time.time() * 1000)


class IdentityStore:
    """Users and permissions: a cached :class:`Snapshot` and :class:`Rules`, written through to door state."""

    def __init__(self, processor: MessagingAPI, refresh_s: float = 0.5) -> None:
        self.processor = processor
        self.refresh_s = refresh_s
        self.snapshot = Snapshot()
        self.token_roles: dict[str, tuple[str, ...]] = {}  # user -> roles its latest JWT carried
        self.rules = Rules(self.snapshot, self.token_roles)
        self.jwt: JwtVerifier | None = None  # bearer JWTs of configured issuers (gateway.access.tokens)
        self._keys: dict[str, tuple[str, ApiKey]] = {}  # key id -> (user, key)
        self._access: dict[str, tuple[str, str]] = {}  # RocketMQ access key -> (user, secret)
        self._rev: bytes | None = None
        self._loop = DeadlineLoop("unimq-identity-refresh", self._poll_once, max_sleep_s=refresh_s,
                                  first_delay_s=refresh_s)
        self._pepper = os.urandom(32)  # this process's key for remembering verified passwords
        self._verified: dict[tuple[str, bytes], str] = {}  # (user, hmac(password)) -> hash it verified against
        self.listeners: list[Callable[[], None]] = []  # called after every reload
        self._rehashing: set[str] = set()
        self.throttle = LoginThrottle()  # every door's failed logins, per address (README "Security")
        self.traffic = TrafficControl()  # every door's limits per user and client id (README "Traffic control")

    # -- lifecycle

    async def start(self) -> None:
        await self.reload()
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def _poll_once(self) -> float:
        """One look at ``rev``; the next one ``refresh_s`` later."""
        try:
            rev = await self.processor.kv_get(_CTX, NAMESPACE, "rev")
            if rev != self._rev:
                await self.reload()
        except (UnimqError, OSError) as e:  # brokers briefly unreachable: keep the cached rules, ask again
            log.debug("identity store refresh failed: %s", e)
        return self.refresh_s

    async def reload(self) -> None:
        """Read every user and permission again (the cache is replaced in one step)."""
        rev = await self.processor.kv_get(_CTX, NAMESPACE, "rev")
        items = await self.processor.kv_items(_CTX, NAMESPACE)
        snap = Snapshot()
        for key, raw in items.items():
            try:
                if key.startswith("user:"):
                    u = User.from_json(raw)
                    snap.users[u.name] = u
                elif key.startswith("perm:"):
                    snap.permissions[key] = Permission.from_json(raw)
                elif key.startswith("limit:"):
                    kind, _, name = key[len("limit:"):].partition(":")
                    snap.limits[parse_subject(kind, name)] = Limits.from_json(raw)
            except (ValueError, KeyError, TypeError, UnimqError) as e:
                log.warning("identity store: ignoring unreadable entry %r: %s", key, e)
        self._install(snap)
        self._rev = rev

    def _install(self, snap: Snapshot) -> None:
        self.snapshot = snap
        self.rules = Rules(snap, self.token_roles)
        self._keys = {k.key_id: (u.name, k) for u in snap.users.values() for k in u.api_keys}
        self._access = {k.access_key: (u.name, k.secret_key) for u in snap.users.values() for k in u.access_keys}
        self.traffic.install(snap.limits)
        for cb in list(self.listeners):
            cb()

    @property
    def has_users(self) -> bool:
        return bool(self.snapshot.users)

    # -- authentication

    async def authenticate_password(self, name: str, password: str | bytes) -> User | None:
        """The user ``name`` if ``password`` is theirs, else None (a worker thread runs the KDF)."""
        user = self.snapshot.users.get(name)
        pw = password.encode("utf-8", "surrogatepass") if isinstance(password, str) else password
        if user is None or not user.password_hash:
            # as slow as a real check, so timing does not tell which user names exist
            await asyncio.to_thread(_verify_dummy, pw)
            return None
        mark = (name, hmac.new(self._pepper, pw, hashlib.sha256).digest())
        if self._verified.get(mark) == user.password_hash:
            return user
        if not await asyncio.to_thread(verify_password, user.password_hash, pw):
            return None
        if len(self._verified) >= _VERIFIED_MAX:
            self._verified.clear()
        self._verified[mark] = user.password_hash
        if needs_rehash(user.password_hash) and name not in self._rehashing:
            # an imported (or older, cheaper) hash: replace it with scrypt now that the password is known
            self._rehashing.add(name)
            t = asyncio.get_running_loop().create_task(self._rehash(user, pw))
            t.add_done_callback(lambda _t: self._rehashing.discard(name))
        return user

    async def _rehash(self, user: User, pw: bytes) -> None:
        try:
            h = await asyncio.to_thread(hash_password, pw)
            current = self.snapshot.users.get(user.name)
            if current is not None and current.password_hash == user.password_hash:  # unchanged meanwhile
                await self._put([(f"user:{user.name}", replace(current, password_hash=h).to_json())])
        except Exception as e:  # the old hash keeps working; try again at the next login
            log.warning("could not upgrade the password hash of %r: %s", user.name, e)

    def authenticate_key(self, token: str) -> User | None:
        """The user an API key belongs to, else None (SHA-256 and a constant-time compare: no thread)."""
        parts = split_api_key(token)
        if parts is None:
            return None
        found = self._keys.get(parts[0])
        if found is None or not found[1].matches(parts[1]):
            return None
        return self.snapshot.users.get(found[0])

    async def authenticate_token(self, token: str) -> str:
        """The user a bearer JWT of a configured issuer names (its roles noted); TokenError otherwise."""
        if self.jwt is None:
            raise TokenError("no JWT issuer is configured")
        user, roles = await self.jwt.verify(token)
        roles = tuple(r for r in roles if _is_name(r))
        if self.token_roles.get(user, ()) != roles:
            if len(self.token_roles) >= _VERIFIED_MAX:
                self.token_roles.clear()
            if roles:
                self.token_roles[user] = roles
            else:
                self.token_roles.pop(user, None)
            self.rules = Rules(self.snapshot, self.token_roles)  # a new object: cached decisions are dropped
        return user

    async def token_names(self, token: str | bytes | None, user: str) -> bool:
        """Is ``token`` (a password) a JWT of a configured issuer whose subject is ``user`` (as EMQX's JWT
        authentication takes one as the MQTT password; the AMQP door's PLAIN likewise)? False for anything
        else, so the password is then checked as a password."""
        if self.jwt is None or not token:
            return False
        try:
            text = token.decode("ascii") if isinstance(token, bytes) else token
            if not looks_like_jwt(text):
                return False
            return await self.authenticate_token(text) == user
        except (TokenError, UnicodeDecodeError) as e:
            log.info("a password that looks like a JWT for %r was refused: %s", user, e)
            return False

    def access_key(self, access_key: str) -> tuple[str, str] | None:
        """(user, secret) of a RocketMQ access key (the gRPC door checks the signature with the secret)."""
        return self._access.get(access_key)

    # -- changes (each written through, then applied here at once)

    async def _put(self, entries: Iterable[tuple[str, bytes | None]]) -> None:
        for key, value in entries:
            await self.processor.kv_put(_CTX, NAMESPACE, key, value)
        await self.processor.kv_put(_CTX, NAMESPACE, "rev", secrets.token_hex(8).encode())
        await self.reload()

    @staticmethod
    async def _hash(password: str) -> str:
        try:
            return await asyncio.to_thread(hash_password, password)
        except ValueError as e:
            raise InvalidArgumentError(str(e)) from None

    def user(self, name: str) -> User:
        u = self.snapshot.users.get(name)
        if u is None:
            raise UserNotFoundError(f"no user {name!r}")
        return u

    async def add_user(self, name: str, password: str | None = None, roles: Iterable[str] = (),
                       *, password_hash: str | None = None, replace: bool = False) -> User:
        """A new user (UserExistsError if there is one, unless ``replace``). ``password_hash``: imported."""
        validate_name("user", name)
        roles = tuple(validate_name("role", r) for r in roles)
        old = self.snapshot.users.get(name)
        if old is not None and not replace:
            raise UserExistsError(f"user {name!r} exists")
        if password_hash is None:
            password_hash = await self._hash(password) if password else ""
        user = User(name, password_hash, roles, old.api_keys if old else (), old.created_ms if old else _now_ms(),
                    old.access_keys if old else ())
        await self._put([(f"user:{name}", user.to_json())])
        return user

    async def set_password(self, name: str, password: str) -> None:
        user = self.user(name)
        if not password:
            raise InvalidArgumentError("the password is empty")
        h = await self._hash(password)
        await self._put([(f"user:{name}", replace(user, password_hash=h).to_json())])

    async def set_roles(self, name: str, roles: Iterable[str]) -> None:
        user = self.user(name)
        roles = tuple(validate_name("role", r) for r in roles)
        await self._put([(f"user:{name}", replace(user, roles=roles).to_json())])

    async def delete_user(self, name: str) -> None:
        """Remove a user, the permissions granted to them by name (as RabbitMQ does) and their limits."""
        self.user(name)
        perms = [k for k, p in self.snapshot.permissions.items() if p.subject == name]
        limits = [(f"limit:user:{name}", None)] if ("user", name) in self.snapshot.limits else []
        await self._put([(f"user:{name}", None)] + [(k, None) for k in perms] + limits)

    async def add_api_key(self, name: str) -> tuple[str, ApiKey]:
        """A new API key for ``name``: (the token, shown once; what is stored)."""
        user = self.user(name)
        token, key = new_api_key(_now_ms())
        await self._put([(f"user:{name}", replace(user, api_keys=user.api_keys + (key,)).to_json())])
        return token, key

    async def add_access_key(self, name: str) -> AccessKey:
        """A new RocketMQ access key pair for ``name`` (the gRPC door's signature)."""
        user = self.user(name)
        key = new_access_key(_now_ms())
        await self._put([(f"user:{name}", replace(user, access_keys=user.access_keys + (key,)).to_json())])
        return key

    async def delete_access_key(self, name: str, access_key: str) -> bool:
        user = self.user(name)
        keys = tuple(k for k in user.access_keys if k.access_key != access_key)
        if len(keys) == len(user.access_keys):
            return False
        await self._put([(f"user:{name}", replace(user, access_keys=keys).to_json())])
        return True

    async def delete_api_key(self, name: str, key_id: str) -> bool:
        user = self.user(name)
        keys = tuple(k for k in user.api_keys if k.key_id != key_id)
        if len(keys) == len(user.api_keys):
            return False
        await self._put([(f"user:{name}", replace(user, api_keys=keys).to_json())])
        return True

    async def grant(self, perm: Permission) -> Permission:
        """Add ``perm``; actions add to those already granted on the same (subject, resource, pattern)."""
        old = self.snapshot.permissions.get(perm.key)
        if old is not None and perm.resource != "vhost":
            perm = Permission(perm.subject, perm.resource, perm.pattern, old.actions | perm.actions)
        await self._put([(perm.key, perm.to_json())])
        return perm

    async def grant_many(self, perms: Iterable[Permission]) -> int:
        entries = [(p.key, p.to_json()) for p in perms]
        await self._put(entries)
        return len(entries)

    async def revoke(self, subject: str, resource: str, pattern: str, actions: frozenset[str] | None = None) -> bool:
        """Take ``actions`` (None: all of them) away; False if nothing was granted there."""
        probe = Permission(subject, resource, pattern, frozenset({"admin"}) if resource != "vhost" else frozenset())
        old = self.snapshot.permissions.get(probe.key)
        if old is None:
            return False
        left = old.actions - actions if actions is not None and resource != "vhost" else frozenset()
        if left:
            await self._put([(old.key, Permission(subject, resource, pattern, left).to_json())])
        else:
            await self._put([(old.key, None)])
        return True


    # -- traffic limits

    async def set_limits(self, kind: str, name: str, limits: Limits, *, merge: bool = True) -> Limits:
        """Set a user's, a client id's or an address's limits (``merge``: only the figures given change)."""
        key = parse_subject(kind, name)
        old = self.snapshot.limits.get(key)
        if merge and old is not None:
            limits = old.merged(limits)
        if limits.empty:
            raise InvalidArgumentError("give at least one limit")
        limits.check_kind(key[0])
        await self._put([(f"limit:{key[0]}:{key[1]}", limits.to_json())])
        return limits

    async def delete_limits(self, kind: str, name: str) -> bool:
        """Remove a user's or a client id's limits; False if there were none."""
        key = parse_subject(kind, name)
        if key not in self.snapshot.limits:
            return False
        await self._put([(f"limit:{key[0]}:{key[1]}", None)])
        return True


def _is_name(role: str) -> bool:
    try:
        validate_name("role", role)
    except InvalidArgumentError:
        return False
    return True


_dummy: list[str] = []


def _verify_dummy(pw: bytes) -> bool:
    """Check ``pw`` against a hash of nothing anyone knows (made on first use, in the worker thread):
    an unknown user name costs what a known one does."""
    if not _dummy:
        _dummy.append(hash_password(secrets.token_hex(16)))
    return verify_password(_dummy[0], pw)
