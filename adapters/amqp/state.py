"""The AMQP connection's protocol state, as a sans-io state machine with an explicit transition table.

Why a table: AMQP 0-9-1 allows each connection-class method only in one phase
of the handshake (Start -> StartOk -> Tune -> TuneOk -> Open -> OpenOk), and
channel methods only once the connection is open; a method out of turn is a
hard 503 COMMAND_INVALID. Written as ``(state, event) -> next state`` the rules
are in one place, readable and testable without a socket; the connection
(``connection``) asks :func:`transition` before it acts and stores the answer.

Events are the client's channel-0 method classes (pamqp) and the few things
that are not client methods (:class:`Signal`): the protocol header arriving,
the door closing the connection, the transport going away.

Each channel has its own small machine (:class:`ChannelState`,
:func:`channel_transition`): opened once, then every method goes to its
handler until a Channel.Close; a channel the door closed ignores everything
but the client's CloseOk. A method on a channel that is not open, or a second
Channel.Open, is a hard 504 CHANNEL_ERROR.
"""

from __future__ import annotations

import enum
from typing import Any, Union

from pamqp import commands as C

from . import codec
from .errors import AmqpError, method_ids

__all__ = ["ConnState", "Signal", "TRANSITIONS", "transition", "require_open", "LIVE", "ChannelState",
           "channel_transition", "no_channel"]


class ConnState(enum.Enum):
    """Where a connection is; the values are the names the door's errors and logs use."""

    HEADER = "header"  # waiting for the protocol header
    START = "start"  # Connection.Start sent, waiting for StartOk (authentication)
    TUNE = "tune"  # Connection.Tune sent, waiting for TuneOk
    OPEN_WAIT = "open_wait"  # tuned, waiting for Connection.Open (the vhost)
    OPEN = "open"  # channels may be used
    CLOSING = "closing"  # a Connection.Close was sent or received: waiting for CloseOk or the end
    CLOSED = "closed"  # the transport is gone (or being dropped)


class Signal(enum.Enum):
    """Events that are not a client's channel-0 method."""

    PROTOCOL_HEADER = "protocol header"  # the 8 bytes "AMQP\x00\x00\x09\x01"
    SERVER_CLOSE = "server close"  # the door closes the connection (an error, a stop)
    LOST = "transport lost"  # the transport went away, or is dropped (a bad protocol header)


Event = Union[type, Signal]

#: The states before the connection is closing: a Close from either side may come in any of them.
LIVE = (ConnState.HEADER, ConnState.START, ConnState.TUNE, ConnState.OPEN_WAIT, ConnState.OPEN)

_S = ConnState
#: Every allowed (state, event) and the state it leads to. What is not here is refused (503),
#: except in CLOSING, where the connection ignores every method but Close and CloseOk.
TRANSITIONS: dict[tuple[ConnState, Event], ConnState] = {
    (_S.HEADER, Signal.PROTOCOL_HEADER): _S.START,
    (_S.START, C.Connection.StartOk): _S.TUNE,
    (_S.TUNE, C.Connection.TuneOk): _S.OPEN_WAIT,
    (_S.OPEN_WAIT, C.Connection.Open): _S.OPEN,
    (_S.OPEN, C.Connection.UpdateSecret): _S.OPEN,
    # the client closes (at any point of the handshake too)
    **{(s, C.Connection.Close): _S.CLOSING for s in LIVE},
    # a CloseOk for a Close nobody sent: the connection is dropped; Blocked/Unblocked are the
    # server's own notifications, ignored when a client sends them
    **{(s, m): s for s in LIVE for m in (C.Connection.CloseOk, C.Connection.Blocked, C.Connection.Unblocked)},
    **{(s, Signal.SERVER_CLOSE): _S.CLOSING for s in LIVE},
    # closing: the peer's CloseOk (or its own Close, crossing ours) ends it
    (_S.CLOSING, C.Connection.CloseOk): _S.CLOSING,
    (_S.CLOSING, C.Connection.Close): _S.CLOSING,
    **{(s, Signal.LOST): _S.CLOSED for s in ConnState},
}


def transition(state: ConnState, event: Event, method: Any = None) -> ConnState:
    """The state ``event`` leads to from ``state``; a refused one raises 503 COMMAND_INVALID (hard).

    ``method``: the pamqp method that is the event (its name and ids go into the Close).
    """
    nxt = TRANSITIONS.get((state, event))
    if nxt is not None:
        return nxt
    if method is not None:
        raise AmqpError(codec.COMMAND_INVALID, f"unexpected method {method.name} on channel 0 (state {state.value})",
                        *method_ids(method), hard=True)
    name = event.value if isinstance(event, Signal) else getattr(event, "name", str(event))
    raise AmqpError(codec.COMMAND_INVALID, f"unexpected {name} (state {state.value})", hard=True)


def require_open(state: ConnState, method: Any, what: str | None = None) -> None:
    """A method on a channel other than 0 (or a publish) needs an open connection: else 503 (hard).

    ``what``: the method's name in the error (default: pamqp's name of ``method``)."""
    if state is not ConnState.OPEN:
        raise AmqpError(codec.COMMAND_INVALID, f"{what or method.name} before the connection is open",
                        *method_ids(method), hard=True)


class ChannelState(enum.Enum):
    """Where one channel number of a connection is."""

    ABSENT = "absent"  # never opened, or closed and forgotten
    OPEN = "open"
    CLOSING = "closing"  # the door sent Channel.Close: waiting for the client's CloseOk


def no_channel(number: int, method: Any) -> AmqpError:
    """504 CHANNEL_ERROR (hard) for a method on a channel that was not opened."""
    return AmqpError(codec.CHANNEL_ERROR, f"expected 'channel.open' on channel {number}", *method_ids(method),
                     hard=True)


def channel_transition(state: ChannelState, method: Any, number: int) -> ChannelState:
    """The state channel ``number`` is in after ``method``; a refused one raises 504 CHANNEL_ERROR (hard).

    ABSENT: only Channel.Open (-> OPEN). OPEN: a second Channel.Open is refused,
    Channel.Close ends it (-> ABSENT), every other method stays OPEN (its handler
    decides). CLOSING: a second Channel.Open is refused, the client's CloseOk ends
    it (-> ABSENT), anything else stays CLOSING (ignored; a Close is answered).
    """
    t = type(method)
    if state is ChannelState.ABSENT:
        if t is C.Channel.Open:
            return ChannelState.OPEN
        raise no_channel(number, method)
    if t is C.Channel.Open:
        raise AmqpError(codec.CHANNEL_ERROR, f"second 'channel.open' seen on channel {number}", 20, 10, hard=True)
    if state is ChannelState.OPEN:
        return ChannelState.ABSENT if t is C.Channel.Close else ChannelState.OPEN
    return ChannelState.ABSENT if t is C.Channel.CloseOk else ChannelState.CLOSING
