"""What the admin commands (``unimq topic``, ``unimq user``, ``unimq acl``) share: one HTTP call, with credentials.

Why standard library (urllib): ``unimq --help`` and these commands stay fast and
need nothing beyond the server's own install. Credentials come from flags or
the environment (``UNIMQ_USER`` + ``UNIMQ_PASSWORD``, or ``UNIMQ_API_KEY``), so
scripts keep secrets out of ``ps`` and shell history; without any, the call is
anonymous (a fresh loopback server without users answers it).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

__all__ = ["DEFAULT_ENDPOINT", "ENDPOINT_ENV", "add_common", "call", "exit_code", "print_error", "unreachable"]

DEFAULT_ENDPOINT = "http://127.0.0.1:8080"
# Set once in a shell instead of --endpoint on every command (as kubectl's KUBECONFIG or mc's MC_HOST_*).
ENDPOINT_ENV = "UNIMQ_ENDPOINT"

#: Exit codes of the admin commands (scripts branch on them).
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_DENIED, EXIT_NOT_FOUND, EXIT_EXISTS = 0, 1, 2, 3, 4, 5


def add_common(p: argparse.ArgumentParser, default: Any) -> None:
    """The options every admin command takes, before or after its action (``default``: SUPPRESS on actions)."""
    def d(value: Any) -> Any:
        return value if default is None else default

    p.add_argument("--endpoint", default=d(os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT),
                   help=f"the HTTP door's base URL (default: ${ENDPOINT_ENV}, else {DEFAULT_ENDPOINT})")
    p.add_argument("--json", action="store_true", default=d(False), help="print the server's JSON answer")
    p.add_argument("--timeout", type=float, default=d(10.0), help="seconds to wait for the server (default: 10)")
    p.add_argument("--user", dest="auth_user", default=d(os.environ.get("UNIMQ_USER")),
                   help="log in as this user (default: $UNIMQ_USER); the password from $UNIMQ_PASSWORD")
    p.add_argument("--api-key", dest="auth_api_key", default=d(os.environ.get("UNIMQ_API_KEY")),
                   help="log in with this API key (default: $UNIMQ_API_KEY)")


def _auth_header(args: argparse.Namespace) -> dict[str, str]:
    key = getattr(args, "auth_api_key", None)
    if key:
        return {"authorization": f"Bearer {key}"}
    user = getattr(args, "auth_user", None)
    if user:
        pw = os.environ.get("UNIMQ_PASSWORD", "")
        return {"authorization": "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()}
    return {}


def call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """(status, parsed JSON answer) of one call; raises OSError/URLError when the server cannot be reached."""
    url = args.endpoint.rstrip("/") + path
    data = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json", "accept": "application/json", **_auth_header(args)}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=args.timeout) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"error": f"HTTP_{e.code}", "message": raw.decode(errors="replace")[:200]}


def exit_code(status: int) -> int:
    """The exit code of an HTTP status (see README "Security": exit codes)."""
    if status < 400:
        return EXIT_OK
    return {401: EXIT_DENIED, 403: EXIT_DENIED, 404: EXIT_NOT_FOUND, 409: EXIT_EXISTS}.get(status, EXIT_ERROR)


def unreachable(args: argparse.Namespace, e: OSError) -> int:
    """Say the server could not be reached (why, as the OS or urllib put it); the exit code to return."""
    print(f"unimq: error: cannot reach {args.endpoint}: {getattr(e, 'reason', e)}", file=sys.stderr)
    return EXIT_ERROR


def print_error(status: int, body: Any) -> None:
    err = body if isinstance(body, dict) else {}
    print(f"unimq: error: {err.get('error', status)}: {err.get('message', '')}", file=sys.stderr)
