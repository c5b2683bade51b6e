"""`unimq topic create|list|describe|update|delete|compact|remap|release`: topic admin over the HTTP door's /v1/topics API.

Why over HTTP and not by opening the store: the store belongs to the running
`unimq up` process (one writer), and the HTTP door is the admin surface every
deployment shape exposes, so the CLI is just another HTTP client. It uses only
the standard library (urllib) so `unimq --help` stays fast.

Exit codes: 0 done, 1 the server refused (its ``{"error", "message"}`` is
printed) or could not be reached, 2 bad usage (argparse).
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
from typing import Any

from .admin_client import add_common, call, print_error, unreachable

TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "COMPACTED")


def add_parser(sub: Any) -> None:
    """Register the ``topic`` subcommand on the CLI's subparsers."""
    topic = sub.add_parser(
        "topic",
        help="create, list, describe, update or delete topics on a running unimq (over its HTTP door)",
        description="Topic admin against a running unimq through its HTTP door (POST/GET/PATCH/DELETE /v1/topics).",
    )
    # The common options work before or after the action (`unimq topic list --endpoint URL`).
    add_common(topic, None)
    shared = argparse.ArgumentParser(add_help=False)
    add_common(shared, argparse.SUPPRESS)
    actions = topic.add_subparsers(dest="topic_command", metavar="ACTION")
    actions.required = True
    create = actions.add_parser("create", parents=[shared], help="create a topic (no error if it exists with the same type)")
    create.add_argument("name")
    create.add_argument("--queues", type=int, default=8, help="number of queues (default: 8)")
    create.add_argument("--type", default="NORMAL", type=str.upper, choices=TYPES,
                        help="message type (default: NORMAL); COMPACTED keeps the latest message per key")
    create.add_argument("--attr", action="append", default=[], metavar="KEY=VALUE",
                        help="a topic attribute, repeatable: tier_retention_hours, delete_retention_ms, ...")
    create.add_argument("--static", action="store_true",
                        help="logic queues: their number is fixed for good, a key always hashes to the same one, "
                             "and each can move to another broker (unimq topic remap)")
    lst = actions.add_parser("list", parents=[shared], help="list topics with their queues' offsets")
    lst.add_argument("--all", action="store_true", help="include system topics (%%DLQ%%, %%RETRY%%, ...)")
    describe = actions.add_parser("describe", parents=[shared], help="a topic's type and each queue's min/max offsets")
    describe.add_argument("name")
    update = actions.add_parser("update", parents=[shared], help="change a topic's attributes (merged into its own)")
    update.add_argument("name")
    update.add_argument("--attr", action="append", default=[], metavar="KEY=VALUE",
                        help="an attribute to set, repeatable; KEY= (empty value) removes it")
    delete = actions.add_parser("delete", parents=[shared], help="delete a topic")
    delete.add_argument("name")
    compact = actions.add_parser("compact", parents=[shared], help="compact a COMPACTED topic now (what it can)")
    compact.add_argument("name")
    remap = actions.add_parser("remap", parents=[shared],
                               help="write a static topic's logic queue on another broker from now on")
    remap.add_argument("name")
    remap.add_argument("--queue", type=int, required=True, help="the logic queue")
    remap.add_argument("--to", required=True, metavar="BROKER", help="the broker to write it on")
    release = actions.add_parser("release", parents=[shared],
                                 help="scale-in: forget a broker's drained old part of a static topic's logic queue")
    release.add_argument("name")
    release.add_argument("--queue", type=int, required=True, help="the logic queue")
    release.add_argument("--broker", required=True, help="the broker whose old part goes")


_call = call


def _path(name: str) -> str:
    return "/v1/topics/" + urllib.parse.quote(name, safe="")


def _print_topic(t: dict[str, Any]) -> None:
    queues = t["queues"]
    total = sum(q["max_offset"] - q["min_offset"] for q in queues)
    print(f"{t['name']}  type={t['type']}  queues={len(queues)}  messages={total}")
    if t.get("attributes"):
        print("  attributes: " + " ".join(f"{k}={v}" for k, v in sorted(t["attributes"].items())))
    for q in queues:
        print(f"  queue {q['queue_id']}: min_offset={q['min_offset']} max_offset={q['max_offset']}")
    if t.get("mapping"):
        _print_mapping(t["mapping"])


def _print_mapping(mapping: dict[str, Any]) -> None:
    """A static topic's logic queues: each one's chain, oldest first, the one written now last."""
    print(f"  logic queues (map epoch {mapping['epoch']}):")
    for q, chain in enumerate(mapping["queues"]):
        parts = [f"{b} from {ls}" + (" (written now)" if pe < 0 else f" to {ls + pe - ps}")
                 for b, ls, ps, pe in chain]
        print(f"  logic queue {q}: " + ", then ".join(parts))


def run(args: argparse.Namespace) -> int:
    """Carry out one ``unimq topic`` action; returns the exit code."""
    cmd = args.topic_command
    try:
        if cmd == "create":
            attrs = dict(a.partition("=")[::2] for a in args.attr)
            if args.static:
                attrs["static"] = "true"
            status, body = _call(args, "POST", "/v1/topics",
                                 {"name": args.name, "queues": args.queues, "type": args.type, "attributes": attrs})
        elif cmd == "list":
            status, body = _call(args, "GET", "/v1/topics" + ("?include_system=true" if args.all else ""))
        elif cmd == "describe":
            status, body = _call(args, "GET", _path(args.name))
        elif cmd == "update":
            changes = {k: v or None for k, v in (a.partition("=")[::2] for a in args.attr)}
            status, body = _call(args, "PATCH", _path(args.name), {"attributes": changes})
        elif cmd == "delete":
            status, body = _call(args, "DELETE", _path(args.name))
        elif cmd == "compact":
            status, body = _call(args, "POST", _path(args.name) + "/compact", {})
        elif cmd == "remap":
            status, body = _call(args, "POST", _path(args.name) + "/remap", {"queue": args.queue, "broker": args.to})
        elif cmd == "release":
            status, body = _call(args, "POST", _path(args.name) + "/release",
                                 {"queue": args.queue, "broker": args.broker})
        else:  # pragma: no cover - argparse rejects others
            raise AssertionError(cmd)
    except (urllib.error.URLError, OSError) as e:
        return unreachable(args, e)
    if status >= 400:
        print_error(status, body)
        return 1
    if args.json:
        print(json.dumps(body, indent=2) if body is not None else "{}")
        return 0
    if cmd == "create":
        print(f"{'created' if status == 201 else 'exists'}: ", end="")
        _print_topic(body)
    elif cmd == "list":
        for t in body:
            n = sum(q["max_offset"] - q["min_offset"] for q in t["queues"])
            print(f"{t['name']}\t{t['type']}\tqueues={len(t['queues'])}\tmessages={n}")
    elif cmd in ("describe", "update"):
        _print_topic(body)
    elif cmd in ("remap", "release"):
        print(f"{'remapped' if cmd == 'remap' else 'released'}: {args.name} logic queue {args.queue}")
        _print_mapping(body["mapping"])
    elif cmd == "compact":
        print(f"compacted: {args.name}: {body['passes']} pass(es) over {body['queues']} queue(s), "
              f"{body['removed']} message(s) removed")
    else:
        print(f"deleted: {args.name}")
    return 0
