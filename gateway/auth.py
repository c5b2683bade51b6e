"""Authorization: one decision point, in the processor, for every door.

Doors authenticate (MQTT/AMQP passwords, the gRPC HMAC signature, ...) and put
who the caller is in the :class:`RequestContext` (``principal``, ``client_id``,
``protocol``, ``remote_address``); a door's own background work uses a context
of its own with no principal. Each processor call then asks the installed
:class:`Authorizer` whether that identity may do an :class:`Action` on a
:class:`Resource` named ``name``, and the authorizer raises a typed error
(:class:`ForbiddenError`, :class:`UnauthorizedError`) carrying the code doors
translate into their protocol's refusal. The default, :class:`AllowAll`, is what
an out-of-the-box broker does.

What each processor call asks (names as the brokers store them, so a namespaced
context's ``orders`` is asked as ``<ns>%orders``):

====================================================  ==========================================
call                                                  asks
====================================================  ==========================================
send, end_transaction                                 PUBLISH topic (once per topic of a call)
pop, ack, ack_batch, change_invisible, forward_to_dlq SUBSCRIBE topic, SUBSCRIBE group
commit_offset, get_offset                             SUBSCRIBE topic, SUBSCRIBE group
pull, pull_raw, query_offset, query_messages_by_key   SUBSCRIBE topic (pull_arrow: as pull or pull_raw)
query_message_by_id                                   SUBSCRIBE on the found message's topic
query_route, describe_topic                           PUBLISH or SUBSCRIBE topic (either will do)
list_topics                                           lists only topics the caller may use so
create_topic, host_lmq                                CREATE topic
update_topic                                          ADMIN topic; attributes: CREATE or ADMIN
delete_topic                                          DELETE topic
kv_put, kv_get, kv_items, kv_put_many, kv_get_many   ADMIN door_state (its namespace)
kv_create_many                                        ADMIN door_state (its namespace)
consumer_lag, store_stats                             ADMIN cluster ("")
remap_queue, release_queue                            ADMIN topic
====================================================  ==========================================

A door asks itself, through ``MessagingAPI.authorize``/``allowed``, for what it
decides alone (an MQTT subscription's filter, delivery of a topic to a session):
those use :attr:`Resource.MQTT_TOPIC` and the like; the AMQP door asks RabbitMQ's
configure/write/read questions on exchanges and queues with :attr:`Resource.AMQP`.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from core_broker.errors import UnimqError

from .context import RequestContext


class Action(str, Enum):
    """What a caller wants to do (the verbs every door's operations map to)."""

    PUBLISH = "publish"  # send a message, end a transaction
    SUBSCRIBE = "subscribe"  # consume: receive, settle, read by offset, look messages up
    CREATE = "create"  # create a topic (or a queue a door hosts for a client)
    DELETE = "delete"  # delete a topic
    ADMIN = "admin"  # change a topic, door state, the deployment's figures


class Resource(str, Enum):
    """What kind of thing ``name`` names in an authorization question."""

    TOPIC = "topic"  # a unified topic, as the brokers store it
    GROUP = "group"  # a consumer group
    MQTT_TOPIC = "mqtt_topic"  # an MQTT topic name; for SUBSCRIBE a topic filter, to be covered entirely
    DOOR_STATE = "door_state"  # a door's durable state, by its namespace ("mqtt.session", ...)
    CLUSTER = "cluster"  # the deployment as a whole (name "")
    # An AMQP exchange or queue: name "<vhost>\x1f<exchange or queue>" (AMQP_SEP); RabbitMQ's
    # configure is CREATE (declare, delete), write is PUBLISH, read is SUBSCRIBE.
    AMQP = "amqp"


#: Separates the vhost from the exchange or queue name in an :attr:`Resource.AMQP` question.
AMQP_SEP = "\x1f"


class UnauthorizedError(UnimqError):
    """The caller is not (or could not be) authenticated."""

    code = "UNAUTHORIZED"


class ForbiddenError(UnimqError):
    """The caller is known but may not do this. ``details``: action, resource, name, principal."""

    code = "FORBIDDEN"


def forbidden(ctx: RequestContext, action: Action, resource: Resource, name: str) -> ForbiddenError:
    """The refusal an authorizer raises: one wording and the same details for every door."""
    who = ctx.principal if ctx.principal is not None else "anonymous"
    what = f"{resource.value} {name!r}" if name else resource.value
    return ForbiddenError(
        f"{who} ({ctx.protocol} {ctx.client_id or '-'}) may not {action.value} {what}",
        action=action.value, resource=resource.value, name=name, principal=ctx.principal,
    )


class Authorizer(Protocol):
    def check(self, ctx: RequestContext, action: Action, resource: Resource, name: str) -> None:
        """Return when ``ctx`` may do ``action`` on ``resource`` ``name``; else raise
        :class:`ForbiddenError` (see :func:`forbidden`) or :class:`UnauthorizedError`.

        Called on the processor's hot paths (once per topic of a send call): it must be
        cheap and must not block; cache what a decision costs to compute.
        """
        ...


class AllowAll:
    """Every identity may do everything (the out-of-the-box broker)."""

    def check(self, ctx: RequestContext, action: Action, resource: Resource, name: str) -> None:
        return None


class AllOf:
    """Allowed only when every authorizer allows it (a door's rules and the deployment's)."""

    def __init__(self, *authorizers: Authorizer) -> None:
        self.authorizers = authorizers

    def check(self, ctx: RequestContext, action: Action, resource: Resource, name: str) -> None:
        for a in self.authorizers:
            a.check(ctx, action, resource, name)
