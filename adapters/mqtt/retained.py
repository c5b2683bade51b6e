"""Retained messages: the last retained PUBLISH per topic, kept in memory and in the processor's kv.

Why the kv and not a topic: a retained message is state (one per topic, replaced
or cleared by the next), read whole at start, never consumed; the processor's
durable key-value store (namespace ``mqtt.retained``) is exactly that.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Iterator

from gateway.api import MessagingAPI
from gateway.context import RequestContext
from gateway.naming import unified_topic_of_mqtt

from . import codec as C
from .mapping import Outgoing, message_properties, now_ms, outgoing_from_stored
from .topics import filter_matches

log = logging.getLogger("unimq.mqtt")

__all__ = ["RetainedStore", "KV_RETAINED"]

KV_RETAINED = "mqtt.retained"


class RetainedStore:
    """Topic -> its retained message."""

    __slots__ = ("processor", "ctx", "messages")

    def __init__(self, processor: MessagingAPI, ctx: RequestContext) -> None:
        self.processor = processor
        self.ctx = ctx
        self.messages: dict[str, Outgoing] = {}

    def __len__(self) -> int:
        return len(self.messages)

    async def load(self) -> None:
        """Read back what was retained before a restart (expired ones dropped)."""
        for topic, raw in (await self.processor.kv_items(self.ctx, KV_RETAINED)).items():
            self.apply(topic, raw)

    def apply(self, topic: str, raw: bytes | None) -> None:
        """Take in ``topic``'s durable record (None: cleared), read back or written by another gateway."""
        if raw is None:
            self.messages.pop(topic, None)
            return
        try:
            d = json.loads(raw)
            out = outgoing_from_stored(d["x"], base64.b64decode(d["b"]), topic)
        except (ValueError, KeyError, TypeError):
            log.warning("dropping unreadable retained message for %r", topic)
            return
        if not out.expired(now_ms()):
            out.ut = unified_topic_of_mqtt(topic)
            self.messages[topic] = out

    async def retain(self, it: C.Publish) -> None:
        """A retained PUBLISH was stored: it replaces its topic's (an empty one clears it)."""
        if not it.payload:
            self.messages.pop(it.topic, None)
            await self.processor.kv_put(self.ctx, KV_RETAINED, it.topic, None)
            return
        props = message_properties(it.topic, it.qos, True, it.properties)
        out = self.messages[it.topic] = outgoing_from_stored(props, it.payload, it.topic)
        out.ut = unified_topic_of_mqtt(it.topic)
        value = json.dumps({"b": base64.b64encode(it.payload).decode(), "x": props}, separators=(",", ":"))
        await self.processor.kv_put(self.ctx, KV_RETAINED, it.topic, value.encode())

    def matching(self, flt: str) -> Iterator[tuple[str, Outgoing]]:
        """The retained messages a new subscription to ``flt`` gets (expired ones are dropped)."""
        now = now_ms()
        for topic, out in list(self.messages.items()):
            if out.expired(now):
                self.messages.pop(topic, None)
                continue
            if filter_matches(flt, topic):
                yield topic, out
