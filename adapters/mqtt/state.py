"""The MQTT connection's protocol state, sans-io: an explicit transition table (as h11's ``_state.py``).

Why a table: which packets are legal when is the protocol's rule, not something
to re-derive from flags scattered over the connection. The states:

- ``AWAITING_CONNECT``: the transport is open, no CONNECT handled yet. Only
  CONNECT is legal (MQTT-3.1.0-1); the decoder also refuses anything else first.
- ``CONNECTED``: CONNACK 0 sent. Every client packet but CONNECT is legal
  (a second CONNECT is a protocol error, MQTT-3.1.0-2). AUTH is illegal here:
  the door offers no enhanced authentication.
- ``DISCONNECTING``: DISCONNECT received, or the server closes (a refused
  CONNECT, a protocol error, a takeover, shut-down). Nothing is handled any
  more; packets still arriving are ignored.
- ``CLOSED``: the transport is gone.

Events are the client packet types (``codec.CONNECT`` ...) and the server's own
moves (:data:`ACCEPT`, :data:`CLOSE`, :data:`LOST`). A packet not in the table
for the current state raises :class:`MQTTProtocolError` with reason 0x82; a
server move not in the table is a bug (``RuntimeError``). Nothing here touches
a socket or the event loop.
"""

from __future__ import annotations

import enum

from . import codec as C
from .codec import MQTTProtocolError

__all__ = ["State", "ConnectionState", "ACCEPT", "CLOSE", "LOST", "TRANSITIONS", "IGNORED"]


class State(enum.Enum):
    AWAITING_CONNECT = "awaiting CONNECT"
    CONNECTED = "connected"
    DISCONNECTING = "disconnecting"
    CLOSED = "closed"

    # Identity hash (members are singletons, compared by identity): Enum's own hashes the name
    # in Python, and every packet's (state, event) lookup in TRANSITIONS pays it.
    __hash__ = object.__hash__


# the server's own moves
ACCEPT = "accept"  # CONNACK 0 sent: the session is attached
CLOSE = "close"  # the server ends the connection (refusal, error, takeover, shut-down)
LOST = "lost"  # the transport is gone

_AWAIT, _CONN, _DISC, _CLOSED = State.AWAITING_CONNECT, State.CONNECTED, State.DISCONNECTING, State.CLOSED

# packets a connected client may send that leave the state as it is
_SESSION_PACKETS = (C.PUBLISH, C.PUBACK, C.PUBREC, C.PUBREL, C.PUBCOMP, C.SUBSCRIBE, C.UNSUBSCRIBE, C.PINGREQ)

#: (state, event) -> next state. Anything absent is illegal.
TRANSITIONS: dict[tuple[State, object], State] = {
    (_AWAIT, C.CONNECT): _AWAIT,  # handled; ACCEPT or CLOSE follows
    (_AWAIT, ACCEPT): _CONN,
    (_AWAIT, CLOSE): _DISC,
    **{(_CONN, t): _CONN for t in _SESSION_PACKETS},
    (_CONN, C.DISCONNECT): _DISC,
    (_CONN, CLOSE): _DISC,
    (_DISC, CLOSE): _DISC,
    **{(s, LOST): _CLOSED for s in State},
}
#: States in which arriving packets are dropped unhandled (the connection is going away).
IGNORED = frozenset({_DISC, _CLOSED})

_NAMES = {C.CONNECT: "CONNECT", C.PUBLISH: "PUBLISH", C.PUBACK: "PUBACK", C.PUBREC: "PUBREC", C.PUBREL: "PUBREL",
          C.PUBCOMP: "PUBCOMP", C.SUBSCRIBE: "SUBSCRIBE", C.UNSUBSCRIBE: "UNSUBSCRIBE", C.PINGREQ: "PINGREQ",
          C.DISCONNECT: "DISCONNECT", C.AUTH: "AUTH"}


class ConnectionState:
    """One connection's protocol state."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = State.AWAITING_CONNECT

    def legal(self, packet_type: int) -> bool:
        """May a packet of this type be handled now? (False also in :data:`IGNORED` states.)"""
        return (self.state, packet_type) in TRANSITIONS

    def receive(self, packet_type: int) -> State:
        """A client packet is about to be handled: move on, or raise for an illegal one."""
        nxt = TRANSITIONS.get((self.state, packet_type))
        if nxt is None:
            name = _NAMES.get(packet_type, str(packet_type))
            if packet_type == C.AUTH:
                raise MQTTProtocolError(C.RC_PROTOCOL_ERROR, "AUTH without enhanced authentication")
            raise MQTTProtocolError(C.RC_PROTOCOL_ERROR, f"{name} is not allowed while {self.state.value}")
        self.state = nxt
        return nxt

    def move(self, event: str) -> State:
        """A server move (:data:`ACCEPT`, :data:`CLOSE`, :data:`LOST`)."""
        nxt = TRANSITIONS.get((self.state, event))
        if nxt is None:
            if event == CLOSE and self.state is State.CLOSED:
                return self.state  # closing what is already gone is harmless
            raise RuntimeError(f"MQTT connection: {event} while {self.state.value}")
        self.state = nxt
        return nxt
