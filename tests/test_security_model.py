"""Issue 19: the identity model's pieces (hashes, permission rules, imports, login parsing) and a login fuzz.

- every hash scheme verifies its own password and nothing else; a malformed entry never matches;
- the permission rules as the README states them (MQTT filters, shell patterns, carrier topics,
  groups, vhost regular expressions, roles, the superuser);
- hypothesis: the HTTP door's Authorization parsing never raises anything but its own error on
  any bytes, and no malformed or random header logs in to a real server.
"""

from __future__ import annotations

import base64
import hashlib

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.cloudevents.http_auth import Basic, Bearer, MalformedCredentials, parse_authorization
from gateway.access.imports import mosquitto, rabbitmq_definitions
from gateway.access.model import Permission, Snapshot, User, new_api_key, parse_actions, split_api_key
from gateway.access.passwords import hash_password, is_hash, needs_rehash, rabbit_hash, verify_password
from gateway.access.permissions import Rules


def test_scrypt_hashes_are_salted_and_verify_only_their_password() -> None:
    a, b = hash_password("pw"), hash_password("pw")
    assert a != b and a.startswith("$scrypt$n=16384,r=8,p=1$")
    assert verify_password(a, "pw") and verify_password(b, b"pw")
    assert not verify_password(a, "pw ") and not verify_password(a, "")
    assert not verify_password(a, "pw\x00") and not verify_password(a, b"pw\x00\x00")  # HMAC's zero padding
    with pytest.raises(ValueError):
        hash_password("pw\x00")
    assert not needs_rehash(a)
    cheap = hash_password("pw", n=1024)
    assert verify_password(cheap, "pw") and needs_rehash(cheap)


def test_imported_schemes_verify() -> None:
    salt = b"saltsalt"
    six = f"$6${base64.b64encode(salt).decode()}${base64.b64encode(hashlib.sha512(b'pw' + salt).digest()).decode()}"
    seven_digest = hashlib.pbkdf2_hmac("sha512", b"pw", salt, 101, dklen=64)
    seven = f"$7$101${base64.b64encode(salt).decode()}${base64.b64encode(seven_digest).decode()}"
    for entry in (six, seven, "$rabbit-sha256$" + rabbit_hash("pw"), "$rabbit-sha512$" + rabbit_hash("pw", algorithm="sha512")):
        assert is_hash(entry) and verify_password(entry, "pw") and not verify_password(entry, "pW"), entry
    # RabbitMQ's algorithm: base64(salt4 + sha256(salt4 + password))
    raw = base64.b64decode(rabbit_hash("secret", salt=b"\x01\x02\x03\x04"))
    assert raw[:4] == b"\x01\x02\x03\x04" and raw[4:] == hashlib.sha256(b"\x01\x02\x03\x04secret").digest()


@pytest.mark.parametrize("entry", ["", "pw", "$scrypt$", "$scrypt$n=3,r=8,p=1$AA==$AA==", "$scrypt$n=16384$AA==$AA==",
                                   "$7$0$AA==$AA==", "$7$x$AA==$AA==", "$6$!!$AA==", "$rabbit-sha256$AAAA",
                                   "$scrypt$n=1048576,r=64,p=16$AA==$AA==", "$2b$12$abc"])
def test_malformed_entries_never_match(entry: str) -> None:
    assert not verify_password(entry, "pw") and not verify_password(entry, "")


def test_api_keys() -> None:
    token, key = new_api_key()
    key_id, secret = split_api_key(token)
    assert key_id == key.key_id and key.matches(secret) and not key.matches(secret + "x")
    assert secret not in key.secret_sha256
    assert split_api_key("umk_short_x") is None and split_api_key("Basic abc") is None


def _rules(*perms: Permission, users: tuple[User, ...] = ()) -> Rules:
    return Rules(Snapshot({u.name: u for u in users}, {p.key: p for p in perms}))


def test_topic_rules() -> None:
    r = _rules(Permission("a", "topic", "sensors/+/temp", parse_actions("publish,consume")),
               Permission("a", "topic", "orders-*", parse_actions("all")),
               Permission("b", "topic", "sensors/#", parse_actions("subscribe")))
    # MQTT names and filters
    assert r.allows("a", "publish", "topic", "sensors/k1/temp", mqtt=True)
    assert not r.allows("a", "publish", "topic", "sensors/k1/humidity", mqtt=True)
    assert r.allows("a", "subscribe", "topic", "sensors/k1/temp", mqtt=True)
    assert not r.allows("a", "subscribe", "topic", "sensors/#", mqtt=True)  # wider than granted
    assert r.allows("b", "subscribe", "topic", "sensors/+/temp", mqtt=True)
    # unified topics: the carrier of MQTT topics may be written, read only when covered whole
    assert r.allows("a", "publish", "topic", "sensors")
    assert not r.allows("a", "subscribe", "topic", "sensors")
    assert r.allows("b", "subscribe", "topic", "sensors") and not r.allows("b", "publish", "topic", "sensors")
    # shell patterns
    assert r.allows("a", "delete", "topic", "orders-eu") and not r.allows("a", "delete", "topic", "orders")
    assert not r.allows("nobody", "publish", "topic", "orders-eu")
    assert not r.allows(None, "publish", "topic", "orders-eu")


def test_groups_roles_admin_and_anonymous() -> None:
    r = _rules(Permission("role:ops", "group", "billing-*", parse_actions("consume")),
               Permission("boss", "admin", "*", parse_actions("admin")),
               Permission("anonymous", "topic", "public/#", parse_actions("subscribe")),
               Permission("auditor", "admin", "users", parse_actions("admin")),
               users=(User("carol", roles=("ops",)), User("boss"), User("auditor")))
    assert r.allows("carol", "subscribe", "group", "billing-eu")
    assert not r.allows("carol", "subscribe", "group", "shipping")
    assert not r.allows("role:ops", "publish", "topic", "x")
    assert r.allows("boss", "delete", "topic", "anything") and r.is_superuser("boss")
    assert r.allows("auditor", "admin", "admin", "users") and not r.allows("auditor", "admin", "admin", "acl")
    assert r.allows(None, "subscribe", "topic", "public/x", mqtt=True)
    assert not r.allows(None, "publish", "topic", "public/x", mqtt=True)


def test_vhost_rules_are_rabbitmqs() -> None:
    r = _rules(Permission("shop", "vhost", "/", configure="^shop\\.", write=".*", read=""))
    assert r.may_open_vhost("shop", "/") and not r.may_open_vhost("shop", "other")
    assert r.vhost_allows("shop", "/", "configure", "shop.orders")
    assert not r.vhost_allows("shop", "/", "configure", "billing")
    assert r.vhost_allows("shop", "/", "write", "amq.topic")
    assert not r.vhost_allows("shop", "/", "read", "shop.orders")  # empty: nothing


def test_imports() -> None:
    got = mosquitto("u:$6$AA==$AA==\n", "topic read pub/#\nuser u\ntopic readwrite a/b\ntopic deny c\n")
    assert set(got.users) == {"u"}
    perms = {(p.subject, p.pattern): p.actions for p in got.permissions}
    assert perms == {("anonymous", "pub/#"): {"subscribe"}, ("u", "a/b"): {"subscribe", "publish"}}
    assert len(got.skipped) == 1
    with pytest.raises(Exception, match="line 1"):
        mosquitto("u:plain\n")
    defs = rabbitmq_definitions({"users": [{"name": "x", "password_hash": "abc", "hashing_algorithm": "rabbit_password_hashing_md5"}]})
    assert not defs.users and "not supported" in defs.skipped[0]


def test_basic_and_bearer_parsing() -> None:
    assert parse_authorization(b"Basic " + base64.b64encode(b"al:ice:pw")) == Basic("al", "ice:pw")
    assert parse_authorization(b"basic " + base64.b64encode("jos\u00e9:p\u00e4ss".encode())) == Basic("jos\u00e9", "p\u00e4ss")
    assert parse_authorization(b"Bearer umk_0123456789abcdef_x-y") == Bearer("umk_0123456789abcdef_x-y")
    for bad in (b"", b"Basic", b"Basic ", b"Basic !!!", b"Basic " + base64.b64encode(b"nocolon"),
                b"Basic " + base64.b64encode(b":pw"), b"Basic " + base64.b64encode(b"\xff\xfe:x"),
                b"Digest abc", b"Bearer a b", b"Bearer \x00"):
        with pytest.raises(MalformedCredentials):
            parse_authorization(bad)
    assert "pw" not in repr(Basic("u", "pw"))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_parsing_any_bytes_never_crashes(value: bytes) -> None:
    try:
        got = parse_authorization(value)
    except MalformedCredentials:
        return
    assert isinstance(got, (Basic, Bearer))


_header_values = st.one_of(
    st.binary(max_size=200).map(lambda b: b"Basic " + base64.b64encode(b)),
    st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=120).map(lambda t: b"Bearer " + t.encode()),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=120).map(str.encode),
    st.sampled_from([b"Basic " + base64.b64encode(b"root:root-pw ")[:-1], b"Basic " + base64.b64encode(b"root:root-pW"),  # close misses
                     b"Bearer umk_0000000000000000_x", b"Basic " + base64.b64encode(b"root:")]),
)


def test_no_malformed_or_random_header_logs_in(unimq_server) -> None:
    server = unimq_server()
    url = server.url(path="/v1/admin/users")
    assert httpx.post(url, json={"name": "root", "password": "root-pw", "admin": True}).status_code == 201
    assert httpx.get(url, auth=("root", "root-pw")).status_code == 200

    with httpx.Client(timeout=10) as c:
        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        @given(_header_values)
        def attempt(value: bytes) -> None:
            r = c.get(url, headers={"authorization": value.strip() or b"x"})
            assert r.status_code == 401, (value, r.status_code, r.text)

        attempt()
    assert httpx.get(server.url(path="/healthz")).status_code == 200  # still serving
