"""Who is calling: the context every MessagingProcessor call carries.

Adapters fill it from their connection (protocol, client id, peer address,
the principal their authentication established); the processor uses it for
authorization, metrics and to stamp messages with the protocol they came by.
A door's own work (its state, deliveries it makes itself) carries ``trusted``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestContext:
    protocol: str
    client_id: str = ""
    remote_address: str = ""
    principal: str | None = None
    namespace: str = ""
    # A door's (or the process's) own work, not a client's: its state, deliveries it makes on
    # its own, metrics. The authorizer lets it through; doors never set it from client input.
    trusted: bool = False


INTERNAL = RequestContext(protocol="internal", client_id="unimq", trusted=True)
