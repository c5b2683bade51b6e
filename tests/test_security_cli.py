"""Issue 19: `unimq user` and `unimq acl` against a running `unimq up`, as a script would use them.

Passwords go in on standard input, credentials in the environment; the exit
codes are the contract (0 done, 3 not allowed, 4 not found, 5 exists); ``--json``
answers are the admin API's JSON. Imports: a Mosquitto password file written by
the real ``mosquitto_passwd`` (when installed) and a RabbitMQ definitions export,
whose users then log in over HTTP with their old passwords.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest

from conftest import REPO_ROOT
from gateway.access.passwords import rabbit_hash


def _cli(server, *args: str, stdin: str = "", user: tuple[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMQ_")}
    env["UNIMQ_ENDPOINT"] = server.url().rstrip("/")
    if user is not None:
        env["UNIMQ_USER"], env["UNIMQ_PASSWORD"] = user
    return subprocess.run([sys.executable, "-m", "unimq", *args], cwd=REPO_ROOT, env=env, input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_user_and_acl_commands(unimq_server) -> None:
    server = unimq_server()
    root = ("root", "root-pw")
    # the first user: anonymously, from loopback, while there are no users
    out = _cli(server, "user", "add", "root", "--admin", "--password-stdin", stdin="root-pw\n")
    assert out.returncode == 0, out.stderr
    assert _cli(server, "user", "list").returncode == 3  # no longer anonymous
    out = _cli(server, "user", "add", "alice", "--password-stdin", "--role", "writers", stdin="alice-pw\n", user=root)
    assert out.returncode == 0, out.stderr
    assert _cli(server, "user", "add", "alice", "--password-stdin", stdin="x\n", user=root).returncode == 5
    assert _cli(server, "user", "add", "bob", stdin="", user=root).returncode == 2  # no password given
    out = _cli(server, "user", "list", "--json", user=root)
    assert out.returncode == 0
    users = {u["name"]: u for u in json.loads(out.stdout)}
    assert set(users) == {"root", "alice"} and users["alice"]["roles"] == ["writers"]
    assert "alice-pw" not in out.stdout and "hash" not in out.stdout

    # a role's permission applies to its members
    assert _cli(server, "acl", "grant", "role:writers", "topic", "logs/#", "publish", user=root).returncode == 0
    assert _cli(server, "acl", "grant", "alice", "topic", "logs/#", "consume", user=root).returncode == 0
    out = _cli(server, "acl", "list", "--json", user=root)
    perms = json.loads(out.stdout)
    assert {"subject": "role:writers", "resource": "topic", "pattern": "logs/#", "actions": ["publish"]} in perms
    assert httpx.post(server.url(path="/v1/topics/logs/messages"), content=b"x", auth=("alice", "alice-pw")).status_code < 300
    assert _cli(server, "acl", "revoke", "role:writers", "topic", "logs/#", user=root).returncode == 0
    assert _cli(server, "acl", "revoke", "role:writers", "topic", "logs/#", user=root).returncode == 4
    out = _cli(server, "acl", "list", "alice", user=root)
    assert out.stdout.split() == ["alice", "topic", "logs/#", "subscribe"]

    # passwd, API keys, delete
    assert _cli(server, "user", "passwd", "alice", "--password-stdin", stdin="alice-pw-2\n", user=root).returncode == 0
    assert _cli(server, "user", "list", user=("alice", "alice-pw-2")).returncode == 3  # not an admin
    out = _cli(server, "user", "key", "alice", user=root)
    key = out.stdout.strip()
    assert out.returncode == 0 and key.startswith("umk_")
    r = httpx.post(server.url(path="/v1/topics/logs/groups/g/pop"), headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 403  # consume on the topic, but no group permission
    assert _cli(server, "acl", "grant", "alice", "group", "*", "consume", user=root).returncode == 0
    r = httpx.post(server.url(path="/v1/topics/logs/groups/g/pop"), headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200
    assert _cli(server, "user", "delete", "alice", user=root).returncode == 0
    assert _cli(server, "user", "delete", "alice", user=root).returncode == 4
    assert _cli(server, "acl", "list", "alice", user=root).stdout == ""  # her permissions went with her
    assert _cli(server, "user", "list", user=("root", "wrong")).returncode == 3
    # the topic commands log in the same way
    assert _cli(server, "topic", "create", "t1", user=root).returncode == 0
    assert _cli(server, "topic", "delete", "t1").returncode == 1


def test_import_mosquitto_and_rabbitmq(unimq_server, tmp_path) -> None:
    server = unimq_server()
    root = ("root", "root-pw")
    assert _cli(server, "user", "add", "root", "--admin", "--password-stdin", stdin="root-pw\n").returncode == 0
    pwfile = tmp_path / "passwd"
    if shutil.which("mosquitto_passwd"):
        subprocess.run(["mosquitto_passwd", "-c", "-b", str(pwfile), "sensor", "sensor-pw"], check=True)
    else:  # the $6$ form of Mosquitto 1.x, made the way it does
        import base64
        import hashlib

        salt = b"0123456789abcdef"
        digest = hashlib.sha512(b"sensor-pw" + salt).digest()
        pwfile.write_text(f"sensor:$6${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}\n")
    aclfile = tmp_path / "acl"
    aclfile.write_text("user sensor\ntopic write telemetry/#\ntopic deny telemetry/secret\npattern read c/%c\n")
    out = _cli(server, "user", "import", "--mosquitto-passwords", str(pwfile), "--mosquitto-acl", str(aclfile),
               user=root)
    assert out.returncode == 0, out.stderr
    assert "imported 1 users, 1 permissions" in out.stdout and "deny rule" in out.stderr
    r = httpx.post(server.url(path="/v1/topics/telemetry/messages"), content=b"1", auth=("sensor", "sensor-pw"))
    assert r.status_code < 300, r.text
    assert httpx.post(server.url(path="/v1/topics/telemetry/messages"), content=b"1",
                      auth=("sensor", "wrong")).status_code == 401
    # importing again clashes, unless replacing
    args = ("user", "import", "--mosquitto-passwords", str(pwfile))
    assert _cli(server, *args, user=root).returncode == 5
    assert _cli(server, *args, "--replace", user=root).returncode == 0

    defs = {
        "rabbit_version": "3.13.0",
        "users": [
            {"name": "shop", "password_hash": rabbit_hash("shop-pw"), "hashing_algorithm": "rabbit_password_hashing_sha256",
             "tags": []},
            {"name": "boss", "password_hash": rabbit_hash("boss-pw", algorithm="sha512"),
             "hashing_algorithm": "rabbit_password_hashing_sha512", "tags": ["administrator"]},
        ],
        "permissions": [{"user": "shop", "vhost": "/", "configure": "^shop\\.", "write": ".*", "read": ".*"}],
    }
    f = tmp_path / "defs.json"
    f.write_text(json.dumps(defs))
    out = _cli(server, "user", "import", "--rabbitmq-definitions", str(f), user=root)
    assert out.returncode == 0, out.stderr
    # boss was an administrator: a superuser here
    assert httpx.get(server.url(path="/v1/admin/users"), auth=("boss", "boss-pw")).status_code == 200
    assert httpx.get(server.url(path="/v1/admin/users"), auth=("shop", "shop-pw")).status_code == 403
    out = _cli(server, "acl", "list", "shop", "--json", user=root)
    assert json.loads(out.stdout) == [{"subject": "shop", "resource": "vhost", "pattern": "/",
                                       "configure": "^shop\\.", "write": ".*", "read": ".*"}]


@pytest.mark.parametrize("args", [["user", "list"], ["acl", "list"]])
def test_unreachable_server_is_exit_code_1(args, free_port) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMQ_")}
    out = subprocess.run([sys.executable, "-m", "unimq", *args, "--endpoint", f"http://127.0.0.1:{free_port()}"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "cannot reach" in out.stderr


def test_an_imported_hash_becomes_scrypt_at_the_first_login(unimq_server, tmp_path) -> None:
    """A RabbitMQ SHA-256 hash verifies once, then the store holds scrypt (read from the broker's door state)."""
    server = unimq_server()
    root = ("root", "root-pw")
    assert _cli(server, "user", "add", "root", "--admin", "--password-stdin", stdin="root-pw\n").returncode == 0
    f = tmp_path / "defs.json"
    f.write_text(json.dumps({"users": [{"name": "old", "password_hash": rabbit_hash("old-pw"),
                                        "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []}]}))
    assert _cli(server, "user", "import", "--rabbitmq-definitions", str(f), user=root).returncode == 0
    assert server.stop() == 0
    server = unimq_server(data_dir=server.data_dir)
    url = server.url(path="/v1/topics")
    assert httpx.get(url, auth=("old", "old-pw")).status_code == 200
    assert httpx.get(url, auth=("old", "wrong")).status_code == 401
    # the upgraded hash is what the brokers keep: read it back through the door state (admin API shows no hashes)
    import time

    from gateway.access.store import NAMESPACE

    deadline = time.monotonic() + 15
    while True:
        stored = _door_state(server, NAMESPACE, "user:old")
        if stored is not None and json.loads(stored)["password_hash"].startswith("$scrypt$"):
            break
        assert time.monotonic() < deadline, stored
        time.sleep(0.1)
    assert httpx.get(url, auth=("old", "old-pw")).status_code == 200


def _door_state(server, namespace: str, key: str) -> bytes | None:
    """One door-state entry, read from the running broker over its RPC (how gateways read it)."""
    import asyncio

    from gateway.remote_broker_client import RemoteBrokerClient
    from nameserver.client import parse_addresses

    async def read() -> bytes | None:
        client = RemoteBrokerClient(parse_addresses(f"127.0.0.1:{server.ports['namesrv']}"))
        await client.start()
        try:
            return await client.kv_get(namespace, key)
        finally:
            await client.stop()

    return asyncio.run(read())
