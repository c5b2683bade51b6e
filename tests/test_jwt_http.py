"""Issue 19: bearer JWTs on the HTTP door (and as MQTT passwords), verified against configured issuers' keys.

Keys are made here (``cryptography``): an RSA key given as a PEM public key file,
an EC key in a JWKS file (with a ``kid``), and a second EC key served by an OIDC
issuer on 127.0.0.1 (discovery document and JWKS over HTTP, ``jwt_oidc_discovery``).
Tokens are signed with PyJWT and sent with httpx. A valid token logs in as its
``sub`` (its permissions, and the roles of its ``roles`` claim); an expired one,
one not yet valid, one for another audience or issuer, one signed by a stranger's
key, and the algorithm confusions (``alg: none``, HS256 with the public key) get
401 with the door's problem JSON and ``WWW-Authenticate: Bearer error="invalid_token"``.
On the MQTT door (paho) a token is a password, as EMQX takes it: its ``sub`` must be
the CONNECT's user name; a bad one is CONNACK 0x86.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

pytestmark = pytest.mark.timeout(120)

ISS = "https://idp.test"
ROOT = ("root", "root-pw")


class _Idp(http.server.BaseHTTPRequestHandler):
    docs: dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = self.docs.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(body or b"{}")

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def setup(unimq_server, tmp_path: Path):
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = tmp_path / "idp-rsa.pem"
    pem.write_bytes(rsa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
    ec_key = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key()))
    jwk.update(kid="ec-1", use="sig", alg="ES256")
    jwks = tmp_path / "idp-jwks.json"
    jwks.write_text(json.dumps({"keys": [jwk]}))
    # an OIDC issuer on loopback: discovery document and JWKS
    oidc_key = ec.generate_private_key(ec.SECP256R1())
    idp = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Idp)
    oidc_iss = f"http://127.0.0.1:{idp.server_address[1]}"
    ojwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(oidc_key.public_key()))
    ojwk.update(kid="oidc-1", alg="ES256")
    _Idp.docs = {"/.well-known/openid-configuration": json.dumps({"issuer": oidc_iss,
                                                                   "jwks_uri": oidc_iss + "/jwks"}).encode(),
                 "/jwks": json.dumps({"keys": [ojwk]}).encode()}
    threading.Thread(target=idp.serve_forever, daemon=True).start()
    server = unimq_server(
        "--set", f'jwt_issuers=["{ISS}", "{oidc_iss}"]', "--set", f'jwt_key_files=["{pem}", "{jwks}"]',
        "--set", "jwt_oidc_discovery=true", "--set", "jwt_audience=unimq", "--set", "jwt_roles_claim=roles")
    base = server.url().rstrip("/")
    assert httpx.post(base + "/v1/admin/users", json={"name": ROOT[0], "password": ROOT[1], "admin": True}
                      ).status_code == 201
    admin = httpx.Client(base_url=base, auth=ROOT, timeout=30)
    for body in ({"subject": "alice", "resource": "topic", "pattern": "alice/#", "actions": ["publish", "create"]},
                 {"subject": "alice", "resource": "topic", "pattern": "alice", "actions": ["publish", "create"]},
                 {"subject": "role:writers", "resource": "topic", "pattern": "shared", "actions": ["publish", "create"]}):
        assert admin.post("/v1/admin/acl", json=body).status_code == 201
    keys = {"rsa": rsa_key, "ec": ec_key, "oidc": oidc_key, "oidc_iss": oidc_iss, "mqtt": server.ports["mqtt"]}
    yield base, keys
    admin.close()
    idp.shutdown()


def _token(key, alg: str = "RS256", kid: str | None = None, **claims) -> str:
    now = int(time.time())
    body = {"iss": ISS, "sub": "alice", "aud": "unimq", "iat": now, "exp": now + 300, **claims}
    body = {k: v for k, v in body.items() if v is not None}
    return jwt.encode(body, key, algorithm=alg, headers={"kid": kid} if kid else None)


def _hs256_with(secret: bytes, claims: dict) -> str:
    """The algorithm confusion: an HMAC token whose secret is the issuer's public key (PyJWT will not make one)."""
    import base64
    import hashlib
    import hmac

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    signing = b64(b'{"alg":"HS256","typ":"JWT"}') + "." + b64(json.dumps(claims).encode())
    return signing + "." + b64(hmac.new(secret, signing.encode(), hashlib.sha256).digest())


def _post(base: str, topic: str, token: str) -> httpx.Response:
    return httpx.post(f"{base}/v1/topics/{topic}/messages", content=b"x",
                      headers={"authorization": f"Bearer {token}"}, timeout=30)


def test_valid_tokens_log_in_as_their_subject(setup) -> None:
    base, k = setup
    assert _post(base, "alice", _token(k["rsa"])).status_code == 200  # PEM key, no kid
    assert _post(base, "alice", _token(k["ec"], "ES256", "ec-1")).status_code == 200  # JWKS, by kid
    r = _post(base, "shared", _token(k["rsa"]))
    assert r.status_code == 403 and "alice" in r.json()["message"]  # alice's permissions, not more
    # roles from the token: bob is in no store, his token says he writes
    assert _post(base, "shared", _token(k["rsa"], sub="bob", roles=["writers"])).status_code == 200
    assert _post(base, "shared", _token(k["rsa"], sub="carol")).status_code == 403
    # OIDC discovery: the loopback issuer's key, found through its discovery document
    assert _post(base, "alice", _token(k["oidc"], "ES256", "oidc-1", iss=k["oidc_iss"])).status_code == 200


def test_bad_tokens_get_401_problem_json(setup) -> None:
    base, k = setup
    now = int(time.time())
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = k["rsa"].public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo)
    bad = {
        "expired": _token(k["rsa"], exp=now - 3600),
        "not yet valid": _token(k["rsa"], nbf=now + 3600),
        "another audience": _token(k["rsa"], aud="someone-else"),
        "no audience": _token(k["rsa"], aud=None),
        "another issuer": _token(k["rsa"], iss="https://evil.test"),
        "a stranger's key": _token(stranger),
        "no exp": _token(k["rsa"], exp=None),
        "alg none": jwt.encode({"iss": ISS, "sub": "alice", "aud": "unimq", "exp": now + 300}, None, algorithm="none"),
        "HS256 with the public key": _hs256_with(public_pem, {"iss": ISS, "sub": "alice", "aud": "unimq",
                                                              "exp": now + 300}),
        "garbage": "a.b.c",
    }
    for what, token in bad.items():
        r = _post(base, "alice", token)
        assert r.status_code == 401, what
        assert r.json()["error"] == "UNAUTHORIZED", what
        assert 'error="invalid_token"' in r.headers["www-authenticate"], what
    # an API key still works beside JWTs
    assert httpx.get(f"{base}/healthz").status_code == 200


def test_a_jwt_as_the_mqtt_password(setup) -> None:
    from mqtt_fixtures import RawClient

    from adapters.mqtt import packets as C

    _, k = setup
    now = int(time.time())
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for user, token, want in (("alice", _token(k["rsa"]), 0),
                              ("mallory", _token(k["rsa"]), C.RC_BAD_USERNAME_OR_PASSWORD),  # not its subject
                              ("alice", _token(k["rsa"], exp=now - 3600), C.RC_BAD_USERNAME_OR_PASSWORD),
                              ("alice", _token(stranger), C.RC_BAD_USERNAME_OR_PASSWORD)):
        c = RawClient(k["mqtt"], C.MQTT_5)
        assert c.connect(f"jwt-{user}", username=user, password=token.encode()).reason_code == want, (user, want)
        if want == 0:
            c.send(C.Publish("alice/temp", b"1", 1, packet_id=1))
            assert c.recv_type(C.PubAck).reason_code in (0, 0x10)
            c.send(C.Publish("shared", b"1", 1, packet_id=2))
            assert c.recv_type(C.PubAck).reason_code == C.RC_NOT_AUTHORIZED  # alice's rights only
        c.close()
