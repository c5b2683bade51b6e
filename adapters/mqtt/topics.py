"""MQTT topic names and filters: validation, the unified-topic mapping, and the filter trie.

Why a trie: a PUBLISH must find every subscription whose filter matches its
topic without scanning all subscriptions (the issue's "not by scanning"). The
trie holds one node per filter level; ``+`` and ``#`` are ordinary child keys,
so matching a topic of L levels visits at most the nodes on the paths its
levels and wildcards allow, independent of how many filters exist elsewhere.
The ``$``-topic rule (MQTT 4.7.2: a filter starting with a wildcard does not
match a topic starting with ``$``) is applied at the root. A filter without
wildcards matches one topic only: it is kept whole in a dict beside the trie
(one lookup per PUBLISH), not as a node per level. Why: a fleet's devices each
subscribe to their own topic (``fleet/<id>/cmd``), on every gateway (fleet.py),
and a node per level cost ~700 bytes per device per gateway (issue 21's memory).

The one-model mapping (MQTT topic ``a/b/c`` stored in unified topic ``a``, the
full topic in a property) is ``gateway.naming``'s, shared with the other doors.
"""

from __future__ import annotations

import hashlib
import re
import sys
from typing import Any, Callable, Iterator

from gateway.naming import MQTT_OTHER_TOPIC, mqtt_filter_matches, unified_topic_of_mqtt

from .codec import RC_TOPIC_FILTER_INVALID, MQTTProtocolError

__all__ = [
    "TopicTrie",
    "validate_filter",
    "parse_shared",
    "unified_topic",
    "filter_matches",
    "lmq_safe",
]

# The one-model mapping is gateway.naming's (every door and Spark share it); kept under
# these names for the door's callers.
OTHER_TOPIC = MQTT_OTHER_TOPIC
unified_topic = unified_topic_of_mqtt
filter_matches = mqtt_filter_matches


def validate_filter(f: str) -> None:
    """Raise MQTTProtocolError(0x8F) for an invalid topic filter (MQTT 4.7.1)."""
    if not f:
        raise MQTTProtocolError(RC_TOPIC_FILTER_INVALID, "empty topic filter")
    if "+" not in f and "#" not in f:
        return
    levels = f.split("/")
    last = len(levels) - 1
    for i, lv in enumerate(levels):
        if "#" in lv and (lv != "#" or i != last):
            raise MQTTProtocolError(RC_TOPIC_FILTER_INVALID, f"'#' must be a whole last level in {f!r}")
        if "+" in lv and lv != "+":
            raise MQTTProtocolError(RC_TOPIC_FILTER_INVALID, f"'+' must be a whole level in {f!r}")


def parse_shared(f: str) -> tuple[str | None, str]:
    """``$share/group/filter`` -> (group, filter); anything else -> (None, f)."""
    if not f.startswith("$share/"):
        return None, f
    rest = f[7:]
    group, sep, flt = rest.partition("/")
    if not sep or not group or not flt or "+" in group or "#" in group:
        raise MQTTProtocolError(RC_TOPIC_FILTER_INVALID, f"invalid shared subscription {f!r}")
    validate_filter(flt)
    return group, flt


_SAFE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def lmq_safe(name: str) -> str:
    """A short, filesystem- and topic-name-safe rendering of a client id or group."""
    if _SAFE.fullmatch(name):
        return name
    return "h" + hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:24]


# A node's children or entries until it has some: one shared empty dict, never written to (only
# TopicTrie.add writes, and it gives the node a dict of its own first). Most nodes of a fleet's
# trie (one filter per device, fleet.py) have either children or entries, not both: 64 bytes each.
_NONE: dict[Any, Any] = {}


class _Node:
    __slots__ = ("children", "subs")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = _NONE
        self.subs: dict[Any, Any] = _NONE  # owner key -> entry


class TopicTrie:
    """Filters -> entries, one entry per (filter, owner key); ``key_of(entry)`` is its key
    (entries are never dicts)."""

    def __init__(self, key_of: Callable[[Any], Any]) -> None:
        self.root = _Node()
        self.key_of = key_of
        # a filter without wildcards -> its one entry itself (a fleet device's own topic), or a
        # dict key -> entry for several (a one-entry dict is 184 bytes, a (key, entry) tuple 56)
        self.exact: dict[str, Any] = {}
        self.count = 0

    def add(self, flt: str, key: Any, entry: Any) -> None:
        if "+" not in flt and "#" not in flt:
            self._add_exact(flt, key, entry)
            return
        node = self.root
        for lv in flt.split("/"):
            nxt = node.children.get(lv)
            if nxt is None:
                if node.children is _NONE:
                    node.children = {}
                # interned: a level many filters share ("cmd" in fleet/<id>/cmd) is held once
                nxt = node.children[sys.intern(lv)] = _Node()
            node = nxt
        if key not in node.subs:
            self.count += 1
            if node.subs is _NONE:
                node.subs = {}
        node.subs[key] = entry

    def _add_exact(self, flt: str, key: Any, entry: Any) -> None:
        cur = self.exact.get(flt)
        if cur is None:
            self.exact[flt] = entry
        elif not isinstance(cur, dict):
            k = self.key_of(cur)
            if k == key:
                self.exact[flt] = entry
                return
            self.exact[flt] = {k: cur, key: entry}
        else:
            known = key in cur
            cur[key] = entry
            if known:
                return
        self.count += 1

    def remove(self, flt: str, key: Any) -> Any:
        if "+" not in flt and "#" not in flt:
            return self._remove_exact(flt, key)
        path = [self.root]
        node = self.root
        levels = flt.split("/")
        for lv in levels:
            node = node.children.get(lv)  # type: ignore[assignment]
            if node is None:
                return None
            path.append(node)
        entry = node.subs.pop(key, None)
        if entry is not None:
            self.count -= 1
        # prune empty nodes bottom-up
        for i in range(len(levels), 0, -1):
            n = path[i]
            if n.subs or n.children:
                break
            del path[i - 1].children[levels[i - 1]]
        return entry

    def _remove_exact(self, flt: str, key: Any) -> Any:
        cur = self.exact.get(flt)
        if cur is None:
            return None
        if not isinstance(cur, dict):
            if self.key_of(cur) != key:
                return None
            del self.exact[flt]
            entry = cur
        else:
            entry = cur.pop(key, None)
            if entry is None:
                return None
            if len(cur) == 1:
                self.exact[flt] = next(iter(cur.values()))
        self.count -= 1
        return entry

    def match(self, topic: str) -> list[Any]:
        """Every entry whose filter matches ``topic``."""
        cur = self.exact.get(topic)
        out: list[Any] = [] if cur is None else list(cur.values()) if isinstance(cur, dict) else [cur]
        if not self.root.children:
            return out
        levels = topic.split("/")
        n = len(levels)
        stack = [(self.root, 0)]
        dollar = topic[:1] == "$"
        while stack:
            node, i = stack.pop()
            ch = node.children
            if i == n:
                if node.subs:
                    out.extend(node.subs.values())
                h = ch.get("#")
                if h is not None and h.subs:
                    out.extend(h.subs.values())
                continue
            if not (i == 0 and dollar):
                h = ch.get("#")
                if h is not None and h.subs:
                    out.extend(h.subs.values())
                p = ch.get("+")
                if p is not None:
                    stack.append((p, i + 1))
            c = ch.get(levels[i])
            if c is not None:
                stack.append((c, i + 1))
        return out

    def __iter__(self) -> Iterator[Any]:
        for cur in self.exact.values():
            if isinstance(cur, dict):
                yield from cur.values()
            else:
                yield cur
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield from node.subs.values()
            stack.extend(node.children.values())
