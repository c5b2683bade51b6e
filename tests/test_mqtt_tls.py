"""MQTT over TLS: devices that only speak TLS (port 8883) connect unchanged.

A self-signed certificate made at test time is given to `unimq up` with
``--mqtt-tls-cert/--mqtt-tls-key``; paho (``tls_set`` with that certificate as
CA) and mosquitto_sub (``--cafile``) connect over TLS and exchange messages
with a plain-TCP client: one broker behind both listeners. A client that
speaks plain MQTT to the TLS port is dropped and the next one is served.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess

import pytest

from adapters.mqtt import codec as C
from mqtt_fixtures import Paho, config_file
from tls_helpers import self_signed

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def server(unimq_server, tmp_path):
    cert, key = self_signed(tmp_path)
    srv = unimq_server("--config", config_file(tmp_path), "--mqtt-tls-cert", str(cert), "--mqtt-tls-key", str(key))
    srv.cert = str(cert)
    return srv


class TlsPaho(Paho):
    """paho over TLS, trusting the test certificate (set up before connecting)."""

    def __init__(self, port: int, cafile: str, **kw) -> None:
        super().__init__(port, connect=False, **kw)
        self.c.tls_set(ca_certs=cafile, cert_reqs=ssl.CERT_REQUIRED)
        self.connect()


@pytest.mark.parametrize("v5", [False, True])
def test_paho_over_tls_talks_to_plain_tcp_clients(server, v5: bool) -> None:
    tls_port, plain_port = server.ports["mqtts"], server.ports["mqtt"]
    dev = TlsPaho(tls_port, server.cert, v5=v5)
    dev.subscribe("tls/cmd", qos=1)
    plain = Paho(plain_port, v5=v5)
    plain.subscribe("tls/up", qos=1)
    plain.publish("tls/cmd", b"to-the-device", qos=1)
    assert dev.get().payload == b"to-the-device"
    dev.publish("tls/up", b"from-the-device", qos=1)
    assert plain.get().payload == b"from-the-device"
    dev.disconnect()
    plain.disconnect()


@pytest.mark.skipif(not shutil.which("mosquitto_sub"), reason="mosquitto-clients is not installed")
def test_mosquitto_clients_over_tls(server) -> None:
    port = server.ports["mqtts"]
    common = ["-h", "127.0.0.1", "-p", str(port), "--cafile", server.cert]
    subprocess.run(["mosquitto_pub", *common, "-t", "tls/retained", "-m", "over-tls", "-r", "-q", "1"],
                   check=True, timeout=30, capture_output=True)
    out = subprocess.run(["mosquitto_sub", *common, "-t", "tls/retained", "-C", "1", "-W", "20"],
                         capture_output=True, timeout=30, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "over-tls"


def test_plain_mqtt_on_the_tls_port_is_dropped(server) -> None:
    port = server.ports["mqtts"]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(C.encode(C.Connect("not-tls", protocol_level=C.MQTT_311)))
        s.settimeout(10)
        try:
            data = s.recv(1024)
        except ConnectionResetError:
            data = b""
        assert not data.startswith(b"\x20")  # never a CONNACK: the handshake failed, the socket closes
    # the broker keeps serving TLS clients
    c = TlsPaho(port, server.cert)
    c.subscribe("tls/after", qos=0)
    c.disconnect()
