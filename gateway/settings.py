"""unimq's settings: one dataclass for everything `unimq up` can be told.

Why one object: the CLI flags, the TOML config file and the tests all need to
describe the same server, and every door (HTTP, MQTT, AMQP, gRPC, nameserver)
reads its knobs from here. The store's own knobs live in
``core_broker.config.StoreConfig`` (the core must not import the gateway), and
are embedded here as ``store`` so one file configures the whole process.

Precedence, lowest to highest: dataclass defaults, the TOML file, CLI flags.
Unknown keys are errors, not warnings: a misspelt knob that silently does
nothing is worse than a server that refuses to start.

TOML shape::

    host = "127.0.0.1"
    http_port = 8080
    log_level = "info"

    [store]
    data_dir = "./unimq-data"
    flush = "sync"

    [[topics]]
    name = "orders"
    queues = 4
    type = "FIFO"
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import re
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from core_broker.config import BrokerConfig, FlushMode, StoreConfig
from core_broker.model import MessageType

__all__ = [
    "LOG_LEVELS",
    "TopicDecl",
    "TopicType",
    "UnimqSettings",
    "load_settings",
]

#: The message types a topic may be declared with (RocketMQ 5's topic types).
TopicType = MessageType

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

# The store's rule for topic names (core_broker.topic_config): 1-255 chars, no control chars.
_TOPIC_NAME = re.compile(r"[^\x00-\x1f]{1,255}")


@dataclass
class TopicDecl:
    """A topic created (if missing) at start-up, so clients need not rely on auto-creation."""

    name: str
    queues: int = 8
    type: TopicType = TopicType.NORMAL

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _TOPIC_NAME.fullmatch(self.name):
            raise ValueError(
                f"topic name {self.name!r} is invalid: it must be 1 to 255 characters, none of them control characters"
            )
        if isinstance(self.queues, bool) or not isinstance(self.queues, int) or self.queues < 1:
            raise ValueError(f"topic {self.name!r}: queues must be a positive integer, got {self.queues!r}")
        self.type = _coerce_enum(TopicType, self.type, f"topic {self.name!r}: type")


@dataclass
class UnimqSettings:
    """Everything one unimq process is configured with (see README, "Configuration")."""

    # Address every door binds to. Loopback by default so a fresh `unimq up` is not
    # reachable from the network by accident; use "0.0.0.0" to serve other hosts.
    host: str = "127.0.0.1"
    mqtt_port: int = 1883
    amqp_port: int = 5672
    http_port: int = 8080
    grpc_port: int = 8081
    namesrv_port: int = 9876
    # Which protocol doors to start (all by default); an empty list runs the core alone.
    doors: list[str] = field(default_factory=lambda: list(DOOR_NAMES))
    # Deployment role: "merged" (`unimq up`), or for the separated shape "broker",
    # "gateway" and "nameserver" (`unimq broker|gateway|nameserver`).
    role: str = "merged"
    # Nameserver addresses (host:port[,host:port]) brokers register with and gateways ask.
    namesrv: str = ""
    # Broker RPC port; in merged mode 0 (a free port, registered with the embedded nameserver).
    broker_port: int = 0
    # A gateway's processor RPC port (the separated test suite and tools call it).
    rpc_port: int = 8090
    # Broker heartbeat to nameservers, and the lease after which a silent broker is dropped.
    heartbeat_s: float = 30.0
    nameserver_lease_s: float = 120.0
    store: StoreConfig = field(default_factory=StoreConfig)
    # Consumption semantics: retries, dead letters, timers, transactions ([broker] table).
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    # Create a topic on first send to it (RocketMQ's autoCreateTopicEnable).
    auto_create_topics: bool = True
    # Queues given to an auto-created topic, and to a declared topic that names none.
    default_queue_count: int = 8
    topics: list[TopicDecl] = field(default_factory=list)
    log_level: str = "info"
    # MQTT door (adapters/mqtt). MQTT over WebSocket (subprotocol "mqtt") listens on its
    # own port: 0 picks a free one, -1 turns it off; unset: 8083, or a free port when
    # mqtt_port is 0 (so test servers on free ports never collide on 8083).
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
    # Largest MQTT packet accepted; unset: the store's max_message_size + 64 KiB.
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
    # MQTT over TLS: both PEM files given -> a TLS listener on mqtt_tls_port (unset: 8883,
    # or a free port when mqtt_port is 0) beside the plain one, sharing its sessions.
    mqtt_tls_cert: str = ""
    mqtt_tls_key: str = ""
    mqtt_tls_port: int | None = None
    # gRPC door (RocketMQ 5 v2 protocol). TLS: both PEM files given -> the gRPC port
    # serves TLS only; both empty -> plaintext (the official clients' default).
    grpc_tls_cert: str = ""
    grpc_tls_key: str = ""
    # gRPC auth: access key -> secret key. Empty: every caller is accepted. Non-empty:
    # each call's MQv2-HMAC-SHA1 signature must verify, else status UNAUTHORIZED.
    # TOML: grpc_credentials = { "myAccessKey" = "mySecretKey" }
    grpc_credentials: dict[str, str] = field(default_factory=dict)
    # HTTP door: largest request body accepted (413 beyond it); a single message is
    # further bounded by [store] max_message_size, a batch by its event count (1024).
    http_max_body_bytes: int = 16 * 1024 * 1024
    # HTTP door push subscriptions: hosts a sink URL may name (exact host names or
    # addresses, "*" for any). Empty list = any host. Guards against sinks that point
    # the gateway at internal services (SSRF).
    http_push_allowed_hosts: list[str] = field(default_factory=list)
    # HTTP door: store each CloudEvent's id as its message key, so GET
    # /v1/topics/{topic}/events?id= (and query by key) finds it. Off by default: it
    # costs a third or more of the server CPU of batched ingest (see README, HTTP section).
    http_index_event_ids: bool = False
    # AMQP 0-9-1 door (adapters/amqp). Users: name -> password, checked at PLAIN/AMQPLAIN
    # login; TOML: amqp_users = { guest = "guest" }. Users in amqp_loopback_users may log
    # in from loopback addresses only (RabbitMQ's rule for guest).
    amqp_users: dict[str, str] = field(default_factory=lambda: {"guest": "guest"})
    amqp_loopback_users: list[str] = field(default_factory=lambda: ["guest"])
    # Virtual hosts clients may open (every user may use every vhost).
    amqp_vhosts: list[str] = field(default_factory=lambda: ["/"])
    # Tune: heartbeat seconds proposed (0: off), largest frame, channels per connection.
    amqp_heartbeat: int = 60
    amqp_frame_max: int = 131072
    amqp_channel_max: int = 2047
    # A delivered, unacked message is hidden in the store for this long and the lease is
    # renewed while its channel lives; after a crash it is redelivered within this time.
    amqp_lease_ms: int = 60_000

    def __post_init__(self) -> None:
        for name in PORT_FIELDS:
            port = getattr(self, name)
            if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
                raise ValueError(f"{name} must be an integer in 0..65535 (0 picks a free port), got {port!r}")
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be a non-empty string, got {self.host!r}")
        if (
            isinstance(self.default_queue_count, bool)
            or not isinstance(self.default_queue_count, int)
            or self.default_queue_count < 1
        ):
            raise ValueError(f"default_queue_count must be a positive integer, got {self.default_queue_count!r}")
        unknown = [d for d in self.doors if d not in DOOR_NAMES]
        if unknown:
            raise ValueError(f"doors: unknown door(s) {unknown}; known: {', '.join(DOOR_NAMES)}")
        if self.role not in ("merged", "broker", "gateway", "nameserver"):
            raise ValueError(f"role must be merged, broker, gateway or nameserver, got {self.role!r}")
        if self.role in ("broker", "gateway") and not self.namesrv:
            raise ValueError(f"the {self.role} role needs nameserver addresses (namesrv = \"host:port\")")
        if (
            isinstance(self.http_max_body_bytes, bool)
            or not isinstance(self.http_max_body_bytes, int)
            or self.http_max_body_bytes < 1024
        ):
            raise ValueError(f"http_max_body_bytes must be an integer >= 1024, got {self.http_max_body_bytes!r}")
        if not isinstance(self.http_push_allowed_hosts, list) or not all(
            isinstance(h, str) and h for h in self.http_push_allowed_hosts
        ):
            raise ValueError(
                f"http_push_allowed_hosts must be a list of host names, got {self.http_push_allowed_hosts!r}"
            )
        if not isinstance(self.amqp_users, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in self.amqp_users.items()
        ):
            raise ValueError(f"amqp_users must map user names to password strings, got {self.amqp_users!r}")
        for name in ("amqp_loopback_users", "amqp_vhosts"):
            v = getattr(self, name)
            if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                raise ValueError(f"{name} must be a list of non-empty strings, got {v!r}")
        for name, lo, hi in (("amqp_heartbeat", 0, 65535), ("amqp_frame_max", 4096, 1 << 24),
                             ("amqp_channel_max", 1, 65535), ("amqp_lease_ms", 1000, 1 << 40)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"{name} must be an integer in {lo}..{hi}, got {v!r}")
        level = str(self.log_level).lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        self.log_level = level
        for door in ("grpc", "mqtt"):
            cert, key = f"{door}_tls_cert", f"{door}_tls_key"
            if bool(getattr(self, cert)) != bool(getattr(self, key)):
                raise ValueError(f"{cert} and {key} must be given together")
            for name in (cert, key):
                path = getattr(self, name)
                if not isinstance(path, str):
                    raise ValueError(f"{name} must be a path string, got {path!r}")
                if path and not Path(path).expanduser().is_file():
                    raise ValueError(f"{name}: {path} is not a readable file")
        if not isinstance(self.grpc_credentials, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in self.grpc_credentials.items()
        ):
            raise ValueError("grpc_credentials must map non-empty access keys to secret key strings")
        seen: set[str] = set()
        for topic in self.topics:
            if topic.name in seen:
                raise ValueError(f"topic {topic.name!r} is declared twice")
            seen.add(topic.name)


#: The protocol doors `doors` may name.
DOOR_NAMES = ("http", "grpc", "mqtt", "amqp")

#: The settings that are TCP ports, one per door.
PORT_FIELDS = ("mqtt_port", "amqp_port", "http_port", "grpc_port", "namesrv_port", "broker_port", "rpc_port")

# Settings that are plain scalars (everything but the [store] table and [[topics]]).
_SETTINGS_HINTS = typing.get_type_hints(UnimqSettings)
_STORE_HINTS = typing.get_type_hints(StoreConfig)
_BROKER_HINTS = typing.get_type_hints(BrokerConfig)
_BROKER_FIELDS = {f.name for f in dataclasses.fields(BrokerConfig)}
_SCALAR_SETTINGS = {f.name for f in dataclasses.fields(UnimqSettings)} - {"store", "topics", "broker"}
_STORE_FIELDS = {f.name for f in dataclasses.fields(StoreConfig)}
_TOPIC_FIELDS = {f.name for f in dataclasses.fields(TopicDecl)}


def load_settings(config_file: Path | None = None, overrides: Mapping[str, Any] | None = None) -> UnimqSettings:
    """Build the settings from defaults, then a TOML file, then ``overrides`` (CLI flags).

    ``overrides`` maps a setting name (``http_port``) or a store field name
    (``data_dir``, ``flush``; ``store.<field>`` also works) to a value; ``None``
    values are skipped so that an argparse flag left unset does not hide the
    file's value. Raises ``ValueError`` naming the offending key for unknown
    keys and ill-typed values, and for a file that is not valid TOML.
    """
    source = str(config_file) if config_file is not None else "settings"
    raw: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file).expanduser()
        try:
            with path.open("rb") as fh:
                raw = tomllib.load(fh)
        except FileNotFoundError:
            raise ValueError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"config file {path} is not valid TOML: {exc}") from None

    top: dict[str, Any] = {}
    store: dict[str, Any] = {}
    store_raw: Any = raw.pop("store", None)
    if store_raw is not None:
        if not isinstance(store_raw, dict):
            raise ValueError(f"{source}: 'store' must be a table ([store])")
        for key, value in store_raw.items():
            store[_check_key(key, _STORE_FIELDS, f"{source}: [store]")] = value
    broker: dict[str, Any] = {}
    broker_raw: Any = raw.pop("broker", None)
    if broker_raw is not None:
        if not isinstance(broker_raw, dict):
            raise ValueError(f"{source}: 'broker' must be a table ([broker])")
        for key, value in broker_raw.items():
            broker[_check_key(key, _BROKER_FIELDS, f"{source}: [broker]")] = value
    topics_raw: Any = raw.pop("topics", [])
    if not isinstance(topics_raw, list) or not all(isinstance(t, dict) for t in topics_raw):
        raise ValueError(f"{source}: 'topics' must be an array of tables ([[topics]])")
    for key, value in raw.items():
        if key not in _SCALAR_SETTINGS:
            hint = " (it belongs in the [store] table)" if key in _STORE_FIELDS else None
            raise ValueError(_unknown(key, _SCALAR_SETTINGS, f"{source}: top level", hint))
        top[key] = value

    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key.startswith("broker."):
            broker[_check_key(key.removeprefix("broker."), _BROKER_FIELDS, "override broker")] = value
            continue
        name = key.removeprefix("store.")
        if key.startswith("store.") or (name not in _SCALAR_SETTINGS and name in _STORE_FIELDS):
            store[_check_key(name, _STORE_FIELDS, "override store")] = value
        elif name in _SCALAR_SETTINGS:
            top[name] = value
        else:
            raise ValueError(_unknown(key, _SCALAR_SETTINGS | _STORE_FIELDS, "override"))

    store_kwargs = {k: _coerce(_STORE_HINTS[k], v, f"store.{k}") for k, v in store.items()}
    top_kwargs = {k: _coerce(_SETTINGS_HINTS[k], v, k) for k, v in top.items()}
    default_queues = top_kwargs.get("default_queue_count", UnimqSettings.default_queue_count)

    topics: list[TopicDecl] = []
    for i, table in enumerate(topics_raw):
        where = f"{source}: topics[{i}]"
        for key in table:
            _check_key(key, _TOPIC_FIELDS, where)
        if "name" not in table:
            raise ValueError(f"{where}: a topic needs a 'name'")
        try:
            topics.append(
                TopicDecl(
                    name=table["name"],
                    queues=table.get("queues", default_queues),
                    type=table.get("type", TopicType.NORMAL),
                )
            )
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None

    try:
        store_config = StoreConfig(**store_kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: [store]: {exc}") from None
    try:
        broker_config = BrokerConfig(
            **{k: _coerce(_BROKER_HINTS[k], v, f"broker.{k}") for k, v in broker.items()}
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: [broker]: {exc}") from None
    try:
        return UnimqSettings(store=store_config, broker=broker_config, topics=topics, **top_kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: {exc}") from None


def _check_key(key: str, allowed: set[str], where: str) -> str:
    if key not in allowed:
        raise ValueError(_unknown(key, allowed, where))
    return key


def _unknown(key: str, allowed: set[str], where: str, hint: str | None = None) -> str:
    if hint is None:
        close = difflib.get_close_matches(key, sorted(allowed), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{where}: unknown key {key!r}{hint}; known keys: {', '.join(sorted(allowed))}"


def _coerce(hint: Any, value: Any, name: str) -> Any:
    """Check a TOML/CLI value against a dataclass field's type, converting only where lossless.

    Why by hand: TOML already gives typed values, so the only conversions
    needed are str -> Path/enum and int -> float; everything else is a type
    error reported with the knob's name rather than a confusing failure later.
    """
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _coerce_enum(hint, value, name)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0", "on", "off"):
            return value.lower() in ("true", "yes", "1", "on")
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ValueError(f"{name} must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"{name} must be a string, got {value!r}")
    if hint is Path:
        if isinstance(value, (str, Path)) and str(value):
            return Path(value).expanduser()
        raise ValueError(f"{name} must be a path string, got {value!r}")
    return value


def _coerce_enum(enum_type: type[enum.Enum], value: Any, name: str) -> Any:
    if isinstance(value, enum_type):
        return value
    if isinstance(value, str):
        for member in enum_type:
            if value.lower() in (str(member.value).lower(), member.name.lower()):
                return member
    choices = "|".join(str(m.value) for m in enum_type)
    raise ValueError(f"{name} must be one of {choices}, got {value!r}")
