"""The TLS knobs: each door's certificate or the shared one, ports only with a certificate,
and every bad value refused naming its knob (before anything listens)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tls_helpers import self_signed

from unimq.settings import UnimqSettings, load_settings


@pytest.fixture
def pair(tmp_path: Path) -> tuple[str, str]:
    cert, key = self_signed(tmp_path)
    return str(cert), str(key)


def test_without_certificates_no_tls_listener_opens() -> None:
    s = UnimqSettings(mqtt_wss_port=8084, amqp_tls_port=5671)
    assert (s.amqps_listener_port(), s.tls_listener_port(), s.wss_listener_port()) == (None, None, None)
    assert s.tls_files(s.http_tls_cert, s.http_tls_key) is None


def test_the_shared_certificate_serves_every_door_without_its_own(pair, tmp_path: Path) -> None:
    cert, key = pair
    (tmp_path / "own").mkdir()
    own_cert, own_key = (str(p) for p in self_signed(tmp_path / "own"))
    s = UnimqSettings(tls_cert=cert, tls_key=key, mqtt_tls_cert=own_cert, mqtt_tls_key=own_key, mqtt_wss_port=0)
    assert s.amqp_tls_files().cert == cert and s.mqtt_tls_files().cert == own_cert
    assert s.tls_files(s.grpc_tls_cert, s.grpc_tls_key).cert == cert
    assert (s.amqps_listener_port(), s.tls_listener_port(), s.wss_listener_port()) == (5671, 8883, 0)
    zero = UnimqSettings(tls_cert=cert, tls_key=key, amqp_port=0, mqtt_port=0)
    assert (zero.amqps_listener_port(), zero.tls_listener_port(), zero.wss_listener_port()) == (0, 0, None)


@pytest.mark.parametrize("bad, knob", [
    ({"tls_cert": "CERT"}, "tls_key"),
    ({"amqp_tls_key": "KEY"}, "amqp_tls_cert"),
    ({"http_tls_cert": "/nonexistent.pem", "http_tls_key": "KEY"}, "http_tls_cert"),
    ({"tls_verify_client": "sometimes"}, "tls_verify_client"),
    ({"tls_verify_client": "required"}, "tls_client_ca"),
    ({"tls_client_ca": "/nonexistent-ca.pem"}, "tls_client_ca"),
    ({"amqp_tls_port": 70000}, "amqp_tls_port"),
    ({"mqtt_wss_port": -1}, "mqtt_wss_port"),
])
def test_bad_tls_knobs_are_refused_by_name(bad: dict, knob: str, pair) -> None:
    cert, key = pair
    values = {k: cert if v == "CERT" else key if v == "KEY" else v for k, v in bad.items()}
    with pytest.raises(ValueError, match=knob):
        load_settings(overrides=values)
