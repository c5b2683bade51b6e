"""Typed errors of the broker core.

Each error carries a stable ``code`` (named after RocketMQ 5's v2 status codes
where one exists) so that the gateway and every adapter can translate it into
its own protocol's error without parsing messages.
"""

from __future__ import annotations


class UnimqError(Exception):
    """Base of every error unimq raises on purpose."""

    code: str = "INTERNAL_ERROR"

    def __init__(self, message: str = "", **details: object) -> None:
        super().__init__(message or self.code)
        self.details = details


class ConfigurationError(UnimqError, ValueError):
    """A setting names something unusable (a file in no known form, say), found when a part
    starts: `unimq up` stops with this message and no traceback."""

    code = "CONFIGURATION_ERROR"


class StaleEpochError(UnimqError):
    """A replication change quoted a master or in-sync-set epoch the controller has moved past."""

    code = "STALE_EPOCH"


class StoreFullError(UnimqError):
    """The disk (or the configured threshold) cannot take more data; nothing was written."""

    code = "STORE_FULL"


class MessageTooLargeError(UnimqError):
    code = "MESSAGE_BODY_TOO_LARGE"


class StoreClosedError(UnimqError):
    code = "SERVICE_UNAVAILABLE"


class CorruptRecordError(UnimqError):
    """A record failed its checksum; it is never returned to a reader."""

    code = "CORRUPT_RECORD"


class TopicNotFoundError(UnimqError):
    code = "TOPIC_NOT_FOUND"


class TopicExistsError(UnimqError):
    code = "TOPIC_EXISTS"


class BadRequestError(UnimqError):
    code = "BAD_REQUEST"


class InvalidArgumentError(BadRequestError, ValueError):
    """A bad argument value (also a ValueError, for Python callers' sake)."""

    code = "BAD_REQUEST"


class MessageKeyRequiredError(BadRequestError):
    """A message without a key sent to a compacted topic (which keeps the latest message per key)."""

    code = "ILLEGAL_MESSAGE_KEY"


class IllegalFilterExpressionError(BadRequestError):
    code = "ILLEGAL_FILTER_EXPRESSION"


class TierUnreadableError(UnimqError):
    """Start-up: the local commitlog is empty and the tier, which says where it continues,
    cannot be read (see ``TierService.continue_empty_log``)."""

    code = "SERVICE_UNAVAILABLE"


class FlushTimeoutError(UnimqError):
    code = "MASTER_PERSISTENCE_TIMEOUT"


class BrokerWriteBlockedError(UnimqError):
    """The broker is read-only (draining for scale-in); send to another broker."""

    code = "FORBIDDEN"


class NotEnoughInSyncReplicasError(UnimqError):
    """Replication: fewer in-sync members than ``min_insync_replicas`` hold the put.

    Retriable: raised before anything is written when the in-sync set is too small,
    or while waiting when acknowledgements do not come in time (then the write may
    exist on some members but was never acknowledged to the client).
    """

    code = "NOT_ENOUGH_REPLICAS"


class ReplicaAckTimeoutError(NotEnoughInSyncReplicasError):
    """A put was written but not acknowledged by enough in-sync members in time: it may exist on
    some of them, so only the client (which knows whether to) may send it again."""

    code = "NOT_ENOUGH_REPLICAS"


class NotMasterError(UnimqError):
    """Replication: this broker is a replica (or has no role yet); writes go to the master."""

    code = "NOT_MASTER"


class ReplicaOffsetMismatchError(UnimqError):
    """Replication: bytes offered to a replica do not start where its log ends."""

    code = "REPLICA_OFFSET_MISMATCH"


class QueueMovedError(UnimqError):
    """A static topic's logic queue is not written on this broker (any more): a remap moved it.
    Retriable: the sender asks the routes again and sends to the queue's new broker."""

    code = "QUEUE_MOVED"
