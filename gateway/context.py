"""Who is calling: the context every MessagingProcessor call carries.

Adapters fill it from their connection (protocol, client id, peer address,
the principal their authentication established); the processor uses it for
authorization, metrics and to stamp messages with the protocol they came by.
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


INTERNAL = RequestContext(protocol="internal", client_id="unimq")
