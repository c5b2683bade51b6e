"""The nameserver's state: which broker serves which topic queues, under a lease.

Sans-io and clock-injected so lease expiry is testable without sleeping.
Nameservers share nothing (AP): each broker registers with every one of
them, and any one alive can answer routes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_RW = PERM_READ | PERM_WRITE


@dataclass
class BrokerInfo:
    name: str
    address: str  # host:port of its RPC endpoint
    perm: int  # broker-wide permission: RW, read-only (write-blocked) or none
    topics: dict[str, dict]  # name -> {"queues", "queue_base", "perm", "type"[, "mapping", "attributes"]}
    last_seen: float = field(default_factory=time.monotonic)
    # A replicated group's master: when it fails, another member takes the name over (gateways
    # retry a failed send on it rather than give up on the broker).
    replicated: bool = False
    epoch: int = 0  # a replicated group's master epoch: an older master's registration is ignored


class RouteTable:
    def __init__(self, lease_s: float = 120.0) -> None:
        self.lease_s = lease_s
        self.brokers: dict[str, BrokerInfo] = {}

    def register(self, name: str, address: str, perm: int, topics: dict[str, dict], now: float | None = None,
                 replicated: bool = False, epoch: int = 0) -> bool:
        """Record a broker's registration; False if a newer master of its group holds the name."""
        old = self.brokers.get(name)
        if old is not None and replicated and old.replicated and epoch < old.epoch:
            return False
        self.brokers[name] = BrokerInfo(name, address, perm, topics, time.monotonic() if now is None else now,
                                        replicated, epoch)
        return True

    def unregister(self, name: str) -> None:
        self.brokers.pop(name, None)

    def expire(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        gone = [n for n, b in self.brokers.items() if now - b.last_seen > self.lease_s]
        for n in gone:
            del self.brokers[n]
        return gone

    def route(self, topic: str, now: float | None = None) -> dict | None:
        """{"topic", "type", "queues": [{broker, address, queue_base, queues, perm}]} or None; a
        static topic's also has "mapping" (see core_broker/logic_queue.py), a topic with attributes
        gateways act on (a batch topic's, ``topic_config.ROUTE_ATTRIBUTES``) "attributes"."""
        self.expire(now)
        entries = []
        mtype = None
        attributes: dict[str, str] = {}
        mapping = None  # a static topic's map of logic queues: the newest any broker registered
        for b in sorted(self.brokers.values(), key=lambda b: b.name):
            t = b.topics.get(topic)
            if t is None:
                continue
            mtype = mtype or t.get("type", "NORMAL")
            attributes = attributes or t.get("attributes", {})
            m = t.get("mapping")
            if m is not None and (mapping is None or m.get("epoch", 0) > mapping.get("epoch", 0)):
                mapping = m
            entries.append(
                {
                    "broker": b.name,
                    "address": b.address,
                    "queue_base": t.get("queue_base", 0),
                    "queues": t["queues"],
                    "perm": t.get("perm", PERM_RW) & b.perm,
                }
            )
        if not entries:
            return None
        out = {"topic": topic, "type": mtype, "queues": entries}
        if mapping is not None:
            out["mapping"] = mapping
        if attributes:
            out["attributes"] = attributes
        return out

    def list_brokers(self, now: float | None = None) -> list[dict]:
        self.expire(now)
        return [
            {"name": b.name, "address": b.address, "perm": b.perm, "topics": sorted(b.topics), "replicated": b.replicated}
            for b in sorted(self.brokers.values(), key=lambda b: b.name)
        ]
