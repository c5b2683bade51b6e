"""The MQTT door's topic rights, asked of the processor's authorizer (one decision point for every door).

The door maps its login to an identity -- the session's ``RequestContext``:
``principal`` is the user name of its CONNECT, ``client_id`` its client id --
and its operations to actions on :attr:`Resource.MQTT_TOPIC` (``gateway/auth.py``).
The rules live in the authorizer: a Mosquitto ACL file (``mqtt_acl_file``) is
read into ``gateway.topic_acl.TopicAclAuthorizer`` and installed beside the
processor's own when the door starts.

What is asked where (with no ACL file the door asks nothing: its hot paths stay
free of it):

- PUBLISH: PUBLISH the topic. Refused: v5 PUBACK/PUBREC 0x87 Not authorized;
  3.1.1 an ordinary acknowledgement and the message dropped (what Mosquitto does,
  so a 3.1.1 client does not resend it for ever). Answers are cached per session
  and topic until its user name changes.
- SUBSCRIBE: SUBSCRIBE the filter (covered entirely by read rules, no deny
  covering it): else SUBACK 0x87 (v5) / 0x80 (3.1.1), as Mosquitto 2 does.
- Delivery: SUBSCRIBE the message's topic name, asked when the dispatch plan of a
  topic is built (once per topic and subscription change, not per message), for
  retained messages on subscribe and for messages other doors route to MQTT.
"""

from __future__ import annotations

from gateway.api import MessagingAPI
from gateway.auth import Action, Resource

from .session import EMPTY, Session

__all__ = ["AccessControl"]

_PUB, _SUB, _MQTT = Action.PUBLISH, Action.SUBSCRIBE, Resource.MQTT_TOPIC


class AccessControl:
    """A session's MQTT topic rights, as the processor's authorizer answers them."""

    __slots__ = ("processor", "enforced")

    def __init__(self, processor: MessagingAPI, enforced: bool) -> None:
        self.processor = processor
        self.enforced = enforced  # False: everything is allowed and nothing is asked

    def login(self, s: Session, username: str | None) -> bool:
        """``s`` connects as ``username``: its rights follow that identity. True when it changed."""
        if s.username == username:
            return False
        s.username = username
        s.acl_write.clear()
        return True

    def can_read(self, s: Session, topic: str) -> bool:
        """May ``s`` receive messages on ``topic``?"""
        return not self.enforced or self.processor.allowed(s.ctx, _SUB, _MQTT, topic)

    def can_write(self, s: Session, topic: str) -> bool:
        """May ``s`` publish to ``topic``? (cached per session and topic)"""
        if not self.enforced:
            return True
        ok = s.acl_write.get(topic)
        if ok is None:
            ok = self.processor.allowed(s.ctx, _PUB, _MQTT, topic)
            if len(s.acl_write) > 1024 or s.acl_write is EMPTY:  # bounded: the topics are the client's
                s.acl_write = {}
            s.acl_write[topic] = ok
        return ok

    def can_subscribe(self, s: Session, flt: str) -> bool:
        return not self.enforced or self.processor.allowed(s.ctx, _SUB, _MQTT, flt)
