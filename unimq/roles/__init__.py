"""The process roles of unimq: what each kind of process starts before its doors.

One module per role, each defining a :class:`~unimq.roles.role.Role`: its
``unimq`` subcommand and flags, and the coroutine that starts its core (the
nameserver, the broker, the processor) on a :class:`~unimq.node.Node`. A new
role is a new module listed in :data:`ROLES`; the command line, the settings'
check of ``role`` and the process starter take it from here.

Role modules keep heavy imports (the store, grpcio) inside their start
coroutines, so ``unimq --help`` stays fast.
"""

from __future__ import annotations

from . import broker, controller, gateway, merged, nameserver
from .role import Role

__all__ = ["ROLES", "Role"]

#: Every role by its ``role`` setting, in the order ``unimq --help`` lists their commands.
ROLES: dict[str, Role] = {r.name: r for r in (merged.ROLE, nameserver.ROLE, broker.ROLE, gateway.ROLE, controller.ROLE)}
