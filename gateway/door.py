"""What every door needs from below: the ``Door`` shape, socket binding, the shared state.

Why here and not beside the process starter: the doors (``adapters/*``,
``gateway/grpc``) are started by the application (``unimq/``), which imports
them; if what they need lived there too, each door would import back into the
module that imports it. So the application depends on the doors, the doors
depend on this module, and this module depends on nothing above ``gateway/``.

- :class:`Door`: a listener in front of the processor, ``start() -> (host, port)``.
- :func:`bind_socket`: bind ourselves, so port 0 yields the real port and a port
  in use is a :class:`ListenError` naming the address, not a library's exit.
- :class:`DoorSettings`: what every door reads besides its own knobs (where to
  bind, the store's and the broker's limits). Each door declares its own knobs
  once, in its own package, as a dataclass deriving from this one
  (``adapters/mqtt/settings.py`` ...); the application's settings compose them.
- :class:`ServerState`: what the doors of one process share (settings, processor,
  lifecycle phase for ``/healthz``, the doors' client tables for the admin API).
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from core_broker.config import BrokerConfig, StoreConfig

from .clients import ClientRegistry
from .tls import ServerTls, TlsFiles, check_verify_client

if TYPE_CHECKING:  # type hints only: the processor API pulls in the core's modules
    from .api import MessagingAPI

__all__ = [
    "Door", "DoorSettings", "ListenError", "ServerState", "bind_socket", "check_port", "check_tls_pair",
    "format_address",
]


class Door(Protocol):
    """A network listener in front of the processor (one per protocol and transport)."""

    name: str

    async def start(self) -> tuple[str, int]:
        """Start listening; return the bound (host, port), the real port when 0 was asked."""
        ...

    async def stop(self) -> None:
        """Stop accepting, close connections; must be safe to call once after start()."""
        ...


class ListenError(OSError):
    """A listener could not bind its address; ``in_use`` when another socket holds it."""

    def __init__(self, host: str, port: int, reason: str, code: int | None = None) -> None:
        super().__init__(code, f"{format_address(host, port)} {reason}")
        self.host, self.port, self.reason = host, port, reason

    @property
    def in_use(self) -> bool:
        return self.errno == errno.EADDRINUSE

    def __str__(self) -> str:
        return self.strerror or ""


def format_address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_socket(host: str, port: int, backlog: int = 1024, reuse_port: bool = False) -> socket.socket:
    """Bind and listen on (host, port) ourselves, so that port 0 yields a known real port.

    Also reports a port already in use as a :class:`ListenError` here, instead of
    letting a server library log it and call sys.exit. With ``reuse_port``
    (``SO_REUSEPORT``, Linux and the BSDs) several processes bind the same port and
    the kernel spreads new connections over them; every one of them must ask for it.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, socktype, proto, _, addr = infos[0]
    sock = socket.socket(family, socktype, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            if not hasattr(socket, "SO_REUSEPORT"):
                raise OSError(errno.EOPNOTSUPP, "SO_REUSEPORT is not available on this system")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(host, port, "is already in use", exc.errno) from None
        raise ListenError(host, port, f"cannot be listened on: {exc.strerror or exc}", exc.errno) from None
    return sock


def check_port(name: str, port: object, *, off: bool = False) -> None:
    """Raise ``ValueError`` naming the knob unless ``port`` is 0..65535 (or -1 with ``off``)."""
    low = -1 if off else 0
    if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= 65535:
        also = ", -1 turns it off" if off else ""
        raise ValueError(f"{name} must be an integer in {low}..65535 (0 picks a free port{also}), got {port!r}")


def check_tls_pair(prefix: str, cert: object, key: object) -> None:
    """``<prefix>_tls_cert`` and ``_key`` (``tls_cert``/``tls_key`` for an empty prefix): both or
    neither, each a readable file."""
    knob = f"{prefix}_tls" if prefix else "tls"
    if bool(cert) != bool(key):
        raise ValueError(f"{knob}_cert and {knob}_key must be given together")
    for name, path in ((f"{knob}_cert", cert), (f"{knob}_key", key)):
        if not isinstance(path, str):
            raise ValueError(f"{name} must be a path string, got {path!r}")
        if path and not Path(path).expanduser().is_file():
            raise ValueError(f"{name}: {path} is not a readable file")


@dataclass
class DoorSettings:
    """What every door reads besides its own knobs (see README, "Configuration")."""

    # Address every door binds to. Loopback by default so a fresh `unimq up` is not
    # reachable from the network by accident; use "0.0.0.0" to serve other hosts.
    host: str = "127.0.0.1"
    # The store's knobs ([store] table; max_message_size bounds every door's messages).
    store: StoreConfig = field(default_factory=StoreConfig)
    # Consumption semantics: retries, dead letters, timers, transactions ([broker] table).
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    # TLS for every door (README "TLS"): a certificate (chain) and key in PEM used by each
    # door that has none of its own (<door>_tls_cert/_key win); empty: plaintext doors.
    tls_cert: str = ""
    tls_key: str = ""
    # Client certificates: the CA bundle they must chain to, and whether the doors ask
    # for one: none | optional (verified when given) | required (no certificate, no TLS).
    tls_client_ca: str = ""
    tls_verify_client: str = "none"
    # SO_REUSEPORT on the MQTT (TCP, WebSocket, TLS), HTTP and gRPC listeners: several gateway
    # processes on one host serve the same ports, the kernel spreading connections over them.
    # Not the AMQP door's: a queue's buffer and cursor live in one process.
    reuse_port: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be a non-empty string, got {self.host!r}")
        check_tls_pair("", self.tls_cert, self.tls_key)
        check_verify_client(self.tls_verify_client, self.tls_client_ca)
        if not isinstance(self.reuse_port, bool):
            raise ValueError(f"reuse_port must be true or false, got {self.reuse_port!r}")

    def tls_files(self, cert: str, key: str) -> TlsFiles | None:
        """A door's TLS files: its own certificate pair, else the shared one; None: plaintext."""
        if not cert:
            cert, key = self.tls_cert, self.tls_key
        if not cert:
            return None
        return TlsFiles(cert, key, self.tls_client_ca, self.tls_verify_client)


S = TypeVar("S", bound=DoorSettings)


@dataclass
class ServerState(Generic[S]):
    """What the doors of one process share: the settings, the processor, the lifecycle phase.

    ``phase`` is "starting", then "ready" once every door listens, then
    "stopping" from the first signal on; ``/healthz`` reports it.
    """

    settings: S
    # The processor every door calls, once the process's role has built it.
    processor: MessagingAPI | None = None
    phase: str = "starting"
    listening: dict[str, tuple[str, int]] = field(default_factory=dict)
    # Every door's TLS contexts, reloaded together on SIGHUP (``unimq.process``).
    tls: list[ServerTls] = field(default_factory=list)
    # Users and permissions (gateway.access.store.IdentityStore), once the process loaded them:
    # doors check logins against it; the processor's authorizer answers from it.
    identities: Any = None
    # Each door's client table, for the admin API (filled by the application: unimq/doors.py).
    clients: ClientRegistry = field(default_factory=ClientRegistry)

    @property
    def ready(self) -> bool:
        return self.phase == "ready"

    def server_tls(self, files: TlsFiles, label: str) -> ServerTls:
        """A door's TLS context from ``files``, registered for reload with the process's others."""
        tls = ServerTls(files, label)
        self.tls.append(tls)
        return tls
