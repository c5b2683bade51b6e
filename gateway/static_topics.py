"""Static topics in the separated deployment: logic queues read, written and moved through the gateway.

The map of a static topic (``core_broker/logic_queue.py``) comes with its route from the
nameservers. The gateway uses it to

- route sends: logic queue ``q`` is written on the broker leading ``q``; a broker that no
  longer leads it (a remap moved it) refuses with ``QueueMovedError`` and the send goes
  to the new leader once the routes show it (:func:`resend_moved`);
- translate reads: a pull at logic offset ``L`` goes to the item holding ``L`` (an older
  item on the broker that stored it, read up to its physical end), and every offset in
  the answer is a logic one (:func:`pull`); committed offsets are kept physically on
  each item's broker (where pop's cursors are) and read back newest item first
  (:func:`get_offset`);
- move a logic queue (:func:`remap`): seal it on its leader (the broker records where it
  ends, atomically with its puts), open the next item on the new broker where that
  broker's physical queue ends, and give the new map to every broker of the topic;
- release a drained old item (:func:`release`: scale-in).

Why in the gateway and not broker to broker, as RocketMQ's brokers forward reads of
older items: unimq's brokers never dial each other (gateways do), and the gateway
already holds every broker's connection.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Sequence

from core_broker.broker_controller import QueueStats, TopicStats
from core_broker.errors import BadRequestError, QueueMovedError, TopicNotFoundError
from core_broker.logic_queue import MappingItem, QueueMapping
from core_broker.model import GetResult, GetStatus, Message, PutResult, StoredMessage
from core_broker.pop_service import PoppedMessage
from core_broker.topic_config import PERM_READ, PERM_RW, TopicConfig

from .broker_client import QueueRoute, TopicRoute

if TYPE_CHECKING:
    from .remote_broker_client import RemoteBrokerClient

STATIC_ROUTE_TTL_S = 1.0  # how stale a static topic's map may be (a remap shows within about this)
MOVED_RETRY_S = 10.0  # how long a send waits for a moved logic queue's new leader to show
_CAUGHT_UP = (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE)

__all__ = [
    "STATIC_ROUTE_TTL_S", "create", "describe", "get_offset", "commit_offset", "pop_limits", "pull",
    "query_offset", "release", "remap", "reset_offset", "resend_moved", "route_of", "static_config",
    "to_logic_popped",
]


def static_config(tc: TopicConfig, mapping: QueueMapping) -> TopicConfig:
    """``tc`` as every broker of the static topic holds it: all logic queue ids, the map."""
    attrs = dict(tc.attributes)
    attrs["static"] = "true"
    return TopicConfig(tc.name, queues=len(mapping), message_type=tc.message_type, perm=tc.perm, system=tc.system,
                       attributes=attrs, queue_base=0, mapping=mapping.to_json())


def route_of(topic: str, raw: dict, mapping: QueueMapping) -> TopicRoute:
    """A static topic's route: each logic queue's leader first (in logic order: a key hashes over
    them), then the older items' brokers, readable (pop reads them until they are drained)."""
    perm = {e["broker"]: e["perm"] for e in raw["queues"]}
    queues = []
    for q in range(len(mapping)):
        last = mapping.last(q)
        queues.append(QueueRoute(last.broker, q, perm.get(last.broker, PERM_RW) if last.open else PERM_READ))
    for q in range(len(mapping)):
        last = mapping.last(q).broker
        for b in sorted({i.broker for i in mapping.chain(q)} - {last}):
            queues.append(QueueRoute(b, q, PERM_READ & perm.get(b, PERM_RW)))
    tc = TopicConfig(topic, queues=len(mapping), message_type=raw["type"], perm=PERM_RW,
                     attributes={"static": "true"}, mapping=mapping.to_json())
    return TopicRoute(tc, queues)


async def _map(client: "RemoteBrokerClient", topic: str) -> QueueMapping | None:
    await client.route(topic)
    return client.maps.get(topic)


async def _fresh_map(client: "RemoteBrokerClient", topic: str) -> QueueMapping:
    """The newest map any broker of the topic holds (admin: asked of the brokers, not the cache)."""
    client.invalidate(topic)
    mp = await _map(client, topic)
    if mp is None:
        if await client.route(topic) is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        raise BadRequestError(f"topic {topic!r} is not static: its queues cannot be remapped or released")
    best = mp
    for b in mp.brokers():
        tc = await client._call(b, "get_topic", topic)
        if tc is not None and tc.mapping is not None and tc.mapping["epoch"] > best.epoch:
            best = QueueMapping.from_json(tc.mapping)
    return best


async def _push(client: "RemoteBrokerClient", tc: TopicConfig, mapping: QueueMapping,
                also: Sequence[str] = ()) -> None:
    """Give ``mapping`` to every broker holding part of the topic (creating it where new)."""
    cfg = static_config(tc, mapping)
    for b in sorted(set(mapping.brokers()) | set(also)):
        if await client._call(b, "get_topic", tc.name) is None:
            await client._call(b, "create_topic", cfg, True)
        await client._call(b, "update_topic", cfg)
    client.invalidate(tc.name)


async def create(client: "RemoteBrokerClient", tc: TopicConfig, brokers: list[str]) -> TopicConfig:
    if tc.message_type.value not in ("NORMAL", "FIFO"):
        raise BadRequestError(f"a static topic is NORMAL or FIFO, not {tc.message_type.value}")
    mapping = QueueMapping.initial(tc.queues, sorted(brokers))
    cfg = static_config(tc, mapping)
    for b in mapping.brokers():
        await client._call(b, "create_topic", cfg, False)
    client.invalidate(tc.name)
    return cfg


# ---------------------------------------------------------------------- send

async def resend_moved(client: "RemoteBrokerClient", msgs: Sequence[Message], transactional: bool,
                       producer_group: str) -> list[tuple[PutResult, str | None]]:
    """Send ``msgs`` (refused by a broker that no longer leads their logic queue) to the brokers
    leading each message's logic queue now: the routes are asked again until they show a
    leader that takes them (a remap takes a few round trips), for at most ``MOVED_RETRY_S``."""
    deadline = time.monotonic() + MOVED_RETRY_S
    out: list[Any] = [None] * len(msgs)
    pending = list(range(len(msgs)))
    while True:
        groups: dict[str, list[int]] = {}
        for t in {msgs[i].topic for i in pending}:
            client.invalidate(t)
        for i in pending:
            m = msgs[i]
            mp = await _map(client, m.topic)
            lead = mp.leader(m.queue_id) if mp is not None else None
            if lead is not None:
                groups.setdefault(lead.broker, []).append(i)
        moved: Exception | None = None
        for b, idx in groups.items():
            try:
                put = await client._send_once(b, [msgs[i] for i in idx], transactional, producer_group)
            except QueueMovedError as e:  # moved again meanwhile: the next round asks again
                moved = e
                continue
            for i, r in zip(idx, put):
                out[i] = r
        pending = [i for i in pending if out[i] is None]
        if not pending:
            return out
        if time.monotonic() >= deadline:
            raise moved or QueueMovedError(f"logic queue {msgs[pending[0]].queue_id} of {msgs[pending[0]].topic!r} "
                                           "has no leader: a remap did not finish")
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------------- pull and offsets

def _logic_messages(item: MappingItem, msgs: list[StoredMessage], end: int | None) -> list[StoredMessage]:
    out = []
    for m in msgs:
        if end is not None and m.queue_offset >= end:
            break
        m.queue_offset = item.to_logic(m.queue_offset)
        out.append(m)
    return out


async def _logic_max(client: "RemoteBrokerClient", topic: str, mp: QueueMapping, q: int) -> int:
    last = mp.last(q)
    if not last.open:
        return last.logic_end  # type: ignore[return-value]
    return last.to_logic(await client._call(last.broker, "query_offset", topic, q, "end", 0))


async def pull(client: "RemoteBrokerClient", mp: QueueMapping, topic: str, q: int, offset: int, max_count: int,
               filter_expression: Any, wait_ms: int) -> GetResult:
    """Read logic queue ``q`` from logic ``offset``. A map older than the leader's (a remap this
    gateway has not seen yet) is refused by the broker: the map is read again and the read too."""
    for _ in range(20):
        try:
            return await _pull(client, mp, topic, q, offset, max_count, filter_expression, wait_ms)
        except QueueMovedError:
            client.invalidate(topic)
            mp = await _map(client, topic) or mp
            await asyncio.sleep(0.05)
    raise QueueMovedError(f"the map of {topic!r} keeps changing: read again")


async def _pull(client: "RemoteBrokerClient", mp: QueueMapping, topic: str, q: int, offset: int, max_count: int,
                filter_expression: Any, wait_ms: int) -> GetResult:
    chain = mp.chain(q)
    lmin = chain[0].logic_start
    if offset < lmin:  # released (scale-in) or never there: start at the oldest item
        return GetResult(GetStatus.OFFSET_MOVED, [], lmin, lmin, await _logic_max(client, topic, mp, q))
    idx, item = mp.locate(q, offset)
    while True:
        phys = item.to_phys(offset)
        if item.open:
            r = await client._pull_once(item.broker, topic, q, phys, max_count, filter_expression,
                                        min(wait_ms, int(STATIC_ROUTE_TTL_S * 1000)), mp.epoch)
            msgs = _logic_messages(item, r.messages, None)
            return GetResult(r.status, msgs, item.to_logic(r.next_offset), lmin, item.to_logic(r.max_offset))
        end = item.phys_end
        n = min(max_count, end - phys)
        if n > 0:
            r = await client._pull_once(item.broker, topic, q, phys, n, filter_expression, 0)
            msgs = _logic_messages(item, r.messages, end)
            nxt = min(max(r.next_offset, phys), end)
            if msgs or (nxt < end and r.status not in _CAUGHT_UP):
                status = GetStatus.FOUND if msgs else r.status
                return GetResult(status, msgs, item.to_logic(nxt), lmin, await _logic_max(client, topic, mp, q))
        if idx + 1 >= len(chain):  # sealed, the next item not open yet (a remap under way)
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], item.logic_end, lmin, item.logic_end)  # type: ignore[arg-type]
        idx += 1
        item = chain[idx]
        offset = item.logic_start


async def commit_offset(client: "RemoteBrokerClient", mp: QueueMapping, group: str, topic: str, q: int,
                        offset: int) -> None:
    """Committed physically on the item holding ``offset``; at an item's start the one before is
    marked consumed to its end, so :func:`get_offset` reads the newest evidence right."""
    idx, item = mp.locate(q, max(offset, mp.logic_min(q)))
    phys = item.to_phys(max(offset, item.logic_start))
    if not item.open:
        phys = min(phys, item.phys_end)
    if idx > 0 and offset <= item.logic_start:
        prev = mp.chain(q)[idx - 1]
        await client._call(prev.broker, "commit_offset", group, topic, q, prev.phys_end)
    await client._call(item.broker, "commit_offset", group, topic, q, phys)


async def get_offset(client: "RemoteBrokerClient", mp: QueueMapping, group: str, topic: str, q: int) -> int | None:
    """The newest item with a commit inside it (past its start) tells; the oldest item's start
    counts too. A broker's one commit per physical queue serves all of its items."""
    chain = mp.chain(q)
    asked: dict[str, int | None] = {}
    for idx in range(len(chain) - 1, -1, -1):
        item = chain[idx]
        if item.broker not in asked:
            asked[item.broker] = await client._call(item.broker, "get_offset", group, topic, q)
        c = asked[item.broker]
        if c is None:
            continue
        inside = c > item.phys_start or (idx == 0 and c >= item.phys_start)
        if inside and (item.open or c <= item.phys_end):
            return item.to_logic(c)
    return None


async def reset_offset(client: "RemoteBrokerClient", mp: QueueMapping, group: str, topic: str, q: int,
                       offset: int) -> int:
    """Every item's broker moved: items before ``offset``'s to their ends, after it to their starts,
    its own last (a broker holding two items keeps the one that counts)."""
    chain = mp.chain(q)
    offset = min(max(offset, chain[0].logic_start), await _logic_max(client, topic, mp, q))
    idx, item = mp.locate(q, offset)
    for j, other in enumerate(chain):
        if j != idx:
            await client._call(other.broker, "reset_offset", group, topic, q,
                               other.phys_end if j < idx else other.phys_start)
    got = await client._call(item.broker, "reset_offset", group, topic, q, item.to_phys(offset))
    return item.to_logic(got)


async def query_offset(client: "RemoteBrokerClient", mp: QueueMapping, topic: str, q: int, policy: str,
                       timestamp_ms: int) -> int:
    chain = mp.chain(q)
    if policy == "begin":
        first = chain[0]
        phys = await client._call(first.broker, "query_offset", topic, q, "begin", 0)
        return first.to_logic(max(phys, first.phys_start))
    if policy == "end":
        return await _logic_max(client, topic, mp, q)
    if policy != "timestamp":
        raise BadRequestError(f"unknown offset policy {policy!r}")
    for item in chain:
        phys = await client._call(item.broker, "query_offset", topic, q, "timestamp", timestamp_ms)
        if not item.open and phys >= item.phys_end:
            continue  # every message of this item is older
        return item.to_logic(max(phys, item.phys_start))
    return await _logic_max(client, topic, mp, q)


async def describe(client: "RemoteBrokerClient", mp: QueueMapping, topic: str, config: TopicConfig) -> TopicStats:
    queues = []
    for q in range(len(mp)):
        queues.append(QueueStats(q, await query_offset(client, mp, topic, q, "begin", 0),
                                 await _logic_max(client, topic, mp, q)))
    tc = TopicConfig(topic, queues=len(mp), message_type=config.message_type, attributes=dict(config.attributes),
                     mapping=mp.to_json())
    return TopicStats(tc, queues)


# ---------------------------------------------------------------------- pop

def to_logic_popped(mp: QueueMapping, broker: str, popped: list[PoppedMessage]) -> list[PoppedMessage]:
    """Popped messages' queue offsets as logic ones (the item of their broker holding them)."""
    for p in popped:
        m = p.message
        for item in reversed(mp.chain(m.queue_id)):
            if item.broker == broker and item.phys_start <= m.queue_offset and (
                    item.open or m.queue_offset < item.phys_end):
                m.queue_offset = item.to_logic(m.queue_offset)
                break
    return popped


async def pop_limits(client: "RemoteBrokerClient", mp: QueueMapping, broker: str, group: str, topic: str,
                     drained: set[tuple]) -> tuple[list[int], list[list[int]]]:
    """A FIFO static topic: what ``broker`` may pop for ``group`` now, so that a message group's
    order holds across remaps. ``skip``: the logic queues whose oldest item not yet consumed and
    acked to its end is elsewhere. ``limits``: ``[queue, end]`` where that item is here but
    another item here follows it in the chain (a -> b -> a: one physical queue): the broker reads
    no new message from ``end`` on, not even to park it behind a busy message group.
    ``drained`` remembers items found done."""
    skip: list[int] = []
    limits: list[list[int]] = []
    for q in range(len(mp)):
        chain = mp.chain(q)
        if len(chain) < 2 or all(i.broker != broker for i in chain):
            continue
        for idx, item in enumerate(chain):
            if item.open:
                break
            key = (group, topic, q, item.broker, item.phys_end)
            if key in drained:
                continue
            done = await client._call(item.broker, "consumed_offset", group, topic, q)
            if done is not None and done >= item.phys_end:
                drained.add(key)
                continue
            if item.broker != broker:
                skip.append(q)
            elif any(later.broker == broker for later in chain[idx + 1:]):
                limits.append([q, item.phys_end])
            break
    return skip, limits


# ---------------------------------------------------------------------- admin

async def remap(client: "RemoteBrokerClient", topic: str, q: int, to: str) -> dict:
    """Move where logic queue ``q`` is written to broker ``to``; nothing is copied."""
    mp = await _fresh_map(client, topic)
    names = {b["name"] for b in await client._brokers(refresh=True)}
    if to not in names:
        raise BadRequestError(f"no broker {to!r} is registered (brokers: {', '.join(sorted(names))})")
    last = mp.last(q)
    if last.open and last.broker == to:
        return mp.to_json()
    tc = await client._call(last.broker, "get_topic", topic)
    if last.open:
        end = await client._call(last.broker, "seal_queue", topic, q, mp.epoch)
        mp = mp.sealed(q, end)
    host = await client._call(to, "get_topic", topic)
    if host is None:  # the broker's first part of the topic: its queues exist, empty
        await client._call(to, "create_topic", static_config(tc, mp), True)
    start = await client._call(to, "query_offset", topic, q, "end", 0)
    mp = mp.extended(q, to, start)
    await _push(client, tc, mp, also=[to])
    return mp.to_json()


async def release(client: "RemoteBrokerClient", topic: str, q: int, broker: str) -> dict:
    """Scale-in: forget ``broker``'s closed items at the head of ``q``'s chain once every consumer
    group that read them has consumed them to their end; a broker left with no item of the
    topic drops its copy of it."""
    mp = await _fresh_map(client, topic)
    chain = mp.chain(q)
    head = []
    for item in chain[:-1]:
        if item.broker != broker:
            break
        head.append(item)
    if not head:
        mp.released(q, broker)  # raises, saying why
    end = head[-1].phys_end
    behind = [
        (g, off) for g, t, qq, b, off, _, _ in await client._call(broker, "group_queues")
        if t == topic and qq == q and b == broker and off < end
    ]
    if behind:
        raise BadRequestError(
            f"logic queue {q} on {broker!r} is not drained: "
            + ", ".join(f"group {g} at offset {off} of {end}" for g, off in behind), pending=len(behind))
    tc = await client._call(broker, "get_topic", topic)
    new = mp.released(q, broker)
    await _push(client, tc, new)
    if broker not in new.brokers():
        await client._call(broker, "delete_topic", topic)
    client.invalidate(topic)
    return new.to_json()
