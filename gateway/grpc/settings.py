"""The gRPC door's knobs (``grpc_*``; README "gRPC door" and "Configuration"), declared once here.

Flat ``<door>_*`` names, because they are the TOML and ``--set`` keys users write;
why each door declares its knobs in its own package: see ``gateway/door.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.door import DoorSettings, check_port, check_tls_pair

__all__ = ["GrpcSettings"]


@dataclass
class GrpcSettings(DoorSettings):
    """The gRPC door's listener and knobs (RocketMQ 5 v2 protocol)."""

    grpc_port: int = 8081
    # TLS: both PEM files given -> the gRPC port serves TLS only; both empty -> plaintext
    # (the official clients' default).
    grpc_tls_cert: str = ""
    grpc_tls_key: str = ""
    # Auth: access key -> secret key. Empty: every caller is accepted. Non-empty: each
    # call's MQv2-HMAC-SHA1 signature must verify, else status UNAUTHORIZED.
    # TOML: grpc_credentials = { "myAccessKey" = "mySecretKey" }
    grpc_credentials: dict[str, str] = field(default_factory=dict)
    # TLS with tls_verify_client = required: a call without a signature (or signed with the empty
    # access key) logs in as its verified client certificate's CN (gateway/grpc/login.py).
    grpc_cert_identity: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_port("grpc_port", self.grpc_port)
        check_tls_pair("grpc", self.grpc_tls_cert, self.grpc_tls_key)
        if not isinstance(self.grpc_credentials, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in self.grpc_credentials.items()
        ):
            raise ValueError("grpc_credentials must map non-empty access keys to secret key strings")
