"""What a process role is: a ``unimq`` subcommand and the core it starts."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Awaitable, Callable

if TYPE_CHECKING:
    from unimq.node import Node

__all__ = ["Role"]


@dataclass(frozen=True)
class Role:
    """One kind of unimq process.

    ``add_arguments`` adds the subcommand's own flags (each maps to the setting of
    the same ``dest``; ``--config``, ``--set`` and ``--log-level`` are common to
    all); ``start`` starts the role's core on the node (listeners it opens go
    through ``node.listen`` so they are announced and stopped in reverse).
    """

    name: str  # the ``role`` setting
    command: str  # the ``unimq`` subcommand
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    start: Callable[["Node"], Awaitable[None]]
    # Whether the role needs ``namesrv`` (the nameserver addresses) set.
    needs_namesrv: bool = False
    # Whether the role opens the protocol doors (it then sets ``node.processor``).
    serves_doors: bool = False
