"""Issue 19: users, permissions and the HTTP door's logins, against a real `unimq up` with httpx.

- the matrix: (no credentials, wrong password, right user without the permission,
  right user with it) x (publish, consume, create, delete, admin), each cell the
  door's own answer (401 with WWW-Authenticate, 403 with the problem JSON, 2xx);
  Basic and Bearer (an API key) alike;
- a permission revoked while a keep-alive client is connected stops its next
  requests (polled, no timing assertion); a deleted API key stops working;
- the users survive a restart (they live in the broker's door state), and a
  gateway attached to the node (the separated shape) authenticates them too;
- denials are counted in /metrics and audited in the log (who, what, from where).
"""

from __future__ import annotations

import subprocess
import sys
import time

import httpx

from conftest import REPO_ROOT, TEST_STORE_SIZES

ADMIN = ("root", "root-pw-1")


def _admin(server) -> httpx.Client:
    return httpx.Client(base_url=server.url(), auth=ADMIN, timeout=10)


def _bootstrap(server) -> None:
    """The first user is added anonymously from loopback (no users yet): a superuser."""
    r = httpx.post(server.url(path="/v1/admin/users"), json={"name": ADMIN[0], "password": ADMIN[1], "admin": True})
    assert r.status_code == 201, r.text
    # from now on anonymous callers are refused
    r = httpx.get(server.url(path="/v1/admin/users"))
    assert r.status_code == 401 and "Basic" in r.headers["www-authenticate"]


def _user(admin: httpx.Client, name: str, password: str, *grants: tuple[str, str, str]) -> None:
    assert admin.post("/v1/admin/users", json={"name": name, "password": password}).status_code == 201
    for resource, pattern, actions in grants:
        r = admin.post("/v1/admin/acl", json={"subject": name, "resource": resource, "pattern": pattern,
                                              "actions": actions.split(",")})
        assert r.status_code == 201, r.text


OPS = ("publish", "consume", "create", "delete", "admin")


def _do(c: httpx.Client, op: str, n: int) -> httpx.Response:
    if op == "publish":
        return c.post("/v1/topics/orders/messages", content=b"hello")
    if op == "consume":
        return c.post("/v1/topics/orders/groups/billing/pop", params={"max": 1})
    if op == "create":
        return c.post("/v1/topics", json={"name": f"made-{n}"})
    if op == "delete":
        return c.delete(f"/v1/topics/doomed-{n}")
    return c.get("/v1/admin/users")


def test_http_permission_matrix(unimq_server) -> None:
    server = unimq_server()
    _bootstrap(server)
    admin = _admin(server)
    # users that hold exactly one operation's permissions each, and one that holds none of them
    _user(admin, "pub", "pub-pw", ("topic", "orders", "publish"))
    _user(admin, "con", "con-pw", ("topic", "orders", "consume"), ("group", "bill*", "subscribe"))
    _user(admin, "maker", "maker-pw", ("topic", "made-*", "create"))
    _user(admin, "killer", "killer-pw", ("topic", "doomed-*", "delete"))
    _user(admin, "ops", "ops-pw", ("admin", "*", "admin"))
    _user(admin, "nobody", "nobody-pw", ("topic", "elsewhere/#", "publish,subscribe,create,delete"))
    with_perm = {"publish": "pub", "consume": "con", "create": "maker", "delete": "killer", "admin": "ops"}
    for n in range(len(OPS) * 4 + 1):
        assert admin.post("/v1/topics", json={"name": f"doomed-{n}"}).status_code == 201
    assert admin.post("/v1/topics", json={"name": "orders"}).status_code == 201

    failures = []
    n = 0
    for op in OPS:
        holder = with_perm[op]
        cells = {
            "no credentials": (None, 401),
            "wrong password": ((holder, "not-the-password"), 401),
            "without the permission": (("nobody", "nobody-pw"), 403),
            "with the permission": ((holder, f"{holder}-pw"), 200),
        }
        for cell, (auth, want) in cells.items():
            n += 1
            with httpx.Client(base_url=server.url(), auth=auth, timeout=10) as c:
                r = _do(c, op, n)
            ok = r.status_code < 300 if want == 200 else r.status_code == want
            if ok and want == 401:
                ok = "Basic" in r.headers.get("www-authenticate", "") and r.json()["error"] == "UNAUTHORIZED"
            if ok and want == 403:
                ok = r.json()["error"] == "FORBIDDEN" and "may not" in r.json()["message"]
            if not ok:
                failures.append(f"{op} / {cell}: {r.status_code} {r.text[:200]}")
    assert not failures, "\n".join(failures)

    # a bearer API key is the same identity
    key = admin.post("/v1/admin/users/pub/keys").json()["key"]
    bearer = {"authorization": f"Bearer {key}"}
    assert httpx.post(server.url(path="/v1/topics/orders/messages"), content=b"x", headers=bearer).status_code < 300
    r = httpx.post(server.url(path="/v1/topics/other/messages"), content=b"x", headers=bearer)
    assert r.status_code == 403 and r.json()["error"] == "FORBIDDEN"
    r = httpx.post(server.url(path="/v1/topics/orders/messages"), content=b"x",
                   headers={"authorization": f"Bearer {key[:-2]}zz"})
    assert r.status_code == 401 and "Bearer" in r.headers["www-authenticate"]

    # denials are counted (bounded labels: per door) and audited with who, what and from where
    metrics = httpx.get(server.url(path="/metrics")).text
    denied = [line for line in metrics.splitlines() if line.startswith('unimq_auth_denied_total{protocol="http"}')]
    assert denied and float(denied[0].split()[-1]) >= 5
    assert 'unimq_auth_failed_total{protocol="http"}' in metrics
    log = server.stderr()
    assert "denied: user=nobody protocol=http" in log and "action=delete resource=topic name='doomed-" in log
    assert "from=127.0.0.1:" in log
    assert "pub-pw" not in log and "not-the-password" not in log  # passwords are never logged


def _poll(check, what: str, limit_s: float = 15.0) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def test_revoked_permission_and_key_stop_an_open_client(unimq_server) -> None:
    server = unimq_server()
    _bootstrap(server)
    admin = _admin(server)
    _user(admin, "app", "app-pw", ("topic", "events/#", "publish"))
    key = admin.post("/v1/admin/users/app/keys").json()
    with httpx.Client(base_url=server.url(), auth=("app", "app-pw"), timeout=10) as c, \
            httpx.Client(base_url=server.url(), headers={"authorization": f"Bearer {key['key']}"}, timeout=10) as k:
        assert c.post("/v1/topics/events/messages", content=b"1").status_code < 300
        assert k.post("/v1/topics/events/messages", content=b"1").status_code < 300
        r = admin.post("/v1/admin/acl/revoke", json={"subject": "app", "resource": "topic", "pattern": "events/#"})
        assert r.status_code == 204
        # the same keep-alive connections, asked again until the change shows
        _poll(lambda: c.post("/v1/topics/events/messages", content=b"2").status_code == 403, "revocation (Basic)")
        _poll(lambda: k.post("/v1/topics/events/messages", content=b"2").status_code == 403, "revocation (Bearer)")
        assert admin.delete(f"/v1/admin/users/app/keys/{key['key_id']}").status_code == 204
        _poll(lambda: k.post("/v1/topics/events/messages", content=b"3").status_code == 401, "deleted API key")
        # a new password: the old one stops working
        assert admin.put("/v1/admin/users/app/password", json={"password": "app-pw-2"}).status_code == 204
        _poll(lambda: c.get("/v1/topics/events").status_code == 401, "changed password")


def test_users_survive_a_restart_and_reach_an_attached_gateway(unimq_server, tmp_path) -> None:
    server = unimq_server()
    _bootstrap(server)
    admin = _admin(server)
    _user(admin, "app", "app-pw", ("topic", "jobs", "publish,create"))
    args = [sys.executable, "-m", "unimq", "gateway", "--namesrv", f"127.0.0.1:{server.ports['namesrv']}",
            "--host", "127.0.0.1", "--rpc-port", "0", "--http-port", "0", "--grpc-port", "0", "--mqtt-port", "0",
            "--mqtt-ws-port", "-1", "--amqp-port", "0"]
    gw = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = None
        for line in gw.stdout:
            if line.startswith("unimq: http listening on"):
                port = int(line.rsplit(":", 1)[1])
            if line.strip() == "unimq: ready":
                break
        assert port is not None, "the gateway did not start"
        url = f"http://127.0.0.1:{port}"
        assert httpx.post(f"{url}/v1/topics/jobs/messages", content=b"x", auth=("app", "app-pw")).status_code < 300
        assert httpx.post(f"{url}/v1/topics/jobs/messages", content=b"x").status_code == 401
        # a change made through the node reaches the gateway
        admin.post("/v1/admin/acl/revoke", json={"subject": "app", "resource": "topic", "pattern": "jobs"})
        _poll(lambda: httpx.post(f"{url}/v1/topics/jobs/messages", content=b"x",
                                 auth=("app", "app-pw")).status_code == 403, "revocation seen by the gateway")
        # and a user added through the gateway reaches the node
        r = httpx.post(f"{url}/v1/admin/users", json={"name": "late", "password": "late-pw"}, auth=ADMIN)
        assert r.status_code == 201
        _poll(lambda: admin.get("/v1/admin/users/late").status_code == 200, "user added through the gateway")
    finally:
        gw.terminate()
        gw.wait(timeout=30)
    assert server.stop() == 0
    # a restart on a non-loopback address: users exist, so it starts, and still wants them
    again = unimq_server("--host", "0.0.0.0", data_dir=server.data_dir)
    url = f"http://127.0.0.1:{again.ports['http']}"
    assert httpx.get(f"{url}/v1/admin/users").status_code == 401
    users = httpx.get(f"{url}/v1/admin/users", auth=ADMIN).json()
    assert {u["name"] for u in users} == {"root", "app", "late"}
    assert all("password_hash" not in u for u in users)


def test_non_loopback_without_users_refuses_to_start(tmp_path) -> None:
    args = [sys.executable, "-m", "unimq", "up", "--data-dir", str(tmp_path / "d"), "--host", "0.0.0.0",
            "--mqtt-port", "0", "--mqtt-ws-port", "-1", "--amqp-port", "0", "--http-port", "0", "--grpc-port", "0",
            "--namesrv-port", "0", *[f"--set={k}={v}" for k, v in TEST_STORE_SIZES.items()]]
    out = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "refusing to serve clients on 0.0.0.0 with no users configured" in out.stderr
    assert "allow_anonymous = true" in out.stderr and "unimq user add" in out.stderr
    assert "unimq: ready" not in out.stdout


def test_allow_anonymous_serves_a_non_loopback_host(unimq_server) -> None:
    server = unimq_server("--host", "0.0.0.0", "--set", "allow_anonymous=true")
    url = f"http://127.0.0.1:{server.ports['http']}"
    assert httpx.post(f"{url}/v1/topics/open/messages", content=b"x").status_code < 300


def test_push_subscriptions_need_consume_on_topic_and_group(unimq_server) -> None:
    server = unimq_server("--set", "http_push_allowed_hosts=['127.0.0.1']")
    _bootstrap(server)
    admin = _admin(server)
    _user(admin, "reader", "reader-pw", ("topic", "feed", "consume"), ("group", "push-*", "consume"))
    _user(admin, "writer", "writer-pw", ("topic", "feed", "publish"))
    spec = {"topic": "feed", "sink": "http://127.0.0.1:9/hook"}
    url = server.url(path="/v1/subscriptions")
    assert httpx.post(url, json=spec).status_code == 401
    r = httpx.post(url, json=spec, auth=("writer", "writer-pw"))
    assert r.status_code == 403 and r.json()["error"] == "FORBIDDEN"
    r = httpx.post(url, json={**spec, "group": "other"}, auth=("reader", "reader-pw"))
    assert r.status_code == 403
    r = httpx.post(url, json=spec, auth=("reader", "reader-pw"))
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert [s["id"] for s in httpx.get(url, auth=("reader", "reader-pw")).json()] == [sid]
    assert httpx.get(url, auth=("writer", "writer-pw")).json() == []
    assert httpx.delete(f"{url}/{sid}", auth=("writer", "writer-pw")).status_code == 403
    assert httpx.delete(f"{url}/{sid}", auth=("reader", "reader-pw")).status_code == 204
