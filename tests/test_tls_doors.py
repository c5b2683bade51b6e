"""TLS on every door, with real clients: AMQPS, HTTPS, MQTT over WSS, gRPC over TLS.

One certificate for every door (``--tls-cert/--tls-key``), signed by a CA made at
test time; the clients trust that CA only. Each door serves a client of its own
ecosystem over TLS (pika and aio-pika, httpx and curl, paho over wss://, grpcio's
secure channel with the RocketMQ stubs); a client that speaks plaintext to a TLS
port is dropped and the next one is served. With ``--tls-verify-client required``
a client without a certificate from the client CA is refused on every door, and
one with it is served; ``optional`` serves both but refuses a certificate from
another CA.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import socket
import ssl
import subprocess
import uuid
from pathlib import Path

import grpc
import httpx
import pika
import pytest
from grpc_helpers import endpoints_of, raw_message
from mqtt_fixtures import Paho
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc
from tls_helpers import TlsCA

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ca(tmp_path: Path) -> TlsCA:
    return TlsCA(tmp_path)


def _tls_server(unimq_server, ca: TlsCA, *extra: str):
    cert, key = ca.issue("server")
    return unimq_server("--tls-cert", str(cert), "--tls-key", str(key), "--mqtt-wss-port", "0", *extra)


def _client_context(ca: TlsCA, client: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.path))
    if client is not None:
        ctx.load_cert_chain(*client)
    return ctx


def _pika_params(port: int, ctx: ssl.SSLContext | None) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"),
        ssl_options=pika.SSLOptions(ctx, "localhost") if ctx is not None else None,
        connection_attempts=1, socket_timeout=10, blocked_connection_timeout=10,
    )


def _amqps_round_trip(port: int, ctx: ssl.SSLContext) -> None:
    """pika publishes over AMQPS, aio-pika consumes over AMQPS: both through the TLS listener."""
    queue = "tls-" + uuid.uuid4().hex[:8]
    conn = pika.BlockingConnection(_pika_params(port, ctx))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"over amqps", pika.BasicProperties(delivery_mode=2))
    conn.close()

    async def consume() -> bytes:
        import aio_pika

        connection = await aio_pika.connect(f"amqps://guest:guest@127.0.0.1:{port}/", ssl_context=ctx, timeout=10)
        async with connection:
            channel = await connection.channel()
            q = await channel.declare_queue(queue, durable=True)
            msg = await q.get(timeout=10, fail=False)
            for _ in range(50):
                if msg is not None:
                    break
                await asyncio.sleep(0.1)
                msg = await q.get(timeout=10, fail=False)
            assert msg is not None, "nothing to consume over AMQPS"
            await msg.ack()
            return msg.body

    assert asyncio.run(consume()) == b"over amqps"


def test_pika_and_aio_pika_over_amqps(unimq_server, ca: TlsCA) -> None:
    server = _tls_server(unimq_server, ca)
    port = server.ports["amqps"]
    _amqps_round_trip(port, _client_context(ca))
    # plain AMQP on the TLS port: the handshake fails, the client is dropped ...
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(_pika_params(port, None))
    # ... and the next client is served; the plain port still speaks plain AMQP
    _amqps_round_trip(port, _client_context(ca))
    pika.BlockingConnection(_pika_params(server.ports["amqp"], None)).close()


def test_https_with_httpx_and_curl(unimq_server, ca: TlsCA) -> None:
    server = _tls_server(unimq_server, ca)
    base = f"https://127.0.0.1:{server.ports['http']}"
    with httpx.Client(verify=_client_context(ca), timeout=10) as client:
        r = client.post(f"{base}/v1/topics/tls_http/messages", content=b"over https")
        assert r.status_code < 300, r.text
        popped = client.post(f"{base}/v1/topics/tls_http/groups/g/pop?max=4&wait_s=5").json()
        assert [base64.b64decode(m["body_base64"]) for m in popped["messages"]] == [b"over https"], popped
    # plaintext HTTP on the HTTPS port is dropped, the next HTTPS client is served
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.ports['http']}/healthz", timeout=10)
    if shutil.which("curl"):
        out = subprocess.run(["curl", "-sS", "--cacert", str(ca.path), f"{base}/healthz"],
                             capture_output=True, text=True, timeout=30, check=False)
        assert out.returncode == 0, out.stderr
        assert '"ok"' in out.stdout
    assert httpx.get(f"{base}/healthz", verify=_client_context(ca), timeout=10).status_code == 200


class WssPaho(Paho):
    """paho over wss://, trusting the test CA (and presenting a client certificate if given)."""

    def __init__(self, port: int, ca: TlsCA, client: tuple[Path, Path] | None = None, **kw) -> None:
        super().__init__(port, connect=False, transport="websockets", **kw)
        self.c.tls_set_context(_client_context(ca, client))
        self.connect()


def test_paho_over_wss_talks_to_plain_tcp_clients(unimq_server, ca: TlsCA) -> None:
    server = _tls_server(unimq_server, ca)
    dev = WssPaho(server.ports["mqttwss"], ca)
    dev.subscribe("wss/cmd", qos=1)
    plain = Paho(server.ports["mqtt"])
    plain.subscribe("wss/up", qos=1)
    plain.publish("wss/cmd", b"to-the-browser", qos=1)
    assert dev.get().payload == b"to-the-browser"
    dev.publish("wss/up", b"from-the-browser", qos=1)
    assert plain.get().payload == b"from-the-browser"
    dev.disconnect()
    plain.disconnect()
    # a plain WebSocket handshake on the WSS port is dropped; the next wss client is served
    with socket.create_connection(("127.0.0.1", server.ports["mqttwss"]), timeout=10) as s:
        s.sendall(b"GET /mqtt HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        s.settimeout(10)
        try:
            data = s.recv(1024)
        except ConnectionResetError:
            data = b""
        assert not data.startswith(b"HTTP/1.1 101")
    again = WssPaho(server.ports["mqttwss"], ca)
    again.disconnect()


async def _grpc_send(port: int, credentials: grpc.ChannelCredentials) -> int:
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        stub = sgrpc.MessagingServiceStub(channel)
        route = await stub.QueryRoute(
            spb.QueryRouteRequest(topic=pb.Resource(name="tls_grpc"), endpoints=endpoints_of(port)), timeout=10)
        assert route.status.code == pb.Code.OK
        sent = await stub.SendMessage(spb.SendMessageRequest(messages=[raw_message("tls_grpc", b"over grpc tls")]),
                                      timeout=10)
        return sent.status.code


def test_grpc_secure_channel_with_the_rocketmq_stubs(unimq_server, ca: TlsCA) -> None:
    server = _tls_server(unimq_server, ca)
    port = server.ports["grpc"]
    creds = grpc.ssl_channel_credentials(root_certificates=ca.path.read_bytes())
    assert asyncio.run(_grpc_send(port, creds)) == pb.Code.OK

    async def plaintext() -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await sgrpc.MessagingServiceStub(channel).Heartbeat(spb.HeartbeatRequest(), timeout=3)
            return e.value.code()

    assert asyncio.run(plaintext()) == grpc.StatusCode.UNAVAILABLE
    assert asyncio.run(_grpc_send(port, creds)) == pb.Code.OK


def test_required_client_certificates_on_every_door(unimq_server, ca: TlsCA, tmp_path: Path) -> None:
    client = ca.issue("device-1", client=True)
    (tmp_path / "other").mkdir()
    stranger = TlsCA(tmp_path / "other", name="other-ca").issue("stranger", client=True)
    server = _tls_server(unimq_server, ca, "--tls-client-ca", str(ca.path), "--tls-verify-client", "required")
    http = f"https://127.0.0.1:{server.ports['http']}/healthz"

    # with a certificate the CA signed: every door serves
    _amqps_round_trip(server.ports["amqps"], _client_context(ca, client))
    assert httpx.get(http, verify=_client_context(ca, client), timeout=10).status_code == 200
    WssPaho(server.ports["mqttwss"], ca, client).disconnect()
    creds = grpc.ssl_channel_credentials(ca.path.read_bytes(), client[1].read_bytes(), client[0].read_bytes())
    assert asyncio.run(_grpc_send(server.ports["grpc"], creds)) == pb.Code.OK

    # without one, or with another CA's: refused in the handshake
    for cert in (None, stranger):
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(_pika_params(server.ports["amqps"], _client_context(ca, cert)))
        with pytest.raises(httpx.HTTPError):
            httpx.get(http, verify=_client_context(ca, cert), timeout=10)
        with pytest.raises((ssl.SSLError, OSError)):
            _mqtts_handshake(server.ports["mqtts"], _client_context(ca, cert))
    with pytest.raises(grpc.aio.AioRpcError):
        asyncio.run(_grpc_send(server.ports["grpc"], grpc.ssl_channel_credentials(ca.path.read_bytes())))


def _mqtts_handshake(port: int, ctx: ssl.SSLContext) -> None:
    """Open TLS to the MQTT over TLS port and read: a refused client certificate ends here.

    (TLS 1.3 servers report a refused client certificate after the client's side of
    the handshake completed, so the refusal shows at the first read.)
    """
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as s:
        s.sendall(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")  # CONNECT, client id ""
        s.settimeout(10)
        data = s.recv(4)
        if not data:
            raise ConnectionResetError("closed by the server")
        assert data[0] == 0x20


def test_optional_client_certificates(unimq_server, ca: TlsCA, tmp_path: Path) -> None:
    client = ca.issue("device-2", client=True)
    (tmp_path / "other").mkdir()
    stranger = TlsCA(tmp_path / "other", name="other-ca").issue("stranger", client=True)
    server = _tls_server(unimq_server, ca, "--tls-client-ca", str(ca.path), "--tls-verify-client", "optional")
    http = f"https://127.0.0.1:{server.ports['http']}/healthz"
    for cert in (None, client):
        assert httpx.get(http, verify=_client_context(ca, cert), timeout=10).status_code == 200
        _mqtts_handshake(server.ports["mqtts"], _client_context(ca, cert))
    with pytest.raises(httpx.HTTPError):
        httpx.get(http, verify=_client_context(ca, stranger), timeout=10)
