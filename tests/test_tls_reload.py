"""SIGHUP reloads the doors' certificate files without dropping a connection.

A real `unimq up` serves every door over TLS with a certificate from one CA.
Clients connect (pika over AMQPS, paho over MQTT/TLS, an httpx keep-alive
connection over HTTPS, a grpcio secure channel); then the certificate files are
replaced in place by a certificate from a second CA and the process gets SIGHUP.
Every open connection keeps working, and a new handshake on each door presents
the new certificate (a client trusting only the second CA gets through). A
reload of files that do not load (a key of another certificate) is refused and
the current certificate keeps serving.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
import time
from pathlib import Path

import grpc
import httpx
import pika
import pytest
from cryptography.x509.oid import NameOID
from mqtt_fixtures import Paho
from test_tls_doors import _grpc_send, _pika_params
from tls_helpers import TlsCA, peer_certificate

pytestmark = pytest.mark.timeout(120)


def _cn(port: int, ca: TlsCA) -> str:
    cert = peer_certificate("127.0.0.1", port, ca.path)
    return cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


def _eventually_cn(port: int, ca: TlsCA, want: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    seen: object = None
    while time.monotonic() < deadline:
        try:
            seen = _cn(port, ca)
            if seen == want:
                return
        except (ssl.SSLError, OSError) as e:
            seen = e
        time.sleep(0.1)
    raise AssertionError(f"port {port} still presents {seen!r}, not {want!r}")


def test_sighup_reloads_certificates_and_keeps_connections(unimq_server, tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    ca1, ca2 = TlsCA(tmp_path / "one", "ca-one"), TlsCA(tmp_path / "two", "ca-two")
    cert, key = ca1.issue("server-1", cert_path=tmp_path / "server.pem", key_path=tmp_path / "server.key")
    server = unimq_server("--tls-cert", str(cert), "--tls-key", str(key))
    ctx1 = ssl.create_default_context(cafile=str(ca1.path))
    tls_ports = {door: server.ports[door] for door in ("amqps", "mqtts", "http", "grpc")}
    for door in ("amqps", "mqtts", "http"):
        assert _cn(tls_ports[door], ca1) == "server-1"

    # connections opened with the first certificate
    amqp = pika.BlockingConnection(_pika_params(tls_ports["amqps"], ctx1))
    channel = amqp.channel()
    channel.queue_declare("reload_q", durable=True)
    mqtt = Paho(tls_ports["mqtts"], connect=False)
    mqtt.c.tls_set_context(ctx1)
    mqtt.connect()
    mqtt.subscribe("reload/t", qos=1)
    https = httpx.Client(verify=ctx1, timeout=10)
    base = f"https://127.0.0.1:{tls_ports['http']}"
    assert https.get(f"{base}/healthz").status_code == 200

    grpc_channel = grpc.secure_channel(  # grpcio's blocking API: one HTTP/2 connection kept open
        f"127.0.0.1:{tls_ports['grpc']}", grpc.ssl_channel_credentials(ca1.path.read_bytes()))
    grpc.channel_ready_future(grpc_channel).result(timeout=10)

    # a reload of a broken pair is refused: the old certificate keeps serving
    good_key = key.read_bytes()
    key.write_bytes(ca2.issue("unrelated")[1].read_bytes())
    server.proc.send_signal(signal.SIGHUP)
    time.sleep(1.0)  # nothing to wait for: the point is that nothing changes
    assert _cn(tls_ports["amqps"], ca1) == "server-1"
    key.write_bytes(good_key)

    # the files are replaced in place by a certificate of the second CA, then SIGHUP
    ca2.issue("server-2", cert_path=cert, key_path=key)
    server.proc.send_signal(signal.SIGHUP)
    for door in ("amqps", "mqtts", "http"):
        _eventually_cn(tls_ports[door], ca2, "server-2")
    creds2 = grpc.ssl_channel_credentials(ca2.path.read_bytes())
    from rocketmq.grpc_protocol import definition_pb2 as pb

    assert asyncio.run(_grpc_send(tls_ports["grpc"], creds2)) == pb.Code.OK  # a new channel trusting only CA two

    # every connection opened before the reload still works
    channel.basic_publish("", "reload_q", b"after reload", pika.BasicProperties(delivery_mode=2))
    method, _, body = channel.basic_get("reload_q", auto_ack=True)
    for _ in range(50):
        if method is not None:
            break
        time.sleep(0.1)
        method, _, body = channel.basic_get("reload_q", auto_ack=True)
    assert body == b"after reload"
    amqp.close()
    mqtt.publish("reload/t", b"still here", qos=1)
    assert mqtt.get().payload == b"still here"
    mqtt.disconnect()
    assert https.get(f"{base}/healthz").status_code == 200
    https.close()

    from rocketmq.grpc_protocol import service_pb2 as spb
    from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc

    r = sgrpc.MessagingServiceStub(grpc_channel).QueryRoute(
        spb.QueryRouteRequest(topic=pb.Resource(name="reload_t")), timeout=10)
    assert r.status.code == pb.Code.OK
    grpc_channel.close()
    assert server.proc.poll() is None
    assert "keeping the old certificate" in server.stderr()
