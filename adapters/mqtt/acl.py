"""Mosquitto ACL files (``acl_file``), so a fleet moved from Mosquitto keeps its topic rights.

The format, as Mosquitto documents it: ``topic [read|write|readwrite|deny] <topic>``
lines (no access word: readwrite; ``+``/``#`` allowed); the lines before the
first ``user <name>`` line are for anonymous clients, the lines after it for
that user name (from CONNECT, not the client id); ``pattern [read|write|readwrite|deny]
<topic>`` lines apply to every client, with ``%c`` replaced by its client id and
``%u`` by its user name. ``#`` starts a comment line. With a file configured,
only what it grants is allowed, and ``deny`` wins over any grant.

What is checked where (the door's hot paths stay free of it when no file is set):

- PUBLISH: the topic needs write. Refused: v5 PUBACK/PUBREC 0x87 Not authorized;
  3.1.1 an ordinary acknowledgement and the message dropped (what Mosquitto does,
  so a 3.1.1 client does not resend it for ever). Decisions are cached per session.
- SUBSCRIBE: the filter needs a read rule covering it entirely (``a/#`` covers
  ``a/b/+``; ``a/+`` does not cover ``a/#``), and no deny rule covering it: else
  SUBACK 0x87 (v5) / 0x80 (3.1.1), as Mosquitto 2 does.
- Delivery: each message topic needs read, checked when the dispatch plan of a topic
  is built (once per topic and subscription change, not per message), for retained
  messages on subscribe and for messages other doors route to MQTT.

Why by hand: the format is a dozen lines of parsing; no maintained Python
library reads Mosquitto's ACL files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core_broker.errors import ConfigurationError

from .topics import filter_matches

__all__ = ["AclFileError", "Acl", "AccessControl", "load_acl_file", "filter_covers"]

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


class Acl:
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
            if filter_matches(rule, topic):
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


def load_acl_file(path: str | Path) -> Acl:
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as e:
        raise AclFileError(f"mqtt_acl_file: cannot read {path}: {e.strerror}") from None
    acl = Acl()
    current = acl.anonymous
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        if word == "user":
            if not rest:
                raise AclFileError(f"mqtt_acl_file {path}, line {n}: 'user' needs a user name")
            current = acl.users.setdefault(rest, [])
            continue
        if word not in ("topic", "pattern"):
            raise AclFileError(f"mqtt_acl_file {path}, line {n}: expected topic, pattern or user, got {word!r}")
        access_word, _, topic = rest.partition(" ")
        if access_word in _ACCESS and topic.strip():
            access, topic = _ACCESS[access_word], topic.strip()
        else:
            access, topic = READ | WRITE, rest  # no access word: readwrite (the topic may hold spaces)
        if not topic:
            raise AclFileError(f"mqtt_acl_file {path}, line {n}: {word} without a topic")
        (acl.patterns if word == "pattern" else current).append((access, topic))
    return acl


class AccessControl:
    """The door's topic rights per session: an ACL file's decisions, or everything without one.

    Decisions a session makes often are cached on it (its rules once per user
    name, publish rights per topic); read rights are asked when a dispatch plan
    is built, so the delivery path pays nothing per message.
    """

    __slots__ = ("acl",)

    def __init__(self, acl: Acl | None) -> None:
        self.acl = acl

    def _rules(self, s: Any) -> list[tuple[int, str]]:
        rules = s.acl_rules
        if rules is None:
            rules = s.acl_rules = self.acl.rules(s.username, s.client_id)  # type: ignore[union-attr]
        return rules

    def login(self, s: Any, username: str | None) -> bool:
        """``s`` connects as ``username``: its rights follow that name. True when they changed."""
        if s.username == username:
            return False
        s.username = username
        s.acl_rules = None
        s.acl_write.clear()
        return True

    def can_read(self, s: Any, topic: str) -> bool:
        """May ``s`` receive messages on ``topic``? (Always, without an ACL file.)"""
        acl = self.acl
        return acl is None or acl.can_topic(self._rules(s), topic, READ)

    def can_write(self, s: Any, topic: str) -> bool:
        acl = self.acl
        if acl is None:
            return True
        ok = s.acl_write.get(topic)
        if ok is None:
            ok = acl.can_topic(self._rules(s), topic, WRITE)
            if len(s.acl_write) > 1024:  # topics are the client's: keep the cache bounded
                s.acl_write.clear()
            s.acl_write[topic] = ok
        return ok

    def can_subscribe(self, s: Any, flt: str) -> bool:
        acl = self.acl
        return acl is None or acl.can_subscribe(self._rules(s), flt)
