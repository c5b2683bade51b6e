"""`unimq quota set|list|delete`: traffic limits per user, client id and address, over the admin API.

Why over HTTP: limits are kept with the users and permissions in the brokers'
door state (``gateway.access.store``) and every gateway applies them
(``gateway.access.traffic``); the HTTP door's ``/v1/admin/quotas`` is how any
deployment shape changes them, and this command is its client (as ``unimq
user`` is). ``set`` changes only the figures it is given (a PATCH); ``--none``
puts the given figures back to "no limit".

Exit codes as ``unimq user``: 0 done; 1 unreachable or another refusal; 2 bad
usage; 3 not logged in or not allowed; 4 not found.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
from typing import Any

from .admin_client import EXIT_ERROR, EXIT_USAGE, add_common, call, exit_code, print_error, unreachable

__all__ = ["add_parser", "run"]

#: CLI flag -> the admin API's figure
_FLAGS = {"connections": "connections", "connections_per_s": "connections_per_s", "msgs_per_s": "publish_msgs_per_s",
          "bytes_per_s": "publish_bytes_per_s", "subscriptions": "subscriptions"}


def _subject(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=("user", "client", "address"),
                   help="a limit of a user, of a client id or of a client's IP address")
    p.add_argument("name", help="user: a user name (anonymous: clients without credentials); client: a client id "
                                "(MQTT client id, AMQP connection_name, RocketMQ client id); address: an IP "
                                "address (connections and connection rate only); *: every one, each with a "
                                "budget of its own")


def add_parser(sub: Any) -> None:
    """Register ``quota`` on the CLI's subparsers."""
    shared = argparse.ArgumentParser(add_help=False)
    add_common(shared, argparse.SUPPRESS)
    q = sub.add_parser("quota", help="traffic limits per user or client id on a running unimq (over its HTTP door)",
                       description="Traffic limits of a running unimq, through its HTTP door's admin API "
                                   "(/v1/admin/quotas): connections, connections/s, publish messages/s and bytes/s, "
                                   "subscriptions per connection.")
    add_common(q, None)
    acts = q.add_subparsers(dest="quota_command", metavar="ACTION")
    acts.required = True
    st = acts.add_parser("set", parents=[shared], help="set some limits (the others stay as they are)")
    _subject(st)
    st.add_argument("--connections", type=int, metavar="N", help="open connections at once (per gateway)")
    st.add_argument("--connections-per-s", type=float, metavar="R",
                    help="new connections per second (per gateway); more are refused")
    st.add_argument("--msgs-per-s", type=float, metavar="R", help="messages published per second")
    st.add_argument("--bytes-per-s", type=float, metavar="R", help="message body bytes published per second")
    st.add_argument("--subscriptions", type=int, metavar="N", help="subscriptions (consumers) per connection")
    st.add_argument("--none", action="store_true", help="remove the limits named instead (no limit)")
    acts.add_parser("list", parents=[shared], help="list the limits")
    d = acts.add_parser("delete", parents=[shared], help="remove every limit of a user or client id")
    _subject(d)


def _path(args: argparse.Namespace) -> str:
    return f"/v1/admin/quotas/{args.kind}/{urllib.parse.quote(args.name, safe='')}"


def _call(args: argparse.Namespace) -> tuple[int, Any] | int:
    cmd = args.quota_command
    if cmd == "list":
        return call(args, "GET", "/v1/admin/quotas")
    if cmd == "delete":
        return call(args, "DELETE", _path(args))
    given = {figure: getattr(args, flag) for flag, figure in _FLAGS.items() if getattr(args, flag) is not None}
    if not given:
        print("unimq: error: give at least one of --connections, --connections-per-s, --msgs-per-s, --bytes-per-s, "
              "--subscriptions",
              file=sys.stderr)
        return EXIT_USAGE
    if not args.none:
        return call(args, "PATCH", _path(args), given)
    status, current = call(args, "GET", _path(args))
    if status >= 400:
        return status, current
    left = {f: v for f, v in current.items() if f in _FLAGS.values() and f not in given}
    return call(args, "PUT", _path(args), left) if left else call(args, "DELETE", _path(args))


def run(args: argparse.Namespace) -> int:
    """Carry out one ``unimq quota`` action; returns the exit code."""
    try:
        got = _call(args)
    except (urllib.error.URLError, OSError) as e:
        return unreachable(args, e)
    if isinstance(got, int):
        return got
    status, body = got
    if status >= 400:
        print_error(status, body)
        return exit_code(status)
    if args.json:
        print(json.dumps(body, indent=2) if body is not None else "{}")
    elif args.quota_command == "list":
        for q in body:
            figures = " ".join(f"{k}={v:g}" for k, v in q.items() if k in _FLAGS.values())
            conns = f"\topen_connections={q['open_connections']}" if "open_connections" in q else ""
            print(f"{q['kind']}\t{q['name']}\t{figures}{conns}")
    else:
        print(f"quota {args.quota_command}: done")
    return 0
