"""Mosquitto ACL files as an :class:`~gateway.auth.Authorizer`: topic rights written with MQTT filters.

A fleet moved from Mosquitto keeps its topic rights. The format, as Mosquitto
documents it: ``topic [read|write|readwrite|deny] <topic>`` lines (no access
word: readwrite; ``+``/``#`` allowed); the lines before the first ``user
<name>`` line are for anonymous clients, the lines after it for that user name;
``pattern [read|write|readwrite|deny] <topic>`` lines apply to every client,
with ``%c`` replaced by its client id and ``%u`` by its user name. ``#`` starts
a comment line. With a file configured, only what it grants is allowed, and
``deny`` wins over any grant.

As an authorizer it answers the questions about :attr:`Resource.MQTT_TOPIC`
(the identity is the context's ``principal``, the user name, and its
``client_id``): PUBLISH a topic needs a write rule matching it; SUBSCRIBE a
filter needs a read rule covering it entirely (``a/#`` covers ``a/b/+``; ``a/+``
does not cover ``a/#``) and no deny rule covering it -- for a topic name (a
delivery) that is simply a read rule matching it. Every other question is left
to the other authorizers (it allows them). Each identity's rules are worked out
once and cached.

Why by hand: the format is a dozen lines of parsing; no maintained Python
library reads Mosquitto's ACL files.
"""

from __future__ import annotations

from pathlib import Path

from core_broker.errors import ConfigurationError

from .auth import Action, Resource, forbidden
from .context import RequestContext
from .naming import mqtt_filter_matches

__all__ = ["AclFileError", "AclRules", "TopicAclAuthorizer", "load_acl_file", "parse_acl", "filter_covers", "READ", "WRITE"]

READ, WRITE = 1, 2
_ACCESS = {"read": READ, "write": WRITE, "readwrite": READ | WRITE, "deny": 0}


class AclFileError(ConfigurationError):
    """The ACL file cannot be used (missing, or a line in no known form)."""


def filter_covers(rule: str, flt: str) -> bool:
    """Is every topic ``flt`` can match also matched by ``rule`` (both topic filters)?"""
    if rule == flt:
        return True
    if flt[:1] == "$" and rule[:1] in ("+", "#"):
        return False  # a leading wildcard never reaches $-topics
    r, f = rule.split("/"), flt.split("/")
    for i, level in enumerate(r):
        if level == "#":
            return True
        if i >= len(f):
            return False
        if f[i] == "#":
            return False  # the filter reaches deeper than this rule does
        if level != "+" and (f[i] == "+" or f[i] != level):
            return False
    return len(r) == len(f)


class AclRules:
    """The rules of one ACL file."""

    def __init__(self) -> None:
        self.anonymous: list[tuple[int, str]] = []  # (access, topic); access 0 = deny
        self.users: dict[str, list[tuple[int, str]]] = {}
        self.patterns: list[tuple[int, str]] = []

    def rules(self, username: str | None, client_id: str) -> list[tuple[int, str]]:
        """The rules for one client: its user's (or the anonymous ones) and the patterns."""
        own = self.users.get(username, []) if username is not None else self.anonymous
        if not self.patterns:
            return own
        pats = []
        for access, topic in self.patterns:
            if "%u" in topic:
                if username is None:
                    continue  # %u names nobody for an anonymous client
                topic = topic.replace("%u", username)
            pats.append((access, topic.replace("%c", client_id)))
        return own + pats

    def can_topic(self, rules: list[tuple[int, str]], topic: str, want: int) -> bool:
        """May a client with ``rules`` read (``want`` READ) or write ``topic``?"""
        granted = False
        for access, rule in rules:
            if mqtt_filter_matches(rule, topic):
                if not access:
                    return False
                if access & want:
                    granted = True
        return granted

    def can_subscribe(self, rules: list[tuple[int, str]], flt: str) -> bool:
        granted = False
        for access, rule in rules:
            if not access:
                if filter_covers(rule, flt):
                    return False
            elif access & READ and filter_covers(rule, flt):
                granted = True
        return granted


def load_acl_file(path: str | Path) -> AclRules:
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as e:
        raise AclFileError(f"mqtt_acl_file: cannot read {path}: {e.strerror}") from None
    return parse_acl(text, f"mqtt_acl_file {path}")


def parse_acl(text: str, source: str = "ACL file") -> AclRules:
    """The rules of an ACL file's text (``source`` names it in errors: AclFileError)."""
    acl = AclRules()
    current = acl.anonymous
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        if word == "user":
            if not rest:
                raise AclFileError(f"{source}, line {n}: 'user' needs a user name")
            current = acl.users.setdefault(rest, [])
            continue
        if word not in ("topic", "pattern"):
            raise AclFileError(f"{source}, line {n}: expected topic, pattern or user, got {word!r}")
        access_word, _, topic = rest.partition(" ")
        if access_word in _ACCESS and topic.strip():
            access, topic = _ACCESS[access_word], topic.strip()
        else:
            access, topic = READ | WRITE, rest  # no access word: readwrite (the topic may hold spaces)
        if not topic:
            raise AclFileError(f"{source}, line {n}: {word} without a topic")
        (acl.patterns if word == "pattern" else current).append((access, topic))
    return acl


class TopicAclAuthorizer:
    """The rules of an ACL file, asked about MQTT topics (see the module docstring)."""

    __slots__ = ("rules", "_cache")

    def __init__(self, rules: AclRules) -> None:
        self.rules = rules
        self._cache: dict[tuple[str | None, str], list[tuple[int, str]]] = {}  # identity -> its rules

    @classmethod
    def from_file(cls, path: str | Path) -> "TopicAclAuthorizer":
        return cls(load_acl_file(path))

    def _rules_of(self, principal: str | None, client_id: str) -> list[tuple[int, str]]:
        key = (principal, client_id)
        rules = self._cache.get(key)
        if rules is None:
            if len(self._cache) > 100_000:  # identities come and go: keep it bounded
                self._cache.clear()
            rules = self._cache[key] = self.rules.rules(principal, client_id)
        return rules

    def check(self, ctx: RequestContext, action: Action, resource: Resource, name: str) -> None:
        if resource is not Resource.MQTT_TOPIC:
            return
        rules = self._rules_of(ctx.principal, ctx.client_id)
        if action is Action.PUBLISH:
            ok = self.rules.can_topic(rules, name, WRITE)
        elif action is Action.SUBSCRIBE:
            ok = self.rules.can_subscribe(rules, name)
        else:
            return
        if not ok:
            raise forbidden(ctx, action, resource, name)
