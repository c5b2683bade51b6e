"""Deciding a permission question from a snapshot of users and permissions (no I/O).

The resources and their pattern syntax:

- ``topic``: an MQTT topic filter (``+`` one level, ``#`` the rest; ``*`` or ``#``
  alone: every topic), matched against unified topic names and MQTT topic names
  alike; a pattern with ``*``, ``?`` or ``[`` is a shell pattern instead
  (``orders-*``; ``*`` crosses ``/``). An MQTT subscription's filter must be *covered* by the pattern
  (``a/#`` covers ``a/b/+``). MQTT topic ``a/b/c`` is stored in unified topic
  ``a`` (``gateway.naming``), so publishing and creating a unified topic is
  also granted by a pattern whose first level names it (``sensors/+/temp``
  lets an MQTT client's message into topic ``sensors``); reading a unified
  topic whole needs a pattern matching it (``sensors/#``, ``sensors``, ``#``).
- ``group``: a consumer group, shell-style (``*``, ``?``, ``[...]``; ``fnmatch``).
- ``vhost``: an AMQP virtual host (pattern: its name, or ``*``), with RabbitMQ's
  configure/write/read regular expressions on exchange and queue names
  (searched, as RabbitMQ does; an empty expression grants nothing).
- ``admin``: the admin surface (users and permissions, door state, the
  deployment's figures), shell-style on the area's name. A subject with
  ``admin`` on ``admin *`` is a superuser: it may do everything.

A principal's permissions are its own, its roles' (``role:<name>``), and, for a
client without credentials, those of ``anonymous``. Grants only: no deny rules
(what is not granted is refused).
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

from gateway.naming import mqtt_filter_matches, unified_topic_of_mqtt
from gateway.topic_acl import filter_covers

from .model import ANONYMOUS, Permission, Snapshot

__all__ = ["Rules"]

_Compiled = tuple[str, str, frozenset[str], tuple[str, str, str]]  # resource, pattern, actions, vhost regexes


def topic_pattern_matches(pattern: str, name: str, action: str, *, mqtt: bool) -> bool:
    """Does a ``topic`` pattern grant ``action`` on ``name`` (an MQTT topic, filter, or unified topic)?"""
    if pattern in ("*", "#"):
        return True
    if "*" in pattern or "?" in pattern or "[" in pattern:  # a shell pattern (orders-*)
        return fnmatchcase(name, pattern)
    if mqtt:
        if action == "subscribe":  # an MQTT filter (a topic name is a filter too)
            return filter_covers(pattern, name)
        return mqtt_filter_matches(pattern, name)
    if mqtt_filter_matches(pattern, name):
        return True
    if action in ("publish", "create") and "/" in pattern:
        first = pattern.split("/", 1)[0]
        return first in ("+", "#") or unified_topic_of_mqtt(first) == name
    return False


class Rules:
    """The permissions of one snapshot, compiled per principal on first use (cached)."""

    def __init__(self, snapshot: Snapshot, token_roles: dict[str, tuple[str, ...]] | None = None) -> None:
        self.snapshot = snapshot
        # roles a user's latest JWT carried (gateway.access.tokens), on top of its own in the store
        self.token_roles = token_roles if token_roles is not None else {}
        by_subject: dict[str, list[Permission]] = {}
        for p in snapshot.permissions.values():
            by_subject.setdefault(p.subject, []).append(p)
        self._by_subject = by_subject
        self._compiled: dict[str | None, tuple[bool, list[_Compiled]]] = {}

    def subjects(self, principal: str | None) -> list[str]:
        if principal is None:
            return [ANONYMOUS]
        user = self.snapshot.users.get(principal)
        roles = list(user.roles) if user is not None else []
        extra = self.token_roles.get(principal)
        if extra:
            roles += [r for r in extra if r not in roles]
        return [principal] + [f"role:{r}" for r in roles]

    def _of(self, principal: str | None) -> tuple[bool, list[_Compiled]]:
        got = self._compiled.get(principal)
        if got is None:
            rules: list[_Compiled] = []
            superuser = False
            for subject in self.subjects(principal):
                for p in self._by_subject.get(subject, ()):
                    rules.append((p.resource, p.pattern, p.actions, (p.configure, p.write, p.read)))
                    if p.resource == "admin" and p.pattern == "*" and "admin" in p.actions:
                        superuser = True
            if len(self._compiled) > 10_000:  # principals come and go: keep it bounded
                self._compiled.clear()
            got = self._compiled[principal] = (superuser, rules)
        return got

    def is_superuser(self, principal: str | None) -> bool:
        return self._of(principal)[0]

    def allows(self, principal: str | None, action: str, resource: str, name: str, *, mqtt: bool = False) -> bool:
        """May ``principal`` do ``action`` on the ``resource`` (topic, group, admin) called ``name``?"""
        superuser, rules = self._of(principal)
        if superuser:
            return True
        for res, pattern, actions, _ in rules:
            if res != resource or action not in actions:
                continue
            if resource == "topic":
                if topic_pattern_matches(pattern, name, action, mqtt=mqtt):
                    return True
            elif pattern == "*" or fnmatchcase(name, pattern):
                return True
        return False

    def vhost_allows(self, principal: str | None, vhost: str, what: str, name: str) -> bool:
        """RabbitMQ's check: may ``principal`` ``what`` (configure, write, read) ``name`` in ``vhost``?"""
        superuser, rules = self._of(principal)
        if superuser:
            return True
        index = ("configure", "write", "read").index(what)
        for res, pattern, _, regexes in rules:
            if res == "vhost" and (pattern in ("*", vhost)):
                rx = regexes[index]
                if rx and re.search(rx, name):
                    return True
        return False

    def may_open_vhost(self, principal: str | None, vhost: str) -> bool:
        """Any permission at all in ``vhost`` (RabbitMQ refuses connection.open without one)."""
        superuser, rules = self._of(principal)
        return superuser or any(res == "vhost" and pattern in ("*", vhost) for res, pattern, _, _ in rules)
