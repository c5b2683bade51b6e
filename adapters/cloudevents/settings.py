"""The HTTP/CloudEvents door's knobs (``http_*``; README "HTTP door" and "Configuration"), declared once here.

Flat ``<door>_*`` names, because they are the TOML and ``--set`` keys users write;
why each door declares its knobs in its own package: see ``gateway/door.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.door import DoorSettings, check_port, check_tls_pair

__all__ = ["HttpSettings"]


@dataclass
class HttpSettings(DoorSettings):
    """The HTTP door's listener and knobs."""

    http_port: int = 8080
    # HTTPS: with a certificate (http_tls_cert/_key, or the shared tls_cert/_key) the HTTP port
    # serves HTTPS only.
    http_tls_cert: str = ""
    http_tls_key: str = ""
    # Largest request body accepted (413 beyond it); a single message is further bounded
    # by [store] max_message_size, a batch by its event count (1024).
    http_max_body_bytes: int = 16 * 1024 * 1024
    # Push subscriptions: hosts a sink URL may name (exact host names or addresses, "*" for
    # any). Empty list = any host. Guards against sinks that point the gateway at internal
    # services (SSRF).
    http_push_allowed_hosts: list[str] = field(default_factory=list)
    # Store each CloudEvent's id as its message key, so GET /v1/topics/{topic}/events?id=
    # (and query by key) finds it. Off by default: it costs a third or more of the server
    # CPU of batched ingest (see README, HTTP section).
    http_index_event_ids: bool = False
    # The controller of replicated broker groups (host:port[,host:port]) that the admin API's
    # cluster page asks for each group's master and in-sync set; empty: not asked.
    http_admin_controller: str = ""
    # /metrics names at most this many topics (the busiest) in per-topic series; the rest are
    # summed as topic="other" (bounded label cardinality).
    http_metrics_max_topics: int = 100
    # HTTPS: a request without an Authorization header from a connection whose client certificate
    # was verified (tls_verify_client optional/required) is that certificate's CN's (a user's).
    http_cert_identity: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_port("http_port", self.http_port)
        check_tls_pair("http", self.http_tls_cert, self.http_tls_key)
        if (
            isinstance(self.http_max_body_bytes, bool)
            or not isinstance(self.http_max_body_bytes, int)
            or self.http_max_body_bytes < 1024
        ):
            raise ValueError(f"http_max_body_bytes must be an integer >= 1024, got {self.http_max_body_bytes!r}")
        if isinstance(self.http_metrics_max_topics, bool) or not isinstance(self.http_metrics_max_topics, int) \
                or self.http_metrics_max_topics < 1:
            raise ValueError(f"http_metrics_max_topics must be an integer >= 1, got {self.http_metrics_max_topics!r}")
        if not isinstance(self.http_admin_controller, str):
            raise ValueError(f"http_admin_controller must be a string host:port[,host:port], got {self.http_admin_controller!r}")
        if not isinstance(self.http_push_allowed_hosts, list) or not all(
            isinstance(h, str) and h for h in self.http_push_allowed_hosts
        ):
            raise ValueError(
                f"http_push_allowed_hosts must be a list of host names, got {self.http_push_allowed_hosts!r}"
            )
