"""Issue 19: client certificates as identities, on every TLS door, with real certificates and clients.

A CA made here signs the server's certificate and client certificates whose CN
is a user name (``device-1``, a user of the store with rights on ``dev/#``
only) or no user (``ghost``). The server verifies client certificates
(``--tls-verify-client optional``) and takes them as identities:

- MQTT over TLS with ``mqtt_use_identity_as_username`` (Mosquitto's option):
  paho with ``tls_set(certfile, keyfile)`` and no user name logs in as the CN;
  its publishes are judged by that user's rights; a certificate naming no user,
  or none at all, gets CONNACK 0x87 (not authorized);
- AMQPS with EXTERNAL in ``amqp_auth_mechanisms`` (RabbitMQ's
  rabbitmq_auth_mechanism_ssl): pika with ``ssl_options`` and
  ``ExternalCredentials``; a certificate naming no user is ACCESS_REFUSED;
- HTTPS with ``http_cert_identity``: httpx with the certificate in its SSL context; 403 beyond the
  user's rights, 401 for a certificate naming no user.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import paho.mqtt.client as paho
import pika
import pika.credentials
import pika.exceptions
import pytest
from mqtt_fixtures import wait_for
from tls_helpers import TlsCA

pytestmark = pytest.mark.timeout(120)

ROOT = ("root", "root-pw")


@pytest.fixture
def setup(unimq_server, tmp_path: Path):
    ca = TlsCA(tmp_path)
    cert, key = ca.issue("server")
    server = unimq_server(
        "--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(ca.path),
        "--tls-verify-client", "optional", "--set", "mqtt_use_identity_as_username=true",
        "--set", 'amqp_auth_mechanisms=["PLAIN", "AMQPLAIN", "EXTERNAL"]', "--set", "http_cert_identity=true")
    base = f"https://127.0.0.1:{server.ports['http']}"
    trust = ssl.create_default_context(cafile=str(ca.path))
    r = httpx.post(base + "/v1/admin/users", json={"name": ROOT[0], "password": ROOT[1], "admin": True}, verify=trust)
    assert r.status_code == 201
    admin = httpx.Client(base_url=base, auth=ROOT, verify=trust, timeout=30)
    assert admin.post("/v1/admin/users", json={"name": "device-1"}).status_code == 201  # no password at all
    for body in ({"subject": "device-1", "resource": "topic", "pattern": "dev/#", "actions": ["publish", "subscribe"]},
                 {"subject": "device-1", "resource": "topic", "pattern": "dev", "actions": ["publish", "create"]},
                 {"subject": "device-1", "resource": "vhost", "pattern": "/", "configure": "^dev-", "write": ".*",
                  "read": "^dev-"}):
        assert admin.post("/v1/admin/acl", json=body).status_code == 201
    yield server, ca, base, admin
    admin.close()


def _client_ctx(ca: TlsCA, cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.path))
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


def _paho(port: int, ca: TlsCA, cert: tuple[Path, Path] | None, client_id: str):
    acks: dict[int, int] = {}
    connack: list[int] = []
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
    if cert is not None:
        c.tls_set(ca_certs=str(ca.path), certfile=str(cert[0]), keyfile=str(cert[1]))
    else:
        c.tls_set(ca_certs=str(ca.path))
    c.on_connect = lambda cl, u, f, rc, p: connack.append(rc.value)
    c.on_publish = lambda cl, u, mid, rc, p: acks.__setitem__(mid, rc.value)
    c.connect("127.0.0.1", port)
    c.loop_start()
    wait_for(lambda: connack, what="CONNACK")
    return c, connack, acks


def test_mqtt_use_identity_as_username(setup) -> None:
    server, ca, _, _ = setup
    port = server.ports["mqtts"]
    c, connack, acks = _paho(port, ca, ca.issue("device-1", client=True), "dev-cert-1")
    assert connack == [0]
    ok = c.publish("dev/temp", b"21.5", 1)
    refused = c.publish("prod/temp", b"21.5", 1)
    wait_for(lambda: len(acks) == 2, what="two PUBACKs")
    assert acks[ok.mid] in (0, 0x10)
    assert acks[refused.mid] == 0x87  # judged as device-1: no right on prod/#
    c.disconnect()
    c.loop_stop()
    for cert, cid in ((ca.issue("ghost", client=True), "ghost-1"), (None, "nocert-1")):
        c, connack, _ = _paho(port, ca, cert, cid)
        assert connack == [0x87], cid
        c.loop_stop()


def test_amqp_external_mechanism(setup) -> None:
    server, ca, _, _ = setup

    def connect(cert: tuple[Path, Path]) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", server.ports["amqps"], "/", pika.credentials.ExternalCredentials(),
            ssl_options=pika.SSLOptions(_client_ctx(ca, cert), "localhost"), connection_attempts=1,
            socket_timeout=10))

    conn = connect(ca.issue("device-1", client=True))
    ch = conn.channel()
    ch.queue_declare("dev-q")
    ch.confirm_delivery()
    ch.basic_publish("", "dev-q", b"by certificate")
    method, _, body = ch.basic_get("dev-q", auto_ack=True)
    for _ in range(50):
        if method is not None:
            break
        conn.sleep(0.1)
        method, _, body = ch.basic_get("dev-q", auto_ack=True)
    assert body == b"by certificate"
    # device-1's configure right is ^dev-: another queue is refused in RabbitMQ's words, as device-1
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.queue_declare("other-q")
    assert "refused for user 'device-1'" in str(e.value)
    conn.close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as e:
        connect(ca.issue("ghost", client=True))
    assert "ACCESS_REFUSED" in str(e.value)


def test_https_client_certificate_identity(setup) -> None:
    _, ca, base, admin = setup
    device = ca.issue("device-1", client=True)
    with httpx.Client(base_url=base, verify=_client_ctx(ca, device), timeout=30) as c:
        r = c.post("/v1/topics/dev/messages", content=b"21.5")
        assert r.status_code == 200, r.text
        r = c.post("/v1/topics/prod/messages", content=b"21.5")
        assert r.status_code == 403 and "device-1" in r.json()["message"]
        # an Authorization header still wins over the certificate
        assert c.get("/v1/admin/users", auth=ROOT).status_code == 200
        assert c.get("/v1/admin/users").status_code == 403
    ghost = ca.issue("ghost", client=True)
    with httpx.Client(base_url=base, verify=_client_ctx(ca, ghost), timeout=30) as c:
        r = c.post("/v1/topics/dev/messages", content=b"x")
        assert r.status_code == 401 and r.json()["error"] == "UNAUTHORIZED"
    with httpx.Client(base_url=base, verify=_client_ctx(ca, None), timeout=30) as c:
        assert c.post("/v1/topics/dev/messages", content=b"x").status_code == 401  # anonymous, users exist
    # deleting the user ends its certificate's logins too
    assert admin.delete("/v1/admin/users/device-1").status_code == 204
    with httpx.Client(base_url=base, verify=_client_ctx(ca, device), timeout=30) as c:
        wait_for(lambda: c.post("/v1/topics/dev/messages", content=b"x").status_code == 401,
                 what="the deleted user's certificate refused")
