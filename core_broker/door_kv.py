"""Door state on a broker: a versioned key-value store per namespace, journaled and snapshotted.

Why a module of its own (mixed into :class:`~core_broker.broker_controller.BrokerController`):
doors keep small durable state here (MQTT sessions and retained messages, AMQP exchanges,
queues and bindings, HTTP push subscriptions), one concept apart from queues and pops. Every
entry carries a version (a delete leaves a versioned tombstone) and a write older than what
the entry holds is ignored: last writer wins. That is what lets separated gateways keep door
state on every broker (see RemoteBrokerClient.kv_put) and read back the newest copy whichever
brokers answer. ``kv_put_many`` is the storm path: one ``kvs`` journal record per 64 KiB of
entries and one wait for durability (an MQTT CONNECT storm writes its sessions this way).
"""

from __future__ import annotations

import base64
import binascii
import time

from .config import BrokerConfig
from .door_feed import DoorFeed
from .journal import Journal
from .message_store import MessageStore

__all__ = ["DoorStateKv", "kv_version", "CREATE_VERSION"]

CREATE_VERSION = 0  # a create-if-absent write's version: any other write of the key is newer


def kv_version(low: int = 0) -> int:
    """A door-state version: wall-clock milliseconds << 20 | ``low`` (a writer's tie-breaker).

    Gateways and brokers on one cluster share a clock closely enough for last-writer-wins
    between writes milliseconds apart; writes in the same millisecond are ordered by
    ``low`` the same way on every broker, so copies converge.
    """
    return (int(time.time() * 1000) << 20) | (low & 0xFFFFF)


class DoorStateKv:
    """The broker's versioned key-value store of door state (mixed into :class:`BrokerController`)."""

    config: BrokerConfig
    journal: Journal
    store: MessageStore
    door_feed: DoorFeed
    # namespace -> key -> value as base64 text, the only copy in memory: the journal and the
    # snapshot hold that text (not made again per entry per snapshot: with 100,000 MQTT sessions
    # that was a broker's largest cost in a CONNECT storm), and a read decodes it (a fleet's
    # brokers hold a session record per device: the bytes beside the text were ~190 more each)
    kv_text: dict[str, dict[str, str]]
    kv_versions: dict[str, dict[str, int]]
    _kv_last: int

    def prune_tombstones(self, now_ms: int | None = None) -> int:
        """Forget tombstones older than ``kv_tombstone_ttl_s``; return how many went.

        Without this every client id that ever ended a persistent session would stay
        in memory and in every snapshot for ever. Run with each snapshot, so the
        snapshot (and a restart from it) is where a tombstone ends.
        """
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        horizon = int(now_ms - self.config.kv_tombstone_ttl_s * 1000) << 20
        gone = 0
        for ns, vers in self.kv_versions.items():
            live = self.kv_text.get(ns, {})
            dead = [k for k, v in vers.items() if v < horizon and k not in live]
            for k in dead:
                del vers[k]
            gone += len(dead)
        return gone

    def _apply_kv(self, d: dict, writer: str = "") -> bool:
        v = d["v"]
        return self._apply_kv_raw(d["n"], d["k"], v, d.get("ver"), writer)

    def _apply_kv_raw(self, namespace: str, key: str, text: str | None, ver: int | None,
                      writer: str = "") -> bool:
        """One door-state write in memory (``text``: the value in base64, None: deleted; ``ver`` None: an entry
        of an older journal, which always applies); False when the entry already holds a version
        at least as new."""
        vers = self.kv_versions.setdefault(namespace, {})
        if ver is None:
            ver = 0
        elif ver <= vers.get(key, -1):
            return False
        vers[key] = ver
        if ver > self._kv_last:
            self._kv_last = ver
        texts = self.kv_text.setdefault(namespace, {})
        if text is None:
            texts.pop(key, None)
        else:
            texts[key] = text
        self.door_feed.kv_changed(namespace, key, writer)
        return True

    def next_kv_version(self) -> int:
        """A version newer than any this broker gave: milliseconds << 20 (see kv_version)."""
        v = max(kv_version(), self._kv_last + 1)
        self._kv_last = v
        return v

    async def kv_put(self, namespace: str, key: str, value: bytes | None, version: int | None = None) -> int:
        """Set (or with None delete) one entry; durable once this returns (under sync flush).

        ``version``: the writer's version of this write (None: a fresh one from this broker);
        a write not newer than the entry's version is ignored. Returns the entry's version.
        """
        if version is None:
            version = self.next_kv_version()
        else:
            self._kv_last = max(self._kv_last, version)
        cur = self.kv_versions.get(namespace, {}).get(key, -1)
        if version <= cur:
            return cur
        d = {"n": namespace, "k": key, "v": None if value is None else base64.b64encode(value).decode(), "ver": version}
        r = self.journal.append("kv", d)
        self._apply_kv(d)
        await self.store.wait_durable(r)
        return version

    async def kv_put_many(self, namespace: str, items: list[tuple[str, bytes | None, int]], writer: str = "") -> None:
        """Several ``kv_put`` s (key, value or None, the writer's version) in one call and one wait
        for durability: the journal is one log, so the last entry durable means all are (a group
        commit of door state: a storm of MQTT CONNECTs writes its sessions this way). ``writer``:
        the gateway writing, which the door-state feed then does not send its own writes back."""
        vers = self.kv_versions.get(namespace, {})
        fresh = []
        for item in items:
            version = item[2]
            if version > self._kv_last:
                self._kv_last = version
            if version > vers.get(item[0], -1):
                fresh.append(item)
        # journaled first (one record per 64 KiB of entries, not one per entry), then applied
        texts = [None if v is None else base64.b64encode(v).decode() for _, v, _ in fresh]
        last = self.journal.append_kvs(namespace, [(k, t, ver) for (k, _, ver), t in zip(fresh, texts)])
        for (key, value, version), text in zip(fresh, texts):
            self._apply_kv_raw(namespace, key, text, version, writer)
        if last is not None:
            await self.store.wait_durable(last)

    async def kv_create_many(self, namespace: str, items: list[tuple[str, bytes]], writer: str = "") -> list[int]:
        """Create each entry (key, value) that this broker holds nothing of, a tombstone included,
        at version 0 (:data:`CREATE_VERSION`: older than any write), in one call and one wait for
        durability; returns the indices of the items refused (the key held something).

        Why version 0: a gateway creates an MQTT session record for a client id it knows nothing
        of without reading it first (a CONNECT storm of new devices: the read was a round trip
        per broker and a sixth of a gateway's work per CONNECT). Where a broker refuses, the
        gateway falls back to reading and taking over; a create that reached only some brokers
        then loses to any real write, on every broker, so it can never hide a record."""
        vers = self.kv_versions.get(namespace, {})
        fresh: list[tuple[str, bytes, int]] = []
        refused: list[int] = []
        for i, (key, value) in enumerate(items):
            if key in vers:
                refused.append(i)
            else:
                fresh.append((key, value, CREATE_VERSION))
        if fresh:
            await self.kv_put_many(namespace, fresh, writer)
        return refused

    def kv_get(self, namespace: str, key: str) -> bytes | None:
        return _value(self.kv_text.get(namespace, {}).get(key))

    def kv_get_many_versioned(self, namespace: str, keys: list[str]) -> list[tuple[int, bytes | None]]:
        """``kv_get_versioned`` of each of ``keys``, in their order."""
        vers = self.kv_versions.get(namespace, {})
        vals = self.kv_text.get(namespace, {})
        return [(vers.get(k, -1), _value(vals.get(k))) for k in keys]

    def kv_get_versioned(self, namespace: str, key: str) -> tuple[int, bytes | None]:
        """(version, value): -1 for an entry never written, value None for a deleted one."""
        return self.kv_versions.get(namespace, {}).get(key, -1), _value(self.kv_text.get(namespace, {}).get(key))

    def kv_items(self, namespace: str) -> dict[str, bytes]:
        return {k: binascii.a2b_base64(t) for k, t in self.kv_text.get(namespace, {}).items()}

    def kv_items_versioned(self, namespace: str) -> dict[str, tuple[int, bytes | None]]:
        """Every entry of ``namespace`` with its version, deleted ones (tombstones) included."""
        vals = self.kv_text.get(namespace, {})
        return {k: (v, _value(vals.get(k))) for k, v in self.kv_versions.get(namespace, {}).items()}


def _value(text: str | None) -> bytes | None:
    """An entry's value from its base64 text (None: none)."""
    return None if text is None else binascii.a2b_base64(text)
