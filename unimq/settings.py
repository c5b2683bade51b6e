"""unimq's settings: one dataclass for everything a unimq process can be told.

Why one object: the CLI flags, the TOML config file and the tests all need to
describe the same server. Each door declares its own knobs once, in its own
package, as a dataclass over ``gateway.door.DoorSettings`` (``mqtt_*`` in
``adapters/mqtt/settings.py``, ``amqp_*``, ``http_*``, ``grpc_*`` likewise);
:class:`UnimqSettings` composes them with the process's own knobs. Composed by
inheritance, not nesting, because the knobs' names are flat in the TOML file
and on the command line (``mqtt_ws_port``), and a door reads the same names
from whatever settings object it is handed. The store's and the broker's knobs
live in ``core_broker.config`` (the core imports nothing above it) and are
embedded as the ``[store]`` and ``[broker]`` tables, so one file configures the
whole process.

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

from adapters.amqp.settings import AmqpSettings
from adapters.cloudevents.settings import HttpSettings
from adapters.mqtt.settings import MqttSettings
from core_broker.config import BrokerConfig, StoreConfig
from core_broker.model import MessageType
from gateway.door import check_port
from gateway.grpc.settings import GrpcSettings

from .doors import DOOR_NAMES
from .roles import ROLES

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
class UnimqSettings(HttpSettings, GrpcSettings, MqttSettings, AmqpSettings):
    """Everything one unimq process is configured with (see README, "Configuration").

    The doors' knobs are declared by the doors (the base classes, one per door, each
    checking its own values); what is declared here belongs to the process: its role,
    the nameserver and broker listeners, topics and logging.
    """

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
    # The controller of replicated broker groups (README "Replication and failover: the controller"):
    # `unimq controller`, or `unimq nameserver --controller` (embedded).
    controller: bool = False
    controller_port: int = 9880
    controller_data_dir: str = "unimq-controller"
    controller_raft_addr: str = "127.0.0.1:9881"  # bind address of pysyncobj's port (never 0.0.0.0)
    controller_peers: str = ""  # every node's raft address, comma separated; empty: single node
    controller_secret: str = ""
    controller_lease_ms: int = 2500
    allow_unclean_election: bool = False
    # A replicated broker group (README "Replicated broker groups"): `unimq broker --group G
    # --broker-id ID --controller-addr H:P,...`. Empty: an unreplicated broker.
    group: str = ""
    broker_id: str = ""  # this member's id in its group: stable across restarts
    controller_addr: str = ""  # the controller's client addresses (host:port[,host:port])
    min_insync_replicas: int = 1  # members (master included) that hold a put before it is acked
    replica_lag_max_ms: int = 5000  # a replica behind longer than this leaves the in-sync set
    replica_lag_max_bytes: int = 64 << 20  # ... or further behind than this
    replica_ack_timeout_ms: int = 5000  # a put not acked by enough replicas in time fails (retriable)
    group_heartbeat_ms: int = 500  # how often a member tells the controller its log end
    broker_priority: int = 0  # elections: among equally advanced members the higher wins
    broker_advertise: str = ""  # host:port others reach the broker at, when not its own (NAT, a proxy)
    read_from_replica: bool = False  # a replica serves pulls of the offsets it holds
    async_replicas: str = ""  # member ids that copy the log but never count for acks (DR), comma separated
    # Security (README "Security"): serve clients without credentials even when users exist
    # (they get the permissions granted to "anonymous"), or, with no users, on a non-loopback host.
    allow_anonymous: bool = False
    # How often a gateway looks for changes to users and permissions made elsewhere (seconds).
    auth_refresh_s: float = 0.5
    # After this many failed logins within login_throttle_window_s from one IP address at one door,
    # that address's next login attempts there wait before they are answered (0: never).
    login_throttle_failures: int = 5
    login_throttle_window_s: float = 60.0
    login_throttle_max_delay_s: float = 5.0
    login_throttle_loopback: bool = False  # also slow down loopback addresses (not behind a local proxy)
    # Traffic limits (`unimq quota`): a client kept over its publish rate longer than this (or whose
    # backlog alone would take longer to pay off) is refused with its protocol's quota error.
    quota_refuse_after_s: float = 10.0
    quota_burst_s: float = 1.0  # a publish rate's bucket holds this many seconds' worth
    # Bearer JWTs on the HTTP door (README "JWTs"): the issuers trusted (their `iss`), their public
    # keys (PEM files or JWKS documents) and/or OIDC discovery from the issuers' URLs.
    jwt_issuers: list[str] = field(default_factory=list)
    jwt_key_files: list[str] = field(default_factory=list)
    jwt_oidc_discovery: bool = False
    jwt_audience: str = ""  # a token's aud must name this (empty: not checked)
    jwt_algorithms: list[str] = field(default_factory=lambda: ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                                                                "ES256", "ES384", "ES512", "EdDSA"])
    jwt_user_claim: str = "sub"
    jwt_roles_claim: str = ""  # a claim holding roles (a list, or a space-separated string); empty: none
    jwt_leeway_s: float = 30.0  # clock skew allowed on exp and nbf
    # Create a topic on first send to it (RocketMQ's autoCreateTopicEnable).
    auto_create_topics: bool = True
    # Queues given to an auto-created topic, and to a declared topic that names none.
    default_queue_count: int = 8
    topics: list[TopicDecl] = field(default_factory=list)
    # Message traces (README "Message traces"): the share of messages traced on topics without
    # trace attributes (0: only topics with trace_enabled / trace_sample_rate), and how often
    # buffered trace events are written to the trace topic.
    trace_sample_rate: float = 0.0
    trace_flush_ms: int = 100
    log_level: str = "info"
    # The internal RPC (gateways, brokers, nameservers, replication, the controller's client
    # port; README "Securing the cluster"): a secret every node proves at connection start
    # (challenge-response, never sent), given inline or in a file; empty: no check.
    cluster_secret: str = ""
    cluster_secret_file: str = ""
    # Mutual TLS on the internal RPC (encrypts it too): this node's certificate and key, and
    # the CA every node's certificate must chain to. All three, or none.
    rpc_tls_cert: str = ""
    rpc_tls_key: str = ""
    rpc_tls_ca: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()  # every door's own checks (and the host)
        for name in ("namesrv_port", "broker_port", "rpc_port"):
            check_port(name, getattr(self, name))
        if (
            isinstance(self.default_queue_count, bool)
            or not isinstance(self.default_queue_count, int)
            or self.default_queue_count < 1
        ):
            raise ValueError(f"default_queue_count must be a positive integer, got {self.default_queue_count!r}")
        unknown = [d for d in self.doors if d not in DOOR_NAMES]
        if unknown:
            raise ValueError(f"doors: unknown door(s) {unknown}; known: {', '.join(DOOR_NAMES)}")
        role = ROLES.get(self.role)
        if role is None:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if role.needs_namesrv and not self.namesrv:
            raise ValueError(f"the {self.role} role needs nameserver addresses (namesrv = \"host:port\")")
        if self.group:
            if not self.broker_id or not self.controller_addr:
                raise ValueError("a broker in a group needs broker_id and controller_addr (--broker-id, --controller-addr)")
            if self.min_insync_replicas < 1:
                raise ValueError(f"min_insync_replicas must be at least 1, got {self.min_insync_replicas}")
        if self.jwt_issuers and not (self.jwt_key_files or self.jwt_oidc_discovery):
            raise ValueError("jwt_issuers needs their keys: jwt_key_files and/or jwt_oidc_discovery = true")
        if any(a.startswith("HS") or a == "none" for a in self.jwt_algorithms):
            raise ValueError("jwt_algorithms: only public-key algorithms (RS*, PS*, ES*, EdDSA) are accepted")
        if not 0 < self.quota_refuse_after_s <= 3600 or not 0 < self.quota_burst_s <= 3600:
            raise ValueError("quota_refuse_after_s and quota_burst_s must be between 0 and 3600 seconds")
        if not 0.05 <= self.auth_refresh_s <= 60:
            raise ValueError(f"auth_refresh_s must be between 0.05 and 60 seconds, got {self.auth_refresh_s!r}")
        if self.login_throttle_failures < 0 or self.login_throttle_window_s <= 0 or \
                not 0 <= self.login_throttle_max_delay_s <= 60:
            raise ValueError("login_throttle_failures must be >= 0, login_throttle_window_s > 0 and "
                             "login_throttle_max_delay_s between 0 and 60 seconds")
        if not 0.0 <= float(self.trace_sample_rate) <= 1.0:
            raise ValueError(f"trace_sample_rate must be from 0 to 1, got {self.trace_sample_rate!r}")
        if not 1 <= int(self.trace_flush_ms) <= 60_000:
            raise ValueError(f"trace_flush_ms must be from 1 to 60000, got {self.trace_flush_ms!r}")
        level = str(self.log_level).lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        self.log_level = level
        seen: set[str] = set()
        for topic in self.topics:
            if topic.name in seen:
                raise ValueError(f"topic {topic.name!r} is declared twice")
            seen.add(topic.name)


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
