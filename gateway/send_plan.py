"""Per-topic planning of a send call: what the processor's hot send loop looks up once per topic.

A :class:`TopicPlan` holds a topic's route, the message types the topic takes,
and producer load balancing (round robin over writable queues; a FIFO message
group hashed to one queue so the group stays in order). The processor keeps a
plan per topic across calls while the broker client hands out the same route
object, so a send call of one topic costs one dictionary lookup.
"""

from __future__ import annotations

from crc32c import crc32c

from core_broker.errors import MessageKeyRequiredError
from core_broker.model import Message, MessageType

from core_broker.system_topics import RESERVED_PREFIX

from .api import ACCEPTED_MESSAGE_TYPES, MessageTypeMismatchError, NoWritableQueueError
from .batch_send import compression_of, is_batch
from .broker_client import QueueRoute, TopicRoute

# Property names seen on sends that do not start with RESERVED_PREFIX: doors stamp the
# same few names on every message, and one C-level set check per message is cheaper
# than testing each name's prefix (a generator per message). Bounded: names are the
# clients'; past the bound the prefix test just runs every time.
PLAIN_KEYS: set[str] = set()
PLAIN_KEYS_MAX = 4096
# A compacted topic's messages are placed by key; an MQTT publish (and an AMQP publish to
# amq.topic) without a key of its own is keyed by its MQTT topic name, as retained messages are.
MQTT_TOPIC = "mqtt_topic"
# A send call's messages to a round-robin topic go to its queues in contiguous runs of at least
# this many. 1: a call is spread evenly over the queues (and so over the brokers) at once, which
# users and tests rely on (a batch of a few messages reaches every broker). Runs of 32 (one queue
# per call of up to 32, as RocketMQ's producer sends a batch) saved the store a queue switch per
# few messages (bench/RESULTS.md, "processor floors: 32 per call") but changed where messages land;
# not made the default.
RUN_MIN = 1


def run_length(n: int, nw: int) -> int:
    """How many consecutive messages of an ``n``-message call go to one of ``nw`` queues."""
    return max(RUN_MIN, -(-n // max(nw, 1)))


def clean_properties(m: Message) -> None:
    """A sent message whose properties hold a name not in PLAIN_KEYS (the send paths test that
    first): the broker's reserved names are dropped, or the plain names learnt."""
    props = m.properties
    if any(k.startswith(RESERVED_PREFIX) for k in props):
        m.properties = {k: v for k, v in props.items() if not k.startswith(RESERVED_PREFIX)}
    elif len(PLAIN_KEYS) < PLAIN_KEYS_MAX:
        PLAIN_KEYS.update(props)


def compaction_key(m: Message) -> str:
    """The key of a message sent to a compacted topic (set on it when the MQTT topic stands in)."""
    if m.keys:
        return next(iter(m.keys))
    key = (m.properties or {}).get(MQTT_TOPIC)
    if not key:
        raise MessageKeyRequiredError(
            f"topic {m.topic!r} is COMPACTED: every message needs a key (the latest message of each key is kept)")
    m.keys = (key,)
    return key


def message_type_of(msg: Message, transactional: bool) -> MessageType:
    if transactional:
        return MessageType.TRANSACTION
    if msg.message_group:
        return MessageType.FIFO
    if msg.delivery_time_ms:
        return MessageType.DELAY
    return MessageType.NORMAL


class TopicPlan:
    """One topic of a send call: its route, the message types it takes (as plain strings:
    a str hash is cached, an enum's is not), and its round-robin position. ``fifo``: every
    message's queue is chosen by :meth:`select` (a FIFO topic by group, a compacted one by key)."""

    __slots__ = ("route", "accepts", "writable", "nw", "fifo", "keyed", "static", "rr", "batch", "linger",
                 "one_broker", "normal")

    def __init__(self, route: TopicRoute, rr: int) -> None:
        self.route = route
        mtype = route.config.message_type
        self.accepts = frozenset(t.value for t in ACCEPTED_MESSAGE_TYPES[mtype])
        self.writable = route.writable
        self.nw = len(self.writable)
        brokers = {q.broker for q in self.writable}
        # the broker of every writable queue when there is one (merged mode): a run needs no grouping
        self.one_broker = brokers.pop() if len(brokers) == 1 else None
        self.keyed = mtype == MessageType.COMPACTED
        self.static = route.config.mapping is not None
        self.fifo = mtype == MessageType.FIFO or self.keyed or self.static
        self.rr = rr
        self.normal = "NORMAL" in self.accepts
        # a batch topic: its compression ("none", "zstd", "lz4"); None for any other topic
        self.batch = compression_of(route.config) if is_batch(route.config) else None
        # single sends wait up to this many ms to join a batch (gateway/batch_linger.py); 0: off
        self.linger = int(route.config.attributes.get("batch.linger_ms", "0")) if self.batch else 0

    def refused(self, mtype: str) -> MessageTypeMismatchError:
        """The error of a message of type ``mtype`` (not in :attr:`accepts`) sent to this topic."""
        return MessageTypeMismatchError(
            f"topic {self.route.config.name!r} is a {self.route.config.message_type.value} topic and does not "
            f"take {mtype} messages")

    def select(self, m: Message) -> QueueRoute:
        nw = self.nw
        if not nw:
            raise NoWritableQueueError(f"topic {self.route.config.name!r} has no writable queue")
        if self.keyed:  # one key, one queue: the queue keeps its latest message
            return self.writable[crc32c(compaction_key(m).encode()) % nw]
        if self.static:  # fixed logic queues: a message group, else a key, always hashes to the same one
            key = m.message_group or (next(iter(m.keys)) if m.keys else None)
            if key:
                return self.writable[crc32c(key.encode()) % nw]
        if self.fifo and m.message_group:
            return self.writable[crc32c(m.message_group.encode()) % nw]
        n = self.rr
        self.rr = n + 1
        return self.writable[n % nw]


def select_queue(route: TopicRoute, msg: Message, rr: dict[str, int]) -> QueueRoute:
    """A queue for one message outside a plan (a resend after a broker failed)."""
    writable = route.writable
    if not writable:
        raise NoWritableQueueError(f"topic {route.config.name!r} has no writable queue")
    if route.config.message_type == MessageType.COMPACTED:
        return writable[crc32c(compaction_key(msg).encode()) % len(writable)]
    if msg.message_group and route.config.message_type == MessageType.FIFO:
        return writable[crc32c(msg.message_group.encode()) % len(writable)]
    if route.config.mapping is not None:  # static: the logic queue is fixed; its broker failed
        raise NoWritableQueueError(
            f"logic queue {msg.queue_id} of static topic {route.config.name!r} is on a broker that failed")
    n = rr.get(route.config.name, 0)
    rr[route.config.name] = n + 1
    return writable[n % len(writable)]

