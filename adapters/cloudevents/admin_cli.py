"""``unimq admin ...``: the console's views and actions from a shell, over the JSON admin API.

Why over HTTP (``/v1/admin``) like ``unimq topic``: the running server owns the store, and the
console reads the same API, so whatever the console shows the CLI shows too. Standard library
only (urllib, via ``admin_client.call``), so ``unimq --help`` stays fast.

Output: aligned tables, or the server's JSON with ``--json``. Credentials and exit codes are
those of every admin command (``admin_client``: ``--user``/``UNIMQ_USER`` + ``UNIMQ_PASSWORD``
or ``--api-key``/``UNIMQ_API_KEY``): 0 done; 1 the server could not be reached or failed;
2 bad usage (argparse, or a 400 from the server); 3 not allowed (401/403); 4 not found (an
unknown topic, group, client or message, or a search that found nothing); 5 exists (409).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
from datetime import datetime, timezone
from typing import Any, Sequence

from .admin_client import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, add_common, call, exit_code, print_error, unreachable

__all__ = ["add_parser", "run"]

API = "/v1/admin"


def add_parser(sub: Any) -> None:
    """Register ``admin`` and its actions on the CLI's subparsers."""
    admin = sub.add_parser("admin", help="look at and operate a running unimq (topics, groups, clients, messages)",
                           description="The console's views and actions over the HTTP door's JSON admin API (/v1/admin).")
    shared = argparse.ArgumentParser(add_help=False)
    add_common(shared, None)
    paged = argparse.ArgumentParser(add_help=False)
    paged.add_argument("--filter", default="", help="only names containing this")
    paged.add_argument("--offset", type=int, default=0)
    paged.add_argument("--limit", type=int, default=50)
    acts = admin.add_subparsers(dest="admin_command", metavar="ACTION")
    acts.required = True
    acts.add_parser("overview", parents=[shared], help="messages in/out and connections per door, store, brokers")
    t = acts.add_parser("topics", parents=[shared, paged], help="topics with queues, messages, retention, consumers")
    t.add_argument("--all", action="store_true", help="include system topics")
    g = acts.add_parser("groups", parents=[shared, paged], help="consumer groups with lag, in flight, retries, DLQ")
    g.add_argument("--topic", default="", help="only groups consuming this topic")
    one = acts.add_parser("group", parents=[shared], help="one group's queues: offsets, lag, in flight")
    one.add_argument("group")
    r = acts.add_parser("reset", parents=[shared], help="move a group to an offset or a time; later messages come again")
    r.add_argument("group")
    r.add_argument("--topic", required=True)
    where = r.add_mutually_exclusive_group(required=True)
    where.add_argument("--offset", type=int, help="the offset (clamped to each queue's bounds)")
    where.add_argument("--time", help="ISO time (2026-01-01T10:00:00Z) or epoch milliseconds")
    r.add_argument("--queue", type=int, help="one queue (default: every queue)")
    d = acts.add_parser("resend-dlq", parents=[shared], help="send a group's dead letters again")
    d.add_argument("group")
    d.add_argument("--topic", help="where to (default: the one topic the group consumes)")
    d.add_argument("--max", type=int, default=100)
    c = acts.add_parser("clients", parents=[shared, paged], help="MQTT sessions, AMQP connections, gRPC clients, push")
    c.add_argument("--door", default="", choices=["", "mqtt", "amqp", "grpc", "http"])
    x = acts.add_parser("disconnect", parents=[shared], help="close a client's connection")
    x.add_argument("door", choices=["mqtt", "amqp", "grpc"])
    x.add_argument("client_id", help="the client id (AMQP: the peer address host:port)")
    m = acts.add_parser("messages", help="search messages or show one")
    macts = m.add_subparsers(dest="messages_command", metavar="ACTION")
    macts.required = True
    s = macts.add_parser("search", parents=[shared], help="by --id, or --topic with --key or a time range")
    s.add_argument("--id", default="")
    s.add_argument("--topic", default="")
    s.add_argument("--key", default="")
    s.add_argument("--begin", help="ISO time or epoch milliseconds")
    s.add_argument("--end", help="ISO time or epoch milliseconds")
    s.add_argument("--max", type=int, default=32)
    sh = macts.add_parser("show", parents=[shared], help="one message by id: properties and body")
    sh.add_argument("message_id")
    sh.add_argument("--as", dest="show_as", choices=["text", "json", "hex"], default="text")
    tr = macts.add_parser("trace", parents=[shared], help="a traced message's life across doors, in time order")
    tr.add_argument("message_id")
    acts.add_parser("brokers", parents=[shared], help="nameservers, brokers and replicated groups")


def _ms(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    if value.isdigit():
        return int(value)
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(_usage(f"{flag}: not a time: {value!r}")) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _usage(msg: str) -> int:
    print(f"unimq: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def _q(**params: Any) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, "", False)}
    return ("?" + urllib.parse.urlencode(kept)) if kept else ""


def _seg(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows as aligned columns (numbers right-aligned)."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(r[i], (int, float)) for r in rows) and bool(rows) for i in range(len(headers))]
    out = []
    for r in cells:
        out.append("  ".join(v.rjust(w) if numeric[i] and r is not cells[0] else v.ljust(w)
                             for i, (v, w) in enumerate(zip(r, widths))).rstrip())
    return "\n".join(out)


def trace_table(body: dict[str, Any]) -> str:
    """A message's trace events, one a line: when, what, over which door, who, where."""
    rows = []
    for e in body["events"]:
        at = datetime.fromtimestamp(e["at"] / 1000, tz=timezone.utc).strftime("%H:%M:%S.%f")[:-3]
        who = e.get("client") or ""
        where = e.get("group") or e.get("broker") or ""
        extra = {k: v for k, v in e.items()
                 if k not in ("id", "topic", "event", "door", "at", "client", "group", "broker", "address")}
        rows.append([at, e["event"], e["door"], who, where, " ".join(f"{k}={v}" for k, v in extra.items())])
    return table(["TIME", "EVENT", "DOOR", "CLIENT", "GROUP/BROKER", "DETAIL"], rows)


def _request(args: argparse.Namespace) -> tuple[str, str, Any]:
    """(method, path, body) of the action."""
    cmd = args.admin_command
    if cmd == "overview":
        return "GET", "/overview", None
    if cmd == "topics":
        return "GET", "/topics" + _q(q=args.filter, offset=args.offset, limit=args.limit,
                                     include_system="true" if args.all else None), None
    if cmd == "groups":
        return "GET", "/groups" + _q(q=args.filter, offset=args.offset, limit=args.limit, topic=args.topic), None
    if cmd == "group":
        return "GET", "/groups/" + _seg(args.group), None
    if cmd == "reset":
        body: dict[str, Any] = {"topic": args.topic}
        if args.offset is not None:
            body["offset"] = args.offset
        else:
            body["timestamp_ms"] = _ms(args.time, "--time")
        if args.queue is not None:
            body["queue_id"] = args.queue
        return "POST", f"/groups/{_seg(args.group)}/reset", body
    if cmd == "resend-dlq":
        body = {"max": args.max} | ({"topic": args.topic} if args.topic else {})
        return "POST", f"/groups/{_seg(args.group)}/resend-dlq", body
    if cmd == "clients":
        return "GET", "/clients" + _q(door=args.door, q=args.filter, offset=args.offset, limit=args.limit), None
    if cmd == "disconnect":
        return "POST", f"/clients/{args.door}/{_seg(args.client_id)}/disconnect", {}
    if cmd == "messages":
        if args.messages_command == "show":
            return "GET", "/messages" + _q(id=args.message_id), None
        if args.messages_command == "trace":
            return "GET", f"/messages/{_seg(args.message_id)}/trace", None
        if not args.id and not args.topic:
            raise SystemExit(_usage("give --id, or --topic with --key or --begin/--end"))
        return "GET", "/messages" + _q(id=args.id, topic=args.topic, key=args.key, begin_ms=_ms(args.begin, "--begin"),
                                       end_ms=_ms(args.end, "--end"), max=args.max), None
    if cmd == "brokers":
        return "GET", "/cluster", None
    raise AssertionError(cmd)  # pragma: no cover - argparse rejects others


def _print(args: argparse.Namespace, body: Any) -> int:
    cmd = args.admin_command
    if cmd == "overview":
        rows = [[d, v["in_per_s"], v["out_per_s"], v["messages_in"], v["messages_out"], v["connections"]]
                for d, v in body["doors"].items()]
        print(table(["door", "in/s", "out/s", "in", "out", "connections"], rows))
        s = body["store"]
        print(f"\nstore: commitlog {s['commitlog_bytes']} bytes, disk free {s.get('disk_free_bytes')} of "
              f"{s.get('disk_total_bytes')} bytes; topics {body['topics']}, groups {body['groups']}, lag {body['lag']}")
        for b in body["brokers"]:
            print(f"broker {b['name']} {b['address'] or 'in process'} {'up' if b['live'] else 'DOWN'}")
    elif cmd == "topics":
        print(table(["topic", "type", "queues", "messages", "retention_h", "consumers"],
                    [[t["name"], t["type"], len(t["queues"]), t["messages"], t["retention_hours"], ",".join(t["consumers"])]
                     for t in body["items"]]))
        print(f"({len(body['items'])} of {body['total']})")
    elif cmd == "groups":
        print(table(["group", "topics", "lag", "inflight", "retry", "dlq"],
                    [[g["group"], ",".join(g["topics"]), g["lag"], g["inflight"], g["retry"], g["dlq"]] for g in body["items"]]))
        print(f"({len(body['items'])} of {body['total']})")
    elif cmd == "group":
        print(f"group {body['group']}: lag {body['lag']}, in flight {body['inflight']}, retry {body['retry']}, "
              f"dead letters {body['dlq']}")
        print(table(["topic", "queue", "broker", "consumer_offset", "max_offset", "lag", "inflight"],
                    [[q["topic"], q["queue_id"], q["broker"], q["consumer_offset"], q["max_offset"], q["lag"], q["inflight"]]
                     for q in body["queues"]]))
    elif cmd == "reset":
        print(table(["queue", "offset"], [[q["queue_id"], q["offset"]] for q in body["queues"]]))
    elif cmd == "resend-dlq":
        print(f"resent {body['resent']} dead letters of {body['group']} to {body['topic']}")
    elif cmd == "clients":
        print(table(["door", "client", "connected", "remote", "user"],
                    [[c["door"], c["client_id"], "yes" if c["connected"] else "no", c["remote"], c["user"]]
                     for c in body["items"]]))
        print(f"({len(body['items'])} of {body['total']}; connections "
              + ", ".join(f"{d} {n}" for d, n in body["connections"].items()) + ")")
    elif cmd == "disconnect":
        print(f"disconnected {body['door']} {body['client_id']}")
    elif cmd == "messages" and args.messages_command == "show":
        m = body["items"][0]
        for k in ("message_id", "topic", "queue_id", "queue_offset", "protocol", "tag", "keys", "store_timestamp"):
            print(f"{k}: {m[k]}")
        for k, v in m["properties"].items():
            print(f"property {k}: {v}")
        shown = {"text": m["body_text"], "json": json.dumps(m["body_json"], indent=2) if m["body_json"] is not None else None,
                 "hex": m["body_hex"]}[args.show_as]
        print("body:" if shown is not None else f"body: (not {args.show_as})")
        if shown is not None:
            print(shown)
    elif cmd == "messages" and args.messages_command == "trace":
        print(trace_table(body))
    elif cmd == "messages":
        print(table(["message_id", "topic", "queue", "offset", "door", "keys", "stored", "bytes"],
                    [[m["message_id"], m["topic"], m["queue_id"], m["queue_offset"], m["protocol"], ",".join(m["keys"]),
                      m["store_timestamp"], m["body_size"]] for m in body["items"]]))
    elif cmd == "brokers":
        print("nameservers: " + (", ".join(body["nameservers"]) or "embedded"))
        print(table(["broker", "address", "writable", "replicated", "live", "topics"],
                    [[b["name"], b["address"] or "in process", b["writable"], b["replicated"], b["live"], b["topics"]]
                     for b in body["brokers"]]))
        for g in body["groups"]:
            print(f"group {g['group']}: master {g['master']} epoch {g['epoch']} in-sync {','.join(g['in_sync'])}")
        if body.get("controller_error"):
            print(f"controller: {body['controller_error']}")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Carry out one ``unimq admin`` action; returns the exit code."""
    try:
        method, path, payload = _request(args)
    except SystemExit as e:
        return int(e.code or EXIT_USAGE)
    try:
        status, body = call(args, method, API + path, payload)
    except (urllib.error.URLError, OSError) as e:
        return unreachable(args, e)
    if status >= 400:
        print_error(status, body)
        return EXIT_USAGE if status == 400 else exit_code(status)
    found = body.get("items") if isinstance(body, dict) and args.admin_command == "messages" else None
    if isinstance(body, dict) and args.admin_command == "messages" and args.messages_command == "trace":
        found = body.get("events")
    if found is not None and not found:
        if args.json:
            print(json.dumps(body, indent=2))
        else:
            print("no trace of that message (is its topic traced?)" if "events" in body else "no message found",
                  file=sys.stderr)
        return EXIT_NOT_FOUND
    if args.json:
        print(json.dumps(body, indent=2))
        return EXIT_OK
    return _print(args, body)
