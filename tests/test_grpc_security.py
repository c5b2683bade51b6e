"""TLS, signed-request authentication and topic auto-creation of the gRPC door.

TLS: a self-signed certificate made here (``cryptography``) is given to
`unimq up` with ``--grpc-tls-cert/--grpc-tls-key``. The official client turns
TLS on with ``tls_enable=True`` and ``grpc.ssl_channel_credentials()`` with no
custom CA, so its run happens in a child process whose
``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` names our certificate (grpc reads that
variable once per process).

Auth: with ``grpc_credentials`` configured, the client's MQv2-HMAC-SHA1
signature is verified; a wrong secret gets the v2 UNAUTHORIZED status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import pytest
from rocketmq import FilterExpression
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as spb
from rocketmq.grpc_protocol import service_pb2_grpc as sgrpc
from rocketmq.v5.util import Signature

from tls_helpers import self_signed
from grpc_helpers import (
    client_config,
    endpoints_of,
    message,
    producer,
    raw_message,
    receive_until,
    simple_consumer,
    started,
    write_config,
)

pytestmark = pytest.mark.timeout(120)
Code = pb.Code
REPO = Path(__file__).resolve().parent.parent




TLS_CLIENT = textwrap.dedent(
    """
    import json, sys
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer
    port = int(sys.argv[1])
    cfg = ClientConfiguration(f"127.0.0.1:{port}", Credentials(), request_timeout=5)
    p = Producer(cfg, ("tls_t",), tls_enable=True)
    p.startup()
    m = Message(); m.topic = "tls_t"; m.body = b"over tls"
    mid = p.send(m).message_id
    p.shutdown()
    c = SimpleConsumer(cfg, "g-tls", {"tls_t": FilterExpression()}, await_duration=2, tls_enable=True)
    c.startup()
    got = []
    for _ in range(10):
        for x in c.receive(8, 30):
            c.ack(x); got.append(x.body.decode())
        if got:
            break
    c.shutdown()
    print(json.dumps({"sent": mid, "got": got}))
    """
)


def test_tls_with_a_certificate_from_the_command_line(unimq_server, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server = unimq_server("--config", str(write_config(tmp_path)), "--grpc-tls-cert", str(cert), "--grpc-tls-key", str(key))
    port = server.ports["grpc"]
    env = dict(os.environ, GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=str(cert), PYTHONPATH=str(REPO))
    run = subprocess.run(
        [sys.executable, "-c", TLS_CLIENT, str(port)], env=env, capture_output=True, text=True, timeout=90
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["got"] == ["over tls"] and out["sent"]

    async def plaintext_refused() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await sgrpc.MessagingServiceStub(channel).Heartbeat(spb.HeartbeatRequest(), timeout=3)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE

    import asyncio

    asyncio.run(plaintext_refused())


async def _unauthorized_status(port: int, metadata: list[tuple[str, str]] | None) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = sgrpc.MessagingServiceStub(channel)
        r = await stub.QueryRoute(
            spb.QueryRouteRequest(topic=pb.Resource(name="auth_t"), endpoints=endpoints_of(port)),
            metadata=metadata, timeout=5,
        )
        return r.status.code


def test_signed_requests_are_verified(unimq_server, tmp_path: Path) -> None:
    config = write_config(tmp_path, top='grpc_credentials = { "app-ak" = "app-secret" }')
    port = unimq_server("--config", str(config)).ports["grpc"]
    # the official client, right secret: everything works
    with started(producer(port, ("auth_t",), ak="app-ak", sk="app-secret")) as p:
        mid = p.send(message("auth_t", b"signed")).message_id
    with started(simple_consumer(port, "g-auth", {"auth_t": FilterExpression()}, ak="app-ak", sk="app-secret")) as c:
        assert [m.message_id for m in receive_until(c, 1)] == [mid]
    # wrong secret, unknown key, no header: the v2 UNAUTHORIZED status
    import asyncio

    wrong = Signature.metadata(client_config(port, "app-ak", "not-the-secret"), "test-client")
    unknown = Signature.metadata(client_config(port, "who", "app-secret"), "test-client")
    assert asyncio.run(_unauthorized_status(port, wrong)) == Code.UNAUTHORIZED
    assert asyncio.run(_unauthorized_status(port, unknown)) == Code.UNAUTHORIZED
    assert asyncio.run(_unauthorized_status(port, None)) == Code.UNAUTHORIZED
    right = Signature.metadata(client_config(port, "app-ak", "app-secret"), "test-client")
    assert asyncio.run(_unauthorized_status(port, right)) == Code.OK
    # and the official client with a wrong secret cannot send
    with started(producer(port, ("auth_t",), ak="app-ak", sk="wrong")) as p:
        with pytest.raises(Exception):
            p.send(message("auth_t", b"refused"))


def test_without_auto_creation_an_unknown_topic_is_not_found(unimq_server, tmp_path: Path) -> None:
    port = unimq_server("--config", str(write_config(tmp_path, top="auto_create_topics = false"))).ports["grpc"]

    async def go() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = sgrpc.MessagingServiceStub(channel)
            r = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="nope")), timeout=5)
            assert r.status.code == Code.TOPIC_NOT_FOUND
            s = await stub.SendMessage(spb.SendMessageRequest(messages=[raw_message("nope", b"x")]), timeout=5)
            assert s.status.code == Code.TOPIC_NOT_FOUND
            r = await stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="fifo_t")), timeout=5)
            assert r.status.code == Code.OK  # declared topics exist

    import asyncio

    asyncio.run(go())
