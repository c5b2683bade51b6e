"""Authorization hook of the processor.

Doors authenticate (MQTT/AMQP passwords, the gRPC HMAC signature) and put the
principal in the request context; the processor asks an :class:`Authorizer`
whether that principal may do the action on the resource. The default allows
everything, which is what an out-of-the-box broker does.
"""

from __future__ import annotations

from typing import Protocol

from core_broker.errors import UnimqError

from .context import RequestContext


class ForbiddenError(UnimqError):
    code = "FORBIDDEN"


class UnauthorizedError(UnimqError):
    code = "UNAUTHORIZED"


class Authorizer(Protocol):
    def check(self, ctx: RequestContext, action: str, resource: str) -> None:
        """Raise ForbiddenError when ``ctx`` may not do ``action`` (pub, sub, admin) on ``resource``."""


class AllowAll:
    def check(self, ctx: RequestContext, action: str, resource: str) -> None:
        return None
