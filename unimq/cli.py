"""The `unimq` command line (``python -m unimq`` works the same).

Why argparse flags default to ``None``: a flag the user did not give must not
override the config file, so only given flags reach ``load_settings`` as
overrides; the real defaults live in one place, the settings dataclasses.
Each role's flags are declared by the role (``unimq.roles``), with ``dest``
the setting's name, so a flag is an override of the same name.

Contract relied on by tests and scripts::

    unimq up --data-dir DIR --host 127.0.0.1 --mqtt-port N --amqp-port N \\
             --http-port N --grpc-port N --namesrv-port N --flush async|sync --config FILE
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Coroutine, Sequence

from core_broker.errors import ConfigurationError, TierUnreadableError
from core_broker.remoting import auth as rpc_auth

from .roles import ROLES, Role
from .settings import LOG_LEVELS, UnimqSettings, load_settings

__all__ = ["build_parser", "main"]

# argparse keys that are not settings.
_NOT_SETTINGS = {"command", "config", "sets"}


def build_parser() -> argparse.ArgumentParser:
    """The parser for every subcommand (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="unimq",
        description="unimq: MQTT, AMQP 0-9-1, HTTP/CloudEvents and RocketMQ gRPC over one commitlog store.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    default_level = UnimqSettings().log_level
    for role in ROLES.values():
        p = sub.add_parser(role.command, help=role.help, description=role.description)
        p.add_argument("--config", type=Path, metavar="FILE", help="TOML config file (see README, Configuration)")
        role.add_arguments(p)
        rpc_auth.add_flags(p)
        p.add_argument("--log-level", dest="log_level", choices=LOG_LEVELS,
                       help=f"log level on stderr (default: {default_level})")
        p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                       help="set any knob, e.g. store.commitlog_segment_size=67108864 or "
                            "broker.max_delivery_attempts=5 (VALUE in TOML syntax; bare words are strings); "
                            "repeatable, wins over the config file")

    from adapters.cloudevents import topic_cli  # `unimq topic ...`: admin over the HTTP door (stdlib only)

    topic_cli.add_parser(sub)
    from adapters.cloudevents import access_cli  # `unimq user|acl ...`: the admin API (stdlib only)

    access_cli.add_parsers(sub)
    from adapters.cloudevents import quota_cli  # `unimq quota ...`: traffic limits over the admin API

    quota_cli.add_parser(sub)
    from adapters.cloudevents import admin_cli  # `unimq admin ...`: the console's views over /v1/admin

    admin_cli.add_parser(sub)
    from spark_ingest import demo  # `unimq demo`: producers for the Spark story (imports clients lazily)

    demo.add_parser(sub)
    from nameserver import cluster_cli  # `unimq cluster status`: asks the controller

    from . import cluster_up  # `unimq cluster up`: a replicated cluster of processes on this machine

    cluster_up.add_parser(cluster_cli.add_parser(sub))
    from . import tier_cli  # `unimq tier status`: reads the bucket and the data directory

    tier_cli.add_parser(sub)
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


def _cmd_role(args: argparse.Namespace, role: Role) -> int:
    """`unimq up|nameserver|broker|gateway`: the flags given, then ``--set``, over the config file."""
    overrides = {k: v for k, v in vars(args).items() if k not in _NOT_SETTINGS}
    overrides["role"] = role.name
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
    if settings.log_level != "debug":
        # The websockets library logs "server listening on ..." at INFO for the MQTT over
        # WebSocket door; the process announces every listener once, on stdout.
        logging.getLogger("websockets.server").setLevel(logging.WARNING)
    from . import process  # late: keeps `unimq --help` fast and free of the store
    from .node import StartupError

    try:
        _run_loop(process.run(settings))
    except KeyboardInterrupt:  # Ctrl-C before our handlers were installed
        return 130
    except (StartupError, OSError, ConfigurationError, TierUnreadableError) as exc:  # a port in use, a bad file, no tier
        print(f"unimq: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _run_loop(coro: Coroutine[object, object, None]) -> None:
    """Run on uvloop when installed (faster sockets), else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    uvloop.run(coro)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `unimq` console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    for role in ROLES.values():
        if args.command == role.command:
            return _cmd_role(args, role)
    if args.command == "topic":
        from adapters.cloudevents import topic_cli

        return topic_cli.run(args)
    if args.command in ("user", "acl"):
        from adapters.cloudevents import access_cli

        return access_cli.run(args)
    if args.command == "quota":
        from adapters.cloudevents import quota_cli

        return quota_cli.run(args)
    if args.command == "admin":
        from adapters.cloudevents import admin_cli

        return admin_cli.run(args)
    if args.command == "demo":
        from spark_ingest import demo

        return demo.run(args)
    if args.command == "cluster":
        if args.cluster_command == "up":
            from . import cluster_up

            return cluster_up.run(args)
        from nameserver import cluster_cli

        return cluster_cli.run(args)
    if args.command == "tier":
        from . import tier_cli

        return tier_cli.run(args)
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse rejects others


if __name__ == "__main__":
    sys.exit(main())
