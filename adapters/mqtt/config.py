"""The MQTT door's knobs (``mqtt_*`` settings, README "MQTT door"): one dataclass every part reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .session import SESSION_NEVER_EXPIRES

__all__ = ["MQTTConfig"]


@dataclass
class MQTTConfig:
    """Knobs of the MQTT door (``mqtt_*`` settings; see README)."""

    allow_anonymous: bool = True
    users: dict[str, str] = field(default_factory=dict)
    # A Mosquitto password file (mosquitto_passwd): its users are accepted beside ``users``.
    password_file: str = ""
    # A Mosquitto ACL file (acl.py): with one, clients get only the topic rights it grants.
    acl_file: str = ""
    # Outbound QoS 1/2 window per session: 3.1.1 clients get this; v5 clients the smaller
    # of this and their Receive Maximum.
    max_inflight: int = 256
    # Receive Maximum announced to v5 clients (inbound QoS 1/2 not yet acknowledged).
    receive_maximum: int = 1024
    topic_alias_maximum: int = 64
    # Largest packet accepted (fixed header included); bigger closes the connection (0x95).
    max_packet_size: int = 4 * 1024 * 1024 + 65536
    # 0: accept the client's keepalive; else impose this (v5 Server Keep Alive).
    server_keepalive: int = 0
    # Mosquitto's max_keepalive: a cap, not an override. A client asking for more (or for 0,
    # no keepalive) is held to this (v5: told so as Server Keep Alive); one asking for less
    # keeps its own. 0: no cap.
    max_keepalive: int = 0
    # Upper bound for a v5 session expiry interval (seconds).
    max_session_expiry: int = SESSION_NEVER_EXPIRES
    # Bytes waiting in a client's socket buffer past which QoS 0 messages to it are dropped.
    qos0_drop_buffer: int = 8 * 1024 * 1024
    # How long a CONNECT may take to arrive after the TCP connection opens.
    connect_timeout_s: float = 10.0
    # Bytes of just-stored QoS 1/2 messages kept in memory, over all connected sessions
    # that are behind, so that delivering them needs no read back from the store. Past
    # this, a session's queue is read from the store (pull by offset) as usual.
    mem_queue_bytes: int = 256 * 1024 * 1024
    # Seconds between two rounds of $SYS/broker/... statistics (see sys_topics.py); 0: none.
    sys_interval_s: float = 10.0
    # Several gateways: how long a CONNECT waits for the gateway holding the session online
    # to hand it over (fleet.py) before taking it as last stored.
    takeover_timeout_s: float = 3.0
    # Mosquitto's use_identity_as_username, on TLS connections (gateway.access.certs)
    use_identity_as_username: bool = False

    def connack_properties(self, requested: dict[str, Any], expiry: int, keepalive: int,
                           requested_keepalive: int, assigned: str | None) -> dict[str, Any]:
        """A v5 CONNACK's properties: what this door grants a client that asked for ``requested``."""
        cprops: dict[str, Any] = {}
        if assigned:
            cprops["assigned_client_identifier"] = assigned
        if requested.get("session_expiry_interval", 0) != expiry:
            cprops["session_expiry_interval"] = expiry
        cprops["receive_maximum"] = self.receive_maximum
        cprops["topic_alias_maximum"] = self.topic_alias_maximum
        cprops["maximum_packet_size"] = self.max_packet_size
        cprops["retain_available"] = 1
        cprops["wildcard_subscription_available"] = 1
        cprops["subscription_identifier_available"] = 1
        cprops["shared_subscription_available"] = 1
        if self.server_keepalive or keepalive != requested_keepalive:
            cprops["server_keep_alive"] = keepalive
        return cprops
