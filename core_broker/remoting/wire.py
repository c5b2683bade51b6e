"""Domain types on the wire: plain blocks for the data path, extension types for the rest.

The data path (send, pop, pull: the calls behind every message) carries its
batches as *blocks* (``pack_block``): plain msgpack arrays packed and unpacked
by msgpack's C code with no Python hook per message (``rows.py`` has the row
layouts). Everything else is rare enough for extension types, one code per
type, below. Packing those uses ``strict_types`` so NamedTuples (PutResult,
GetResult, ...) reach the hook instead of flattening into anonymous arrays;
each type packs as a positional list, decoded by the matching constructor.
Errors travel as (code, class name, message) and are rebuilt as the same typed
error, so an adapter in a gateway sees exactly what it would see in merged mode.
"""

from __future__ import annotations

import enum
import threading
from typing import Any, Callable

import msgpack

from .. import errors as core_errors
from ..model import (
    DispatchTarget,
    FilterExpression,
    FilterType,
    GetResult,
    GetStatus,
    Message,
    PutResult,
    PutStatus,
    StoredMessage,
)
from ..topic_config import TopicConfig

_M, _SM, _PR, _GR, _PM, _FE, _TC, _TS, _TUP = range(1, 10)


def _msg_fields(m: Message) -> list:
    return [
        m.topic, m.body, m.tag, list(m.keys), m.properties, m.message_group, m.delivery_time_ms,
        m.born_timestamp_ms, m.born_host, m.protocol, m.message_id, m.queue_id,
        [list(t) for t in m.extra_dispatch], m.reconsume_times, m.flags,
    ]


def _msg_init(m: Message, f: list) -> None:
    (m.topic, m.body, m.tag, keys, m.properties, m.message_group, m.delivery_time_ms, m.born_timestamp_ms,
     m.born_host, m.protocol, m.message_id, m.queue_id, extra, m.reconsume_times, m.flags) = f[:15]
    m.keys = tuple(keys)
    m.extra_dispatch = tuple(DispatchTarget(t, q) for t, q in extra)


# Types of layers above the core (gateway results, contexts) register here at import.
_EXT_BY_TYPE: dict[type, tuple[int, Callable[[Any], list]]] = {}
_EXT_BY_CODE: dict[int, Callable[[list], Any]] = {}


def register_ext(code: int, cls: type, to_list: Callable[[Any], list], from_list: Callable[[list], Any]) -> None:
    if code < 32 or (code in _EXT_BY_CODE and _EXT_BY_TYPE.get(cls, (None,))[0] != code):
        raise ValueError(f"extension code {code} is reserved or taken")
    _EXT_BY_TYPE[cls] = (code, to_list)
    _EXT_BY_CODE[code] = from_list


_LATE: dict[str, type] = {}


def _late_types() -> dict[str, type]:
    """Types of modules that import this one (resolved once, on first use)."""
    if not _LATE:
        from ..broker_controller import QueueStats, TopicStats
        from ..pop_service import PoppedMessage

        _LATE.update(QueueStats=QueueStats, TopicStats=TopicStats, PoppedMessage=PoppedMessage)
    return _LATE


def _pack(obj: Any, packb: Callable[[Any], bytes]) -> msgpack.ExtType:
    late = _LATE or _late_types()
    QueueStats, TopicStats, PoppedMessage = late["QueueStats"], late["TopicStats"], late["PoppedMessage"]

    ext = _EXT_BY_TYPE.get(type(obj))
    if ext is not None:
        return msgpack.ExtType(ext[0], packb(ext[1](obj)))

    if isinstance(obj, StoredMessage):
        return msgpack.ExtType(
            _SM, packb(_msg_fields(obj) + [obj.queue_offset, obj.commitlog_offset, obj.store_size, obj.store_timestamp_ms])
        )
    if isinstance(obj, Message):
        return msgpack.ExtType(_M, packb(_msg_fields(obj)))
    if isinstance(obj, PutResult):
        return msgpack.ExtType(_PR, packb([obj.status.value, obj.message_id, obj.queue_id, obj.queue_offset,
                                           obj.commitlog_offset, obj.store_size, list(obj.extra_offsets)]))
    if isinstance(obj, GetResult):
        return msgpack.ExtType(_GR, packb([obj.status.value, obj.messages, obj.next_offset, obj.min_offset, obj.max_offset]))
    if isinstance(obj, PoppedMessage):
        return msgpack.ExtType(_PM, packb([obj.message, obj.receipt_handle, obj.delivery_attempt, obj.invisible_until_ms]))
    if isinstance(obj, FilterExpression):
        return msgpack.ExtType(_FE, packb([obj.expression, getattr(obj.type, "value", obj.type)]))
    if isinstance(obj, TopicConfig):
        return msgpack.ExtType(_TC, packb([obj.name, obj.queues, obj.message_type.value, obj.perm, obj.system,
                                           obj.attributes, obj.queue_base, obj.mapping]))
    if isinstance(obj, TopicStats):
        return msgpack.ExtType(_TS, packb([obj.config, [[q.queue_id, q.min_offset, q.max_offset] for q in obj.queues]]))
    if isinstance(obj, QueueStats):
        return [obj.queue_id, obj.min_offset, obj.max_offset]  # type: ignore[return-value]
    if isinstance(obj, tuple):
        return msgpack.ExtType(_TUP, packb(list(obj)))
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (set, frozenset)):
        return list(obj)  # type: ignore[return-value]
    if isinstance(obj, bytearray | memoryview):
        return bytes(obj)  # type: ignore[return-value]
    raise TypeError(f"cannot send {type(obj).__name__} over unimq RPC")


def _unpack(code: int, data: bytes) -> Any:
    late = _LATE or _late_types()
    QueueStats, TopicStats, PoppedMessage = late["QueueStats"], late["TopicStats"], late["PoppedMessage"]

    f = unpackb(data)
    if code == _M:
        m = Message.__new__(Message)
        _msg_init(m, f)
        return m
    if code == _SM:
        sm = StoredMessage.__new__(StoredMessage)
        _msg_init(sm, f)
        sm.queue_offset, sm.commitlog_offset, sm.store_size, sm.store_timestamp_ms = f[15:19]
        return sm
    if code == _PR:
        return PutResult(PutStatus(f[0]), f[1], f[2], f[3], f[4], f[5], tuple(f[6]))
    if code == _GR:
        return GetResult(GetStatus(f[0]), f[1], f[2], f[3], f[4])
    if code == _PM:
        return PoppedMessage(f[0], f[1], f[2], f[3])
    if code == _FE:
        try:
            ftype = FilterType(f[1])
        except ValueError:  # an unknown type: the filter compiler answers the caller, typed
            ftype = f[1]
        return FilterExpression(f[0], ftype)
    if code == _TC:
        return TopicConfig(f[0], queues=f[1], message_type=f[2], perm=f[3], system=f[4], attributes=f[5],
                           queue_base=f[6], mapping=f[7] if len(f) > 7 else None)
    if code == _TS:
        return TopicStats(f[0], [QueueStats(*q) for q in f[1]])
    if code == _TUP:
        return tuple(f)
    decode = _EXT_BY_CODE.get(code)
    if decode is not None:
        return decode(f)
    return msgpack.ExtType(code, data)


# One Packer per nesting depth (an extension's payload is packed while its parent is
# being packed), per thread: creating a Packer per call cost more than the packing.
_tls = threading.local()


def packb(obj: Any) -> bytes:
    depth = getattr(_tls, "depth", 0)
    packers = getattr(_tls, "packers", None)
    if packers is None:
        packers = _tls.packers = []
    if depth == len(packers):
        packers.append(msgpack.Packer(use_bin_type=True, strict_types=True, default=_default))
    _tls.depth = depth + 1
    try:
        return packers[depth].pack(obj)
    except BaseException:
        packers[depth] = msgpack.Packer(use_bin_type=True, strict_types=True, default=_default)  # reset its buffer
        raise
    finally:
        _tls.depth = depth


def _default(o: Any) -> Any:
    return _pack(o, packb)


def unpackb(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_unpack)


# -- blocks: the data path's batches as plain arrays ---------------------------------
#
# A block is msgpack of plain values only (lists and tuples as arrays, dicts, str,
# bytes, numbers), packed and unpacked entirely by msgpack's C code: no Python hook
# runs per message. ``rows.py`` turns domain objects into rows for it and back; the
# frames carry a block as one bin field. Tuples (NamedTuples too) pack as arrays and
# arrays unpack as tuples, so the reading side must know each row's layout.


def _plain_default(o: Any) -> Any:
    """Only for odd values inside a row (a str enum never gets here; an int enum, a set of
    keys, a bytearray body do); never called for a well-typed message."""
    if isinstance(o, enum.Enum):
        return o.value
    if isinstance(o, (set, frozenset)):
        return list(o)
    raise TypeError(f"cannot send {type(o).__name__} in an RPC block")


def _plain_packer() -> msgpack.Packer:
    return msgpack.Packer(use_bin_type=True, default=_plain_default)


def pack_block(obj: Any) -> bytes:
    """``obj`` (plain values, tuples and lists) as one msgpack block."""
    packer = getattr(_tls, "plain", None)
    if packer is None:
        packer = _tls.plain = _plain_packer()
    try:
        return packer.pack(obj)
    except BaseException:
        _tls.plain = _plain_packer()  # a failed pack leaves its buffer half written
        raise


def unpack_block(data: bytes) -> Any:
    """A block back as tuples (arrays), dicts, str, bytes and numbers."""
    return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False)


# -- errors ---------------------------------------------------------------------------

_ERROR_TYPES: dict[str, type[core_errors.UnimqError]] = {}


def register_error(cls: type[core_errors.UnimqError]) -> type[core_errors.UnimqError]:
    _ERROR_TYPES[cls.__name__] = cls
    return cls


def _register_module(mod: Any) -> None:
    for v in vars(mod).values():
        if isinstance(v, type) and issubclass(v, core_errors.UnimqError):
            register_error(v)


_register_module(core_errors)


def error_to_wire(e: BaseException) -> list:
    if isinstance(e, core_errors.UnimqError):
        register_error(type(e))
        return [e.code, type(e).__name__, str(e)]
    return ["INTERNAL_ERROR", "UnimqError", f"{type(e).__name__}: {e}"]


class RemoteError(core_errors.UnimqError):
    """An error whose class this process does not know; keeps the remote code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def error_from_wire(w: list) -> core_errors.UnimqError:
    code, cls_name, message = w
    if cls_name not in _ERROR_TYPES:
        from .. import pop_service, receipt, transaction_service  # noqa: F401  (register their errors)

        for mod in (receipt, transaction_service):
            _register_module(mod)
    cls = _ERROR_TYPES.get(cls_name)
    if cls is None:
        return RemoteError(code, message)
    e = cls.__new__(cls)
    core_errors.UnimqError.__init__(e, message)
    if getattr(e, "code", None) != code:
        e.code = code  # type: ignore[misc]
    return e
