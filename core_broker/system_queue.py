"""Messages parked in a system queue until they move to their real queue.

A delayed message waits in the timer queue and a transactional one in the
half queue, each stored once with its real topic and queue in reserved
properties; firing or committing links the record into the real queue. Both
queues are written (``park``) and read again after a restart (``unfinished``:
from the tracker's low-water mark, or the queue's first offset if retention
removed more, to the end, skipping what the tracker marks done) the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from .model import GetStatus, Message, StoredMessage
from .system_queue_tracker import SystemQueueTracker
from .system_topics import P_REAL_QUEUE, P_REAL_TOPIC

if TYPE_CHECKING:
    from .message_store import MessageStore

SCAN_BATCH = 512  # entries read per store.get


def park(msg: Message, system_topic: str, extra: dict[str, str], **fields: Any) -> Message:
    """``msg`` as stored in ``system_topic`` (queue 0): its real topic and queue in reserved
    properties, then ``extra``; ``fields`` set further Message fields (or override these)."""
    props = dict(msg.properties)
    props[P_REAL_TOPIC] = msg.topic
    props[P_REAL_QUEUE] = str(msg.queue_id)
    props.update(extra)
    kw: dict[str, Any] = {
        "tag": msg.tag,
        "keys": msg.keys,
        "properties": props,
        "message_group": msg.message_group,
        "born_timestamp_ms": msg.born_timestamp_ms,
        "born_host": msg.born_host,
        "protocol": msg.protocol,
        "message_id": msg.message_id,
        "queue_id": 0,
    }
    kw.update(fields)
    return Message(system_topic, msg.body, **kw)


def unfinished(store: "MessageStore", topic: str, tracker: SystemQueueTracker) -> Iterator[StoredMessage]:
    """Every message of ``topic`` (queue 0) that ``tracker`` does not mark done, in queue order."""
    off = max(tracker.low_water, store.min_offset(topic, 0))
    while True:
        r = store.get(topic, 0, off, SCAN_BATCH)
        if r.status == GetStatus.OFFSET_MOVED:
            off = r.next_offset
            continue
        if not r.messages:
            return
        for m in r.messages:
            if not tracker.is_done(m.queue_offset):
                yield m
        off = r.next_offset
