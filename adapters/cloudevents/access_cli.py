"""`unimq user add|passwd|delete|list|key|import` and `unimq acl grant|revoke|list`: the admin API from a shell.

Why over HTTP: users and permissions live in the brokers' door state, owned by
the running processes; the HTTP door's admin API (``/v1/admin``) is how every
deployment shape changes them, and these commands are its client (as ``unimq
topic`` is for topics). New passwords are read from ``--password-stdin`` or a
prompt, never from a flag, so they stay out of ``ps`` and shell history.

Exit codes: 0 done; 1 the server could not be reached or refused for another
reason; 2 bad usage; 3 not logged in or not allowed (401/403); 4 not found;
5 already exists.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import urllib.error
import urllib.parse
from pathlib import Path
from typing import Any

from .admin_client import EXIT_ERROR, EXIT_USAGE, add_common, call, exit_code, print_error, unreachable

__all__ = ["add_parsers", "run"]


def add_parsers(sub: Any) -> None:
    """Register ``user`` and ``acl`` on the CLI's subparsers."""
    shared = argparse.ArgumentParser(add_help=False)
    add_common(shared, argparse.SUPPRESS)

    user = sub.add_parser("user", help="add, change, delete or list users on a running unimq (over its HTTP door)",
                          description="Users of a running unimq, through its HTTP door's admin API (/v1/admin/users).")
    add_common(user, None)
    acts = user.add_subparsers(dest="user_command", metavar="ACTION")
    acts.required = True
    add = acts.add_parser("add", parents=[shared], help="add a user (password from a prompt or --password-stdin)")
    add.add_argument("name")
    add.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    add.add_argument("--no-password", action="store_true", help="no password login (API keys only)")
    add.add_argument("--role", dest="roles", action="append", default=[], help="a role of the user (repeatable)")
    add.add_argument("--admin", action="store_true", help="grant admin on admin * (a superuser: may do everything)")
    pw = acts.add_parser("passwd", parents=[shared], help="change a user's password")
    pw.add_argument("name")
    pw.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    delete = acts.add_parser("delete", parents=[shared], help="delete a user and the permissions granted to them")
    delete.add_argument("name")
    acts.add_parser("list", parents=[shared], help="list users")
    key = acts.add_parser("key", parents=[shared], help="create (printed once) or delete an API key of a user")
    key.add_argument("name")
    key.add_argument("--delete", metavar="KEY_ID", help="delete this key instead of creating one")
    ak = acts.add_parser("access-key", parents=[shared],
                         help="create (printed once) or delete a RocketMQ access key pair (the gRPC door's signature)")
    ak.add_argument("name")
    ak.add_argument("--delete", metavar="ACCESS_KEY", help="delete this access key instead of creating one")
    imp = acts.add_parser("import", parents=[shared],
                          help="import users and permissions from Mosquitto files or a RabbitMQ definitions export")
    imp.add_argument("--mosquitto-passwords", type=Path, metavar="FILE", help="a mosquitto_passwd file")
    imp.add_argument("--mosquitto-acl", type=Path, metavar="FILE", help="a Mosquitto ACL file")
    imp.add_argument("--rabbitmq-definitions", type=Path, metavar="FILE", help="rabbitmqctl export_definitions JSON")
    imp.add_argument("--replace", action="store_true", help="overwrite users that exist already")

    acl = sub.add_parser("acl", help="grant, revoke or list permissions on a running unimq (over its HTTP door)",
                         description="Permissions of a running unimq, through its HTTP door's admin API (/v1/admin/acl). "
                                     "SUBJECT is a user name, role:NAME, or anonymous.")
    add_common(acl, None)
    acts = acl.add_subparsers(dest="acl_command", metavar="ACTION")
    acts.required = True
    for name, what in (("grant", "grant ACTIONS on RESOURCE names matching PATTERN"),
                       ("revoke", "take ACTIONS (default: all) away again")):
        p = acts.add_parser(name, parents=[shared], help=what)
        p.add_argument("subject")
        p.add_argument("resource", choices=("topic", "group", "vhost", "admin"))
        p.add_argument("pattern", help="topic: MQTT filter (+, #); group and admin: shell pattern; vhost: its name")
        p.add_argument("actions", nargs="?", default="" if name == "revoke" else None,
                       help="comma separated: publish, subscribe (consume), create, delete, admin, all")
        if name == "grant":
            for rx in ("configure", "write", "read"):
                p.add_argument(f"--{rx}", default="", metavar="REGEX", help=f"vhost: RabbitMQ's {rx} expression")
    lst = acts.add_parser("list", parents=[shared], help="list permissions")
    lst.add_argument("subject", nargs="?")


def _new_password(args: argparse.Namespace) -> str | None:
    if getattr(args, "no_password", False):
        return ""
    if args.password_stdin:
        line = sys.stdin.readline().rstrip("\r\n")
        return line or None
    if not sys.stdin.isatty():
        return None
    first = getpass.getpass("new password: ")
    return first if first and getpass.getpass("again: ") == first else None


def _user_call(args: argparse.Namespace) -> tuple[int, Any] | int:
    cmd, name = args.user_command, getattr(args, "name", "")
    path = "/v1/admin/users/" + urllib.parse.quote(name, safe="") if name else "/v1/admin/users"
    if cmd in ("add", "passwd"):
        pw = _new_password(args)
        if pw is None:
            print("unimq: error: no password given (use --password-stdin, a terminal prompt, or --no-password)",
                  file=sys.stderr)
            return EXIT_USAGE
        if cmd == "add":
            return call(args, "POST", "/v1/admin/users",
                        {"name": name, "password": pw, "roles": args.roles, "admin": args.admin})
        return call(args, "PUT", path + "/password", {"password": pw})
    if cmd == "delete":
        return call(args, "DELETE", path)
    if cmd == "list":
        return call(args, "GET", "/v1/admin/users")
    if cmd in ("key", "access-key"):
        sub = "/keys/" if cmd == "key" else "/access-keys/"
        if args.delete:
            return call(args, "DELETE", path + sub + urllib.parse.quote(args.delete, safe=""))
        return call(args, "POST", path + sub.rstrip("/"))
    # import
    if args.rabbitmq_definitions:
        try:
            defs = json.loads(args.rabbitmq_definitions.read_text())
        except (OSError, ValueError) as e:
            print(f"unimq: error: cannot read {args.rabbitmq_definitions}: {e}", file=sys.stderr)
            return EXIT_USAGE
        return call(args, "POST", "/v1/admin/import/rabbitmq" + ("?replace=true" if args.replace else ""), defs)
    if not args.mosquitto_passwords and not args.mosquitto_acl:
        print("unimq: error: give --mosquitto-passwords/--mosquitto-acl or --rabbitmq-definitions", file=sys.stderr)
        return EXIT_USAGE
    try:
        body = {"password_file": args.mosquitto_passwords.read_text() if args.mosquitto_passwords else "",
                "acl_file": args.mosquitto_acl.read_text() if args.mosquitto_acl else ""}
    except OSError as e:
        print(f"unimq: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return call(args, "POST", "/v1/admin/import/mosquitto" + ("?replace=true" if args.replace else ""), body)


def _acl_call(args: argparse.Namespace) -> tuple[int, Any]:
    cmd = args.acl_command
    if cmd == "list":
        q = "?subject=" + urllib.parse.quote(args.subject, safe="") if args.subject else ""
        return call(args, "GET", "/v1/admin/acl" + q)
    body: dict[str, Any] = {"subject": args.subject, "resource": args.resource, "pattern": args.pattern}
    if cmd == "grant":
        if args.resource == "vhost":
            body.update(configure=args.configure, write=args.write, read=args.read)
        else:
            body["actions"] = args.actions or ""
        return call(args, "POST", "/v1/admin/acl", body)
    if args.actions:
        body["actions"] = args.actions
    return call(args, "POST", "/v1/admin/acl/revoke", body)


def _show(args: argparse.Namespace, status: int, body: Any) -> None:
    if args.json:
        print(json.dumps(body, indent=2) if body is not None else "{}")
        return
    cmd = getattr(args, "user_command", None) or args.acl_command
    if args.command == "user" and cmd == "list":
        for u in body:
            print(f"{u['name']}\troles={','.join(u['roles']) or '-'}\tkeys={len(u['api_keys'])}")
    elif args.command == "acl" and cmd == "list":
        for p in body:
            what = ",".join(p["actions"]) if "actions" in p else \
                f"configure={p['configure']!r} write={p['write']!r} read={p['read']!r}"
            print(f"{p['subject']}\t{p['resource']}\t{p['pattern']}\t{what}")
    elif args.command == "user" and cmd == "key" and not args.delete:
        print(body["key"])  # the only time it is shown
    elif args.command == "user" and cmd == "access-key" and not args.delete:
        print(f"{body['access_key']} {body['secret_key']}")  # the only time the secret is shown
    elif args.command == "user" and cmd == "import":
        print(f"imported {len(body['users'])} users, {body['permissions']} permissions")
        for s in body["skipped"]:
            print(f"skipped: {s}", file=sys.stderr)
    else:
        print(f"{args.command} {cmd}: done")


def run(args: argparse.Namespace) -> int:
    """Carry out one ``unimq user`` or ``unimq acl`` action; returns the exit code."""
    try:
        got = _user_call(args) if args.command == "user" else _acl_call(args)
    except (urllib.error.URLError, OSError) as e:
        return unreachable(args, e)
    if isinstance(got, int):
        return got
    status, body = got
    if status >= 400:
        print_error(status, body)
        return exit_code(status)
    _show(args, status, body)
    return 0
