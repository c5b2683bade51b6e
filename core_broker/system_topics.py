"""Names of the broker's own topics and the reserved property keys it uses.

System topics live in the same commitlog as user topics so every broker-side
state change (retry, dead letter, timer, half transaction, journal) is a
record recovered like any other. Reserved property keys start with ``__`` and
are stripped before a message is handed to a client.
"""

from __future__ import annotations

TIMER_TOPIC = "%SYS_TIMER%"
HALF_TOPIC = "%SYS_HALF%"
JOURNAL_TOPIC = "%SYS_JOURNAL%"
RETRY_PREFIX = "%RETRY%"
# Light message queues: per-subscription / per-AMQP-queue topics that doors create
# and fill by multi-dispatch (RocketMQ's LMQ idea).
LMQ_PREFIX = "%LMQ%"
DLQ_PREFIX = "%DLQ%"
# Message traces (gateway/trace.py): one event per message, keyed by the traced message's id.
TRACE_TOPIC = "%SYS_TRACE%"

P_REAL_TOPIC = "__rt"  # where a timer/half message really goes
P_REAL_QUEUE = "__rq"
P_DELIVER_AT = "__dt"
P_ORIGIN_TOPIC = "__ot"  # topic a retried / dead-lettered message was first sent to
P_PRODUCER_GROUP = "__pg"
P_JOURNAL_OP = "__jop"  # journal entries: which state change
P_JOURNAL_DATA = "__jd"

RESERVED_PREFIX = "__"


def retry_topic(group: str, topic: str) -> str:
    """Per (group, topic), like RocketMQ 5's pop retry topics, so a pop of one topic
    never receives another topic's retries."""
    return f"{RETRY_PREFIX}{group}+{topic}"


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def is_system_topic(topic: str) -> bool:
    return topic.startswith("%")


def is_lmq(topic: str) -> bool:
    return topic.startswith(LMQ_PREFIX)


BATCH_PREFIX = "__batch_"  # record.P_BATCH_*


def public_properties(props: dict[str, str]) -> dict[str, str]:
    """User-visible properties (reserved keys removed)."""
    if not any(k.startswith(RESERVED_PREFIX) for k in props):
        return props
    # a batch record's own (count, index: "__batch_*") stay for the gateway, which unpacks it and drops them
    return {k: v for k, v in props.items() if not k.startswith(RESERVED_PREFIX) or k.startswith(BATCH_PREFIX)}
