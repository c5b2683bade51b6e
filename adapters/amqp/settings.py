"""The AMQP 0-9-1 door's knobs (``amqp_*``; README "AMQP door" and "Configuration"), declared once here.

Flat ``<door>_*`` names, because they are the TOML and ``--set`` keys users write;
why each door declares its knobs in its own package: see ``gateway/door.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.door import DoorSettings, check_port, check_tls_pair
from gateway.tls import TlsFiles

__all__ = ["AmqpSettings"]


@dataclass
class AmqpSettings(DoorSettings):
    """The AMQP door's listener and knobs."""

    amqp_port: int = 5672
    # AMQPS: with a certificate (amqp_tls_cert/_key, or the shared tls_cert/_key) a TLS listener
    # on amqp_tls_port (unset: 5671, or a free port when amqp_port is 0) beside the plain one.
    amqp_tls_cert: str = ""
    amqp_tls_key: str = ""
    amqp_tls_port: int | None = None
    # Users: name -> password, checked at PLAIN/AMQPLAIN login; TOML: amqp_users = { guest = "guest" }.
    # Users in amqp_loopback_users may log in from loopback addresses only (RabbitMQ's rule for guest).
    amqp_users: dict[str, str] = field(default_factory=lambda: {"guest": "guest"})
    amqp_loopback_users: list[str] = field(default_factory=lambda: ["guest"])
    # Virtual hosts clients may open (every user may use every vhost).
    amqp_vhosts: list[str] = field(default_factory=lambda: ["/"])
    # Tune: heartbeat seconds proposed (0: off), largest frame, channels per connection.
    amqp_heartbeat: int = 60
    amqp_frame_max: int = 131072
    amqp_channel_max: int = 2047
    # Largest message body accepted (RabbitMQ 3.x's default max_message_size, 128 MiB); a bigger
    # one is refused at its content header (channel closed, 406 PRECONDITION_FAILED), never read.
    amqp_max_message_size: int = 128 * 1024 * 1024
    # A delivered, unacked message is hidden in the store for this long and the lease is
    # renewed while its channel lives; after a crash it is redelivered within this time.
    amqp_lease_ms: int = 60_000
    # SASL mechanisms offered (RabbitMQ's auth_mechanisms): PLAIN, AMQPLAIN, and EXTERNAL (RabbitMQ's
    # rabbitmq_auth_mechanism_ssl): on AMQPS, the CN of the client's verified certificate is the user.
    amqp_auth_mechanisms: list[str] = field(default_factory=lambda: ["PLAIN", "AMQPLAIN"])

    def __post_init__(self) -> None:
        super().__post_init__()
        check_port("amqp_port", self.amqp_port)
        if self.amqp_tls_port is not None:
            check_port("amqp_tls_port", self.amqp_tls_port)
        check_tls_pair("amqp", self.amqp_tls_cert, self.amqp_tls_key)
        if not isinstance(self.amqp_users, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in self.amqp_users.items()
        ):
            raise ValueError(f"amqp_users must map user names to password strings, got {self.amqp_users!r}")
        if not isinstance(self.amqp_auth_mechanisms, list) or not self.amqp_auth_mechanisms or \
                not set(self.amqp_auth_mechanisms) <= {"PLAIN", "AMQPLAIN", "EXTERNAL"}:
            raise ValueError(f"amqp_auth_mechanisms must list some of PLAIN, AMQPLAIN, EXTERNAL, "
                             f"got {self.amqp_auth_mechanisms!r}")
        for name in ("amqp_loopback_users", "amqp_vhosts"):
            v = getattr(self, name)
            if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                raise ValueError(f"{name} must be a list of non-empty strings, got {v!r}")
        for name, lo, hi in (("amqp_heartbeat", 0, 65535), ("amqp_frame_max", 4096, 1 << 24),
                             ("amqp_channel_max", 1, 65535), ("amqp_lease_ms", 1000, 1 << 40),
                             ("amqp_max_message_size", 1, 512 * 1024 * 1024)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"{name} must be an integer in {lo}..{hi}, got {v!r}")

    def amqp_tls_files(self) -> TlsFiles | None:
        """The AMQPS listener's certificate: amqp_tls_cert, else the shared tls_cert; None: no AMQPS."""
        return self.tls_files(self.amqp_tls_cert, self.amqp_tls_key)

    def amqps_listener_port(self) -> int | None:
        """The AMQPS port to bind (0: a free one), None without a certificate."""
        if self.amqp_tls_files() is None:
            return None
        if self.amqp_tls_port is None:
            return 0 if self.amqp_port == 0 else 5671
        return self.amqp_tls_port
