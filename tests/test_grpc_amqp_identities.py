"""Issue 19: client certificates and JWTs on the gRPC door, JWTs on the AMQP door, with real clients.

One `unimq up` whose gRPC door serves TLS and requires a client certificate
(``--grpc-tls-cert``, ``tls_verify_client = required``) with
``grpc_cert_identity`` on, and a JWT issuer whose RSA public key is a PEM file.
A CA made here signs the server's certificate and client certificates whose CN
is ``device-1`` (a user with rights on topic ``dev``) or ``ghost`` (no user).
Calls are made with grpcio's own stubs (the RocketMQ client's generated ones)
over a TLS channel carrying the client certificate:

- unsigned calls log in as the certificate's CN: the user's rights decide
  (``FORBIDDEN`` beyond them), a CN that is no user is ``UNAUTHORIZED``;
- ``authorization: Bearer <JWT>`` metadata, or the RocketMQ header with the JWT
  as its access key, log in as the token's ``sub`` (and win over the
  certificate); an expired or foreign token is ``UNAUTHORIZED``;
- AMQP (pika): PLAIN with a JWT as the password logs in when the token's ``sub``
  is the user name; otherwise ACCESS_REFUSED, as a bad password.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import httpx
import jwt
import pika
import pika.exceptions
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc
from rocketmq.v5.util import Signature

from grpc_helpers import client_config, raw_message
from tls_helpers import TlsCA

pytestmark = pytest.mark.timeout(120)

ISS = "https://idp.test"
ROOT = ("root", "root-pw")


@pytest.fixture
def setup(unimq_server, tmp_path: Path):
    ca = TlsCA(tmp_path)
    cert, key = ca.issue("server")
    idp = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = tmp_path / "idp.pem"
    pem.write_bytes(idp.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    server = unimq_server(
        "--grpc-tls-cert", str(cert), "--grpc-tls-key", str(key), "--tls-client-ca", str(ca.path),
        "--tls-verify-client", "required", "--set", "grpc_cert_identity=true",
        "--set", f'jwt_issuers=["{ISS}"]', "--set", f'jwt_key_files=["{pem}"]')
    base = server.url().rstrip("/")
    assert httpx.post(base + "/v1/admin/users", json={"name": ROOT[0], "password": ROOT[1], "admin": True}
                      ).status_code == 201
    admin = httpx.Client(base_url=base, auth=ROOT, timeout=30)
    assert admin.post("/v1/admin/users", json={"name": "device-1"}).status_code == 201
    for body in ({"subject": "device-1", "resource": "topic", "pattern": "dev", "actions": ["publish", "create"]},
                 {"subject": "alice", "resource": "topic", "pattern": "alice", "actions": ["publish", "create"]},
                 {"subject": "alice", "resource": "vhost", "pattern": "/", "configure": ".*", "write": ".*",
                  "read": ".*"}):
        assert admin.post("/v1/admin/acl", json=body).status_code == 201, body
    yield server, ca, idp
    admin.close()


def _token(key, sub: str = "alice", **claims) -> str:
    now = int(time.time())
    return jwt.encode({"iss": ISS, "sub": sub, "iat": now, "exp": now + 300, **claims}, key, algorithm="RS256")


def _send(port: int, ca: TlsCA, cert: tuple[Path, Path], topic: str, md: tuple = ()) -> pb.Status:
    async def call() -> pb.Status:
        creds = grpc.ssl_channel_credentials(root_certificates=ca.path.read_bytes(),
                                             private_key=cert[1].read_bytes(), certificate_chain=cert[0].read_bytes())
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as channel:
            req = spb.SendMessageRequest(messages=[raw_message(topic, b"x")])
            resp = await sgrpc.MessagingServiceStub(channel).SendMessage(req, metadata=md, timeout=30)
            return resp.status

    return asyncio.run(call())


def test_grpc_client_certificate_is_the_identity(setup) -> None:
    server, ca, _ = setup
    port = server.ports["grpc"]
    device = ca.issue("device-1", client=True)
    assert _send(port, ca, device, "dev").code == pb.Code.OK
    assert _send(port, ca, device, "alice").code == pb.Code.FORBIDDEN  # judged as device-1
    # the official client without credentials signs with an empty access key: the certificate still counts
    md = tuple(Signature.metadata(client_config(port), "cert-client"))
    assert _send(port, ca, device, "dev", md).code == pb.Code.OK
    assert _send(port, ca, ca.issue("ghost", client=True), "dev").code == pb.Code.UNAUTHORIZED


def test_grpc_jwt_as_bearer_metadata_or_as_the_access_key(setup) -> None:
    server, ca, idp = setup
    port = server.ports["grpc"]
    device = ca.issue("device-1", client=True)
    token = _token(idp)
    bearer = (("authorization", f"Bearer {token}"),)
    assert _send(port, ca, device, "alice", bearer).code == pb.Code.OK  # the token wins over the certificate
    assert _send(port, ca, device, "dev", bearer).code == pb.Code.FORBIDDEN  # alice's rights only
    # the RocketMQ client's own header, the token as its access key (any secret key)
    signed = tuple(Signature.metadata(client_config(port, token, "unused"), "jwt-client"))
    assert _send(port, ca, device, "alice", signed).code == pb.Code.OK
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for bad in (_token(idp, exp=int(time.time()) - 3600), _token(stranger)):
        st = _send(port, ca, device, "alice", (("authorization", f"Bearer {bad}"),))
        assert st.code == pb.Code.UNAUTHORIZED and "invalid bearer token" in st.message
        signed = tuple(Signature.metadata(client_config(port, bad, "unused"), "jwt-client"))
        assert _send(port, ca, device, "alice", signed).code == pb.Code.UNAUTHORIZED


def test_amqp_plain_password_may_be_a_jwt_of_the_user(setup) -> None:
    server, _, idp = setup

    def connect(user: str, password: str) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", server.ports["amqp"], "/", pika.PlainCredentials(user, password), connection_attempts=1,
            socket_timeout=10))

    conn = connect("alice", _token(idp))
    ch = conn.channel()
    ch.queue_declare("alice-q")
    conn.close()
    for user, token in (("mallory", _token(idp)), ("alice", _token(idp, exp=int(time.time()) - 3600))):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as e:
            connect(user, token)
        assert "ACCESS_REFUSED" in str(e.value)
