"""The MQTT door's knobs (``mqtt_*``; README "MQTT door" and "Configuration"), declared once here.

Flat ``<door>_*`` names, because they are the TOML and ``--set`` keys users write;
why each door declares its knobs in its own package: see ``gateway/door.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.api import DEFAULT_DOOR_MESSAGE_SIZE
from gateway.door import DoorSettings, check_port, check_tls_pair
from gateway.tls import TlsFiles

from .config import MQTTConfig

__all__ = ["MqttSettings"]


@dataclass
class MqttSettings(DoorSettings):
    """The MQTT door's listeners and knobs."""

    mqtt_port: int = 1883
    # MQTT over WebSocket (subprotocol "mqtt") listens on its own port: 0 picks a free one,
    # -1 turns it off; unset: 8083, or a free port when mqtt_port is 0 (so test servers
    # on free ports never collide on 8083).
    mqtt_ws_port: int | None = None
    # Clients without a user name are accepted unless this is false.
    mqtt_allow_anonymous: bool = True
    # User name -> password accepted at CONNECT ([mqtt_users] table); empty: any user name.
    mqtt_users: dict[str, str] = field(default_factory=dict)
    # A Mosquitto password file (written by mosquitto_passwd; $7$ and $6$ hashes): its users
    # are accepted too. Read at start.
    mqtt_password_file: str = ""
    # A Mosquitto ACL file (topic/user/pattern lines): clients get only the rights it grants.
    mqtt_acl_file: str = ""
    # Outbound QoS 1/2 messages in flight per client (v5: also capped by its Receive Maximum).
    mqtt_max_inflight: int = 256
    # Receive Maximum and Topic Alias Maximum announced to MQTT 5 clients.
    mqtt_receive_maximum: int = 1024
    mqtt_topic_alias_maximum: int = 64
    # Largest MQTT packet accepted; unset: the doors' message limit (4 MiB, or the store's
    # max_message_size if smaller) + 64 KiB.
    mqtt_max_packet_size: int | None = None
    # Impose this keepalive on MQTT 5 clients (Server Keep Alive); 0 accepts theirs.
    mqtt_server_keepalive: int = 0
    # Cap on MQTT clients' keepalive (Mosquitto's max_keepalive): more, or 0, gets the cap
    # (v5: as Server Keep Alive); less keeps its own. 0: no cap.
    mqtt_max_keepalive: int = 0
    # Cap on an MQTT 5 session expiry interval, seconds (4294967295: never expires).
    mqtt_max_session_expiry: int = 4294967295
    # Bytes of just-stored QoS 1/2 messages the MQTT door keeps in memory for sessions that
    # are behind (delivered without a read back from the store); past it they are pulled.
    mqtt_mem_queue_bytes: int = 256 * 1024 * 1024
    # Seconds between two rounds of Mosquitto-style $SYS/broker/... statistics; 0: off.
    mqtt_sys_interval_s: float = 10.0
    # Several gateways sharing sessions: how long a CONNECT waits for the gateway that holds the
    # session online to close it and hand it over, before taking the session as last stored.
    mqtt_takeover_timeout_s: float = 3.0
    # Mosquitto's use_identity_as_username: on the TLS listeners (MQTT over TLS, WSS) the CN of
    # the client's verified certificate is its user name; no password; no certificate, no login.
    mqtt_use_identity_as_username: bool = False
    # MQTT over TLS: both PEM files given -> a TLS listener on mqtt_tls_port (unset: 8883,
    # or a free port when mqtt_port is 0) beside the plain one, sharing its sessions.
    mqtt_tls_cert: str = ""
    mqtt_tls_key: str = ""
    mqtt_tls_port: int | None = None
    # MQTT over secure WebSocket (wss://, subprotocol "mqtt") with the MQTT certificate (or the
    # shared tls_cert), on this port when set (8084 is the usual one; 0 picks a free one).
    # Unset: no WSS listener (as Mosquitto, it is opened only when asked for).
    mqtt_wss_port: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_port("mqtt_port", self.mqtt_port)
        if self.mqtt_ws_port is not None:
            check_port("mqtt_ws_port", self.mqtt_ws_port, off=True)
        if self.mqtt_tls_port is not None:
            check_port("mqtt_tls_port", self.mqtt_tls_port)
        if self.mqtt_wss_port is not None:
            check_port("mqtt_wss_port", self.mqtt_wss_port)
        check_tls_pair("mqtt", self.mqtt_tls_cert, self.mqtt_tls_key)

    def ws_listener_port(self) -> int | None:
        """The MQTT over WebSocket port to bind (0: a free one), None when turned off."""
        if self.mqtt_ws_port is None:
            return 0 if self.mqtt_port == 0 else 8083
        return None if self.mqtt_ws_port < 0 else self.mqtt_ws_port

    def tls_listener_port(self) -> int | None:
        """The MQTT over TLS port to bind (0: a free one), None without a certificate."""
        if self.mqtt_tls_files() is None:
            return None
        if self.mqtt_tls_port is None:
            return 0 if self.mqtt_port == 0 else 8883
        return self.mqtt_tls_port

    def wss_listener_port(self) -> int | None:
        """The MQTT over secure WebSocket port to bind (0: a free one), None when not asked for or
        without a certificate."""
        if self.mqtt_tls_files() is None:
            return None
        return self.mqtt_wss_port

    def mqtt_tls_files(self) -> TlsFiles | None:
        """The MQTT door's certificate: its own (mqtt_tls_cert), else the shared tls_cert."""
        return self.tls_files(self.mqtt_tls_cert, self.mqtt_tls_key)

    def mqtt_config(self) -> MQTTConfig:
        """The broker's configuration from these knobs (the broker's own defaults for the rest)."""
        packet = self.mqtt_max_packet_size
        return MQTTConfig(
            allow_anonymous=self.mqtt_allow_anonymous,
            users=dict(self.mqtt_users),
            password_file=self.mqtt_password_file,
            acl_file=self.mqtt_acl_file,
            max_inflight=self.mqtt_max_inflight,
            receive_maximum=self.mqtt_receive_maximum,
            topic_alias_maximum=self.mqtt_topic_alias_maximum,
            max_packet_size=min(self.store.max_message_size, DEFAULT_DOOR_MESSAGE_SIZE) + 65536 if packet is None else packet,
            server_keepalive=self.mqtt_server_keepalive,
            max_keepalive=self.mqtt_max_keepalive,
            max_session_expiry=self.mqtt_max_session_expiry,
            mem_queue_bytes=self.mqtt_mem_queue_bytes,
            sys_interval_s=self.mqtt_sys_interval_s,
            takeover_timeout_s=self.mqtt_takeover_timeout_s,
            use_identity_as_username=self.mqtt_use_identity_as_username,
        )
