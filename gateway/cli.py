"""The `unimq` command line.

Why argparse flags default to ``None``: a flag the user did not give must not
override the config file, so only given flags reach ``load_settings`` as
overrides; the real defaults live in one place, :class:`UnimqSettings`.

Contract relied on by tests and later issues::

    unimq up --data-dir DIR --host 127.0.0.1 --mqtt-port N --amqp-port N \\
             --http-port N --grpc-port N --namesrv-port N --flush async|sync --config FILE
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Sequence

from core_broker.config import FlushMode, StoreConfig
from core_broker.errors import ConfigurationError
from gateway.settings import LOG_LEVELS, UnimqSettings, load_settings

__all__ = ["build_parser", "main"]

_DEFAULTS = UnimqSettings()
_STORE_DEFAULTS = StoreConfig()


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range 0..65535: {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The parser for every subcommand (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="unimq",
        description="unimq: MQTT, AMQP 0-9-1, HTTP/CloudEvents and RocketMQ gRPC over one commitlog store.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    up = sub.add_parser(
        "up",
        help="run the broker with every door that exists",
        description=(
            "Run unimq: open the store, start every door, print 'unimq: <door> listening on HOST:PORT' "
            "per door and 'unimq: ready' when GET /healthz answers 200. SIGTERM/SIGINT shut down cleanly. "
            "Flags override the config file; a port of 0 picks a free port."
        ),
    )
    up.add_argument("--config", type=Path, metavar="FILE", help="TOML config file (see README, Configuration)")
    up.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help=f"where the store keeps its files (default: {_STORE_DEFAULTS.data_dir})",
    )
    up.add_argument("--host", help=f"address every door binds to (default: {_DEFAULTS.host})")
    for door, attr in (
        ("mqtt", "mqtt_port"),
        ("amqp", "amqp_port"),
        ("http", "http_port"),
        ("grpc", "grpc_port"),
        ("namesrv", "namesrv_port"),
    ):
        up.add_argument(
            f"--{door}-port",
            dest=attr,
            type=_port,
            metavar="N",
            help=f"{door} port, 0 = pick a free one (default: {getattr(_DEFAULTS, attr)})",
        )
    up.add_argument(
        "--flush",
        choices=[m.value for m in FlushMode],
        help=f"async: ack from page cache; sync: ack after fsync, group commit (default: {_STORE_DEFAULTS.flush.value})",
    )
    up.add_argument("--grpc-tls-cert", metavar="PEM", help="serve the gRPC door over TLS with this certificate (chain)")
    up.add_argument("--grpc-tls-key", metavar="PEM", help="private key of --grpc-tls-cert")
    up.add_argument("--mqtt-tls-cert", metavar="PEM",
                    help="also serve MQTT over TLS (port mqtt_tls_port, 8883) with this certificate (chain)")
    up.add_argument("--mqtt-tls-key", metavar="PEM", help="private key of --mqtt-tls-cert")
    up.add_argument("--log-level", choices=LOG_LEVELS, help=f"log level on stderr (default: {_DEFAULTS.log_level})")
    up.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="set any knob, e.g. store.commitlog_segment_size=67108864 or broker.max_delivery_attempts=5 "
                         "(VALUE in TOML syntax; bare words are strings); repeatable, wins over the config file")

    ns = sub.add_parser("nameserver", help="run a nameserver (separated deployment)")
    ns.add_argument("--config", type=Path, metavar="FILE")
    ns.add_argument("--host")
    ns.add_argument("--port", dest="namesrv_port", type=_port, metavar="N", help="default 9876; 0 = free port")
    ns.add_argument("--lease-s", dest="nameserver_lease_s", type=float, metavar="S",
                    help=f"drop a broker not heard from for this long (default {_DEFAULTS.nameserver_lease_s})")
    ns.add_argument("--log-level", choices=LOG_LEVELS)

    br = sub.add_parser("broker", help="run a broker registered with nameservers (separated deployment)")
    br.add_argument("--config", type=Path, metavar="FILE")
    br.add_argument("--data-dir", type=Path, metavar="DIR")
    br.add_argument("--host")
    br.add_argument("--port", dest="broker_port", type=_port, metavar="N", help="broker RPC port; 0 = free port")
    br.add_argument("--namesrv", required=True, metavar="HOST:PORT[,HOST:PORT]")
    br.add_argument("--name", dest="broker_name", metavar="NAME", help="broker name (default broker-a)")
    br.add_argument("--heartbeat-s", dest="heartbeat_s", type=float, metavar="S")
    br.add_argument("--flush", choices=[m.value for m in FlushMode])
    br.add_argument("--log-level", choices=LOG_LEVELS)

    gw = sub.add_parser("gateway", help="run a stateless gateway in front of brokers (separated deployment)")
    gw.add_argument("--config", type=Path, metavar="FILE")
    gw.add_argument("--host")
    gw.add_argument("--namesrv", required=True, metavar="HOST:PORT[,HOST:PORT]")
    gw.add_argument("--rpc-port", dest="rpc_port", type=_port, metavar="N", help="processor RPC port")
    for door, attr in (("mqtt", "mqtt_port"), ("amqp", "amqp_port"), ("http", "http_port"), ("grpc", "grpc_port")):
        gw.add_argument(f"--{door}-port", dest=attr, type=_port, metavar="N")
    gw.add_argument("--log-level", choices=LOG_LEVELS)
    for p in (ns, br, gw):
        p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                       help="set any knob (see `unimq up --help`)")

    from adapters.cloudevents import topic_cli  # `unimq topic ...`: admin over the HTTP door (stdlib only)

    topic_cli.add_parser(sub)
    from spark_ingest import demo  # `unimq demo`: producers for the Spark story (imports clients lazily)

    demo.add_parser(sub)
    return parser


def _parse_sets(items: list[str]) -> dict[str, object]:
    """``--set key=value`` pairs; the value is read as TOML (numbers, booleans, arrays) or a string."""
    import tomllib

    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set takes KEY=VALUE, got {item!r}")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        out[key.strip()] = value
    return out


def _cmd_role(args: argparse.Namespace, role: str) -> int:
    """`unimq nameserver|broker|gateway`: the separated deployment's roles."""
    overrides = {k: v for k, v in vars(args).items() if k not in ("command", "config", "broker_name", "sets")}
    overrides["role"] = role
    if getattr(args, "broker_name", None):
        overrides["broker.broker_name"] = args.broker_name
    try:
        overrides.update(_parse_sets(args.sets))
        settings = load_settings(args.config, overrides)
    except ValueError as exc:
        print(f"unimq: error: {exc}", file=sys.stderr)
        return 2
    return _serve(settings)


def _cmd_up(args: argparse.Namespace) -> int:
    overrides = {
        "data_dir": args.data_dir,
        "host": args.host,
        "mqtt_port": args.mqtt_port,
        "amqp_port": args.amqp_port,
        "http_port": args.http_port,
        "grpc_port": args.grpc_port,
        "namesrv_port": args.namesrv_port,
        "flush": args.flush,
        "log_level": args.log_level,
        "grpc_tls_cert": args.grpc_tls_cert,
        "grpc_tls_key": args.grpc_tls_key,
        "mqtt_tls_cert": args.mqtt_tls_cert,
        "mqtt_tls_key": args.mqtt_tls_key,
    }
    try:
        overrides.update(_parse_sets(args.sets))
        settings = load_settings(args.config, overrides)
    except ValueError as exc:
        print(f"unimq: error: {exc}", file=sys.stderr)
        return 2
    return _serve(settings)


def _serve(settings: UnimqSettings) -> int:
    logging.basicConfig(
        level=settings.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from gateway import server  # late: keeps `unimq --help` fast and free of the store

    try:
        _run_loop(server.run(settings))
    except KeyboardInterrupt:  # Ctrl-C before our handlers were installed
        return 130
    except (OSError, ConfigurationError) as exc:  # a port already in use, an unusable file named by a setting
        print(f"unimq: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _run_loop(coro: object) -> None:
    """Run on uvloop when installed (faster sockets), else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)  # type: ignore[arg-type]
        return
    uvloop.run(coro)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `unimq` console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "up":
        return _cmd_up(args)
    if args.command in ("nameserver", "broker", "gateway"):
        return _cmd_role(args, args.command)
    if args.command == "topic":
        from adapters.cloudevents import topic_cli

        return topic_cli.run(args)
    if args.command == "demo":
        from spark_ingest import demo

        return demo.run(args)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse rejects others


if __name__ == "__main__":
    sys.exit(main())
