"""What the roles share: argument types, the doors' port flags, the processor's configuration."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.api import ProcessorConfig
    from unimq.settings import UnimqSettings

__all__ = ["add_door_port_flags", "add_tls_flags", "port_arg", "processor_config"]


def port_arg(text: str) -> int:
    """A TCP port flag: 0..65535, 0 picks a free port."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range 0..65535: {value}")
    return value


def port_or_off_arg(text: str) -> int:
    """A port flag of a listener that can be turned off: -1, or 0..65535."""
    if text.strip() == "-1":
        return -1
    return port_arg(text)


#: The protocol doors' listeners: (flag, setting, what listens there, default when not a plain number).
DOOR_PORT_FLAGS = (
    ("--mqtt-port", "mqtt_port", "MQTT", None),
    ("--mqtt-ws-port", "mqtt_ws_port", "MQTT over WebSocket", "8083, or a free one when --mqtt-port is 0; -1 = off"),
    ("--mqtt-tls-port", "mqtt_tls_port", "MQTT over TLS (with --mqtt-tls-cert)",
     "8883, or a free one when --mqtt-port is 0"),
    ("--mqtt-wss-port", "mqtt_wss_port", "MQTT over secure WebSocket (with a certificate; usually 8084)",
     "none: not opened"),
    ("--amqp-port", "amqp_port", "AMQP 0-9-1", None),
    ("--amqp-tls-port", "amqp_tls_port", "AMQPS (with --amqp-tls-cert or --tls-cert)",
     "5671, or a free one when --amqp-port is 0"),
    ("--http-port", "http_port", "HTTP/CloudEvents", None),
    ("--grpc-port", "grpc_port", "RocketMQ 5 gRPC", None),
)


def add_door_port_flags(p: argparse.ArgumentParser) -> None:
    """One ``--<door>-port`` flag per protocol door's listener (``unimq up`` and ``unimq gateway``)."""
    from unimq.settings import UnimqSettings

    defaults = UnimqSettings()
    for flag, dest, what, default in DOOR_PORT_FLAGS:
        p.add_argument(flag, dest=dest, type=port_or_off_arg if dest == "mqtt_ws_port" else port_arg, metavar="N",
                       help=f"{what} port, 0 = pick a free one (default: {default or getattr(defaults, dest)})")
    p.add_argument("--reuse-port", dest="reuse_port", action="store_const", const=True, default=None,
                   help="SO_REUSEPORT on the MQTT, HTTP and gRPC listeners: several gateways share their ports")


def add_tls_flags(p: argparse.ArgumentParser) -> None:
    """The doors' TLS flags (``unimq up`` and ``unimq gateway``; README "TLS")."""
    from gateway.tls import VERIFY_CLIENT

    g = p.add_argument_group("TLS (README: TLS)")
    g.add_argument("--tls-cert", dest="tls_cert", metavar="PEM",
                   help="certificate (chain) for every door without one of its own: AMQPS, HTTPS, MQTT over "
                        "TLS and WSS, gRPC over TLS")
    g.add_argument("--tls-key", dest="tls_key", metavar="PEM", help="private key of --tls-cert")
    g.add_argument("--tls-client-ca", dest="tls_client_ca", metavar="PEM",
                   help="CA bundle client certificates must chain to")
    g.add_argument("--tls-verify-client", dest="tls_verify_client", choices=VERIFY_CLIENT,
                   help="ask clients for a certificate (default: none)")
    for door, what in (("amqp", "also serve AMQPS (on --amqp-tls-port)"), ("http", "serve the HTTP door as HTTPS"),
                       ("grpc", "serve the gRPC door over TLS"),
                       ("mqtt", "also serve MQTT over TLS (--mqtt-tls-port) and WSS (--mqtt-wss-port)")):
        g.add_argument(f"--{door}-tls-cert", dest=f"{door}_tls_cert", metavar="PEM",
                       help=f"{what} with this certificate (chain)")
        g.add_argument(f"--{door}-tls-key", dest=f"{door}_tls_key", metavar="PEM",
                       help=f"private key of --{door}-tls-cert")


def processor_config(settings: UnimqSettings) -> ProcessorConfig:
    """The processor's knobs from the settings (every role that serves doors builds one)."""
    from gateway.api import DEFAULT_DOOR_MESSAGE_SIZE, ProcessorConfig

    store_max = settings.store.max_message_size
    return ProcessorConfig(
        auto_create_topics=settings.auto_create_topics,
        default_queue_count=settings.default_queue_count,
        max_message_size=min(store_max, DEFAULT_DOOR_MESSAGE_SIZE),
        door_message_limits={"amqp": min(store_max, settings.amqp_max_message_size)},
        trace_sample_rate=float(settings.trace_sample_rate),
        trace_flush_ms=int(settings.trace_flush_ms),
    )
