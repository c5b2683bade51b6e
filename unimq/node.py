"""One unimq process while it runs: its listeners in start order, its store, its processor.

Why a node object: a role's core (nameserver, broker, processor) and the doors
are started by different modules, but they must be announced the same way,
reported the same way when they cannot listen, and stopped in exactly the
reverse order (so the store, opened first, is shut down last).
"""

from __future__ import annotations

import errno
import sys
from typing import TYPE_CHECKING

from gateway.door import Door, ListenError, ServerState, bind_socket, format_address

if TYPE_CHECKING:
    from core_broker.message_store import MessageStore
    from gateway.processor import MessagingProcessor

    from .settings import UnimqSettings

__all__ = ["Node", "StartupError", "announce"]


def announce(text: str) -> None:
    """Print one ``unimq: ...`` contract line to stdout, flushed at once (tests wait on it)."""
    print(f"unimq: {text}", file=sys.stdout, flush=True)


class StartupError(Exception):
    """A listener could not start; the message names it and its address, for the user."""


class Node:
    """What the process started so far (``started``, stopped in reverse) and what doors share."""

    def __init__(self, settings: UnimqSettings) -> None:
        self.settings = settings
        self.state: ServerState[UnimqSettings] = ServerState(settings=settings)
        self.started: list[Door] = []
        # The store, when this process holds one (merged and broker roles).
        self.store: MessageStore | None = None
        # The processor the doors call, when the role serves doors (merged and gateway roles).
        self.processor: MessagingProcessor | None = None

    async def listen(self, door: Door, label: str, port: int) -> tuple[str, int]:
        """Start ``door`` (asked to listen on ``port`` of the settings' host) and announce it.

        ``label`` names the listener for a user ("MQTT over WebSocket door") in the
        error raised when it cannot listen: a :class:`StartupError`.
        """
        host = self.settings.host
        try:
            addr = await door.start()
        except OSError as exc:
            raise StartupError(f"cannot start the {label}: {_why(exc, host, port)}") from exc
        self.started.append(door)
        self.state.listening[door.name] = addr
        announce(f"{door.name} listening on {format_address(*addr)}")
        return addr


def _why(exc: OSError, host: str, port: int) -> str:
    """What went wrong, said with the address: most often another process holds the port."""
    if isinstance(exc, ListenError):
        return str(exc)
    if exc.errno == errno.EADDRINUSE or (port and _in_use(host, port)):
        return f"{format_address(host, port)} is already in use"
    return f"cannot listen on {format_address(host, port)}: {exc}"


def _in_use(host: str, port: int) -> bool:
    """Whether binding (host, port) fails now because the address is taken.

    For listeners whose library reports a failed bind without an errno (grpcio).
    """
    try:
        bind_socket(host, port).close()
    except ListenError as exc:
        return exc.in_use
    except OSError:
        return False
    return False
