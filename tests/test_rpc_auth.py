"""The internal RPC authenticates: a cluster secret proved by challenge-response, and mutual TLS.

First over real sockets in this process (an RpcServer and RpcClients with the
credentials each test gives them): the right secret is served, a client
without it or with another one is refused with :class:`RpcAuthError` and the
server logs the refusal with the peer's address, and the secret itself never
crosses the wire. Then a separated deployment of real processes started with
``--cluster-secret-file`` (and another with mutual TLS): it serves end to end,
and a raw RpcClient without the credential is refused by every port.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path
from typing import Any

import pytest
from tls_helpers import TlsCA

from core_broker.model import Message
from core_broker.remoting import auth
from core_broker.remoting.client import PeerUnavailableError, RpcClient
from core_broker.remoting.codec import AUTH, FrameDecoder, encode
from core_broker.remoting.server import RpcServer
from gateway.context import RequestContext
from gateway.processor_rpc import RemoteProcessor
from unimq.local_cluster import Cluster

pytestmark = pytest.mark.timeout(120)

SECRET = "correct horse battery staple"


class Echo:
    async def echo(self, x: Any) -> Any:
        return x


async def _serve(creds: auth.ClusterCredentials) -> tuple[RpcServer, int]:
    server = RpcServer(Echo(), ["echo"], "test-rpc", credentials=creds)
    _, port = await server.start("127.0.0.1", 0)
    return server, port


async def _call(port: int, creds: auth.ClusterCredentials | None) -> Any:
    client = RpcClient("127.0.0.1", port, credentials=creds)
    try:
        return await client.call("echo", "hi", rpc_timeout=10)
    finally:
        await client.close()


def _secret(s: str) -> auth.ClusterCredentials:
    return auth.from_settings(secret=s)


async def test_the_right_secret_is_served_and_never_sent() -> None:
    server, port = await _serve(_secret(SECRET))
    seen: list[bytes] = []
    # a byte-recording relay between client and server: what crosses the wire
    relay = await asyncio.start_server(lambda r, w: _relay(r, w, port, seen), "127.0.0.1", 0)
    relay_port = relay.sockets[0].getsockname()[1]
    try:
        assert await _call(relay_port, _secret(SECRET)) == "hi"
        assert await _call(port, _secret(SECRET)) == "hi"
    finally:
        relay.close()
        await server.stop()
    wire = b"".join(seen)
    assert wire and SECRET.encode() not in wire and auth.ClusterCredentials(SECRET.encode()).key not in wire


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int, seen: list[bytes]) -> None:
    up_r, up_w = await asyncio.open_connection("127.0.0.1", port)

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while data := await src.read(65536):
            seen.append(data)
            dst.write(data)
        dst.close()

    await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer), return_exceptions=True)


@pytest.mark.parametrize("client_secret, says", [
    (None, "requires the cluster secret"),
    ("another secret", "secret"),
])
async def test_a_client_without_the_secret_is_refused_at_both_ends(client_secret: str | None, says: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="unimq.rpc.auth")
    server, port = await _serve(_secret(SECRET))
    try:
        with pytest.raises(auth.RpcAuthError, match=says):
            await _call(port, _secret(client_secret) if client_secret else None)
        assert await _call(port, _secret(SECRET)) == "hi"  # and the server serves the next one
    finally:
        await server.stop()
    refusals = [r.getMessage() for r in caplog.records if "test-rpc: refused 127.0.0.1:" in r.getMessage()]
    assert refusals, [r.getMessage() for r in caplog.records]


async def test_a_server_without_a_secret_refuses_a_client_with_one(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="unimq.rpc.auth")
    server, port = await _serve(auth.ClusterCredentials())
    try:
        with pytest.raises(auth.RpcAuthError, match="no cluster secret configured"):
            await _call(port, _secret(SECRET))
        assert await _call(port, None) == "hi"
    finally:
        await server.stop()
    assert any("presented a cluster secret" in r.getMessage() for r in caplog.records)


async def test_garbage_and_silence_before_authenticating_are_dropped() -> None:
    server, port = await _serve(_secret(SECRET))
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(encode([AUTH, "hello", b"short nonce"]))  # not a 32-byte nonce
        assert await asyncio.wait_for(r.read(), 10) == b""
        w.close()
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write((1 << 30).to_bytes(4, "big"))  # a 1 GiB frame announced before authenticating
        assert await asyncio.wait_for(r.read(), 10) == b""
        w.close()
        # a forged proof after a real challenge
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(encode([AUTH, "hello", auth.nonce()]))
        decoder = FrameDecoder()
        frames: list = []
        while not frames:
            frames = decoder.feed(await asyncio.wait_for(r.read(4096), 10))
        assert frames[0][1] == "challenge"
        w.write(encode([AUTH, "proof", b"\0" * 32]))
        rest = await asyncio.wait_for(r.read(), 10)
        assert decoder.feed(rest)[0][1] == "refused"
        w.close()
        assert await _call(port, _secret(SECRET)) == "hi"
    finally:
        await server.stop()


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "other").mkdir()
    ca, other = TlsCA(tmp_path, "cluster-ca"), TlsCA(tmp_path / "other", "other-ca")
    return {"ca": ca, "node": ca.issue("node-1", node=True), "node2": ca.issue("node-2", node=True),
            "stranger": other.issue("stranger", node=True)}


def _mtls(pki: dict[str, Any], who: str = "node", secret: str = "") -> auth.ClusterCredentials:
    cert, key = pki[who]
    return auth.from_settings(secret=secret, tls_cert=str(cert), tls_key=str(key), tls_ca=str(pki["ca"].path))


async def test_mutual_tls_refuses_a_client_without_a_cluster_certificate(pki, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="unimq.rpc.auth")
    server, port = await _serve(_mtls(pki))
    try:
        assert await _call(port, _mtls(pki, "node2")) == "hi"
        with pytest.raises(PeerUnavailableError, match="mutual TLS"):  # no certificate: plaintext against TLS
            await _call(port, None)
        stranger = auth.from_settings(tls_cert=str(pki["stranger"][0]), tls_key=str(pki["stranger"][1]),
                                      tls_ca=str(pki["ca"].path))
        with pytest.raises((PeerUnavailableError, auth.RpcAuthError)):  # another CA's certificate
            await _call(port, stranger)
        assert await _call(port, _mtls(pki, "node2")) == "hi"
    finally:
        await server.stop()
    assert sum("mutual TLS handshake failed" in r.getMessage() for r in caplog.records) >= 2


async def test_mutual_tls_and_the_secret_together(pki) -> None:
    server, port = await _serve(_mtls(pki, secret=SECRET))
    try:
        assert await _call(port, _mtls(pki, "node2", secret=SECRET)) == "hi"
        with pytest.raises(auth.RpcAuthError):
            await _call(port, _mtls(pki, "node2"))  # the certificate alone is not enough here
    finally:
        await server.stop()


def test_settings_errors_name_the_knob(tmp_path: Path) -> None:
    from core_broker.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="cluster_secret_file"):
        auth.from_settings(secret_file=str(tmp_path / "missing"))
    with pytest.raises(ConfigurationError, match="one, not both"):
        auth.from_settings(secret="a", secret_file="b")
    with pytest.raises(ConfigurationError, match="go together"):
        auth.from_settings(tls_cert="c.pem")


# -- a separated deployment of real processes ------------------------------------------------

CTX = RequestContext("test", client_id="rpc-auth-tests")


def _refused_everywhere(cluster: Cluster, creds: auth.ClusterCredentials | None, error: type) -> None:
    ports = [cluster.nameserver.ports["namesrv"], *(b.ports["broker"] for b in cluster.brokers.values()),
             *(p for _, p in cluster.gateway_rpc())]

    async def go() -> None:
        for port in ports:
            client = RpcClient("127.0.0.1", port, credentials=creds)
            try:
                with pytest.raises(error):
                    await client.call("list_brokers" if port == ports[0] else "ping", rpc_timeout=10)
            finally:
                await client.close()

    asyncio.run(go())


def _round_trip(cluster: Cluster, creds: auth.ClusterCredentials) -> None:
    async def go() -> None:
        previous = auth.configure(creds)  # RemoteProcessor's clients use the process's credentials
        try:
            rp = RemoteProcessor(cluster.gateway_rpc())
            await rp.create_topic(CTX, "secured", queues=2)
            await rp.send(CTX, [Message("secured", f"m{i}".encode()) for i in range(10)])
            got: list = []
            for _ in range(100):
                batch = await rp.pop(CTX, "g", "secured", 32, 30_000, wait_ms=200)
                for p in batch:
                    await rp.ack(CTX, "g", "secured", p.receipt_handle)
                got += batch
                if len(got) >= 10:
                    break
            assert sorted(p.message.body for p in got) == sorted(f"m{i}".encode() for i in range(10))
            await rp.stop()
        finally:
            auth.configure(previous)

    asyncio.run(go())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_separated_deployment_with_a_cluster_secret(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, brokers=1, gateways=1, cluster_secret=SECRET).start()
    try:
        _round_trip(cluster, _secret(SECRET))
        _refused_everywhere(cluster, None, auth.RpcAuthError)
        _refused_everywhere(cluster, _secret("not the secret"), auth.RpcAuthError)
        logs = cluster.brokers["broker-a"].tail(200) + cluster.nameserver.tail(200)
        assert "refused 127.0.0.1:" in logs and "without the cluster secret" in logs
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_separated_deployment_with_mutual_tls(tmp_path: Path, pki) -> None:
    cert, key = pki["node"]
    tls = ["--rpc-tls-cert", str(cert), "--rpc-tls-key", str(key), "--rpc-tls-ca", str(pki["ca"].path)]
    (tmp_path / "cluster").mkdir()
    cluster = Cluster(tmp_path / "cluster", brokers=1, gateways=1, common_args=tls).start()
    try:
        _round_trip(cluster, _mtls(pki, "node2"))
        _refused_everywhere(cluster, None, PeerUnavailableError)
        assert "mutual TLS handshake failed" in cluster.brokers["broker-a"].tail(200)
    finally:
        cluster.stop()


def test_unimq_refuses_to_start_with_an_unreadable_secret_file(tmp_path: Path) -> None:
    import subprocess
    import sys

    from conftest import REPO_ROOT

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = subprocess.run([sys.executable, "-m", "unimq", "nameserver", "--port", str(port), "--cluster-secret-file",
                          str(tmp_path / "nope")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode != 0 and "cluster_secret_file" in run.stderr, run.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_replicated_group_over_mutual_tls_and_the_secret(tmp_path: Path, pki) -> None:
    """Controller, nameserver, a group of two brokers acknowledging together and a gateway, every
    link over mutual TLS with the secret: a put acknowledged with min_insync_replicas 2 has crossed
    the replication stream; the controller's client port refuses a caller without a certificate."""
    import time
    import urllib.request

    from nameserver.controller_client import ControllerClient
    from tests.test_controller_raft import _free_ports
    from unimq.local_cluster import start_proc

    cert, key = pki["node"]
    secret_file = tmp_path / "cluster.secret"
    secret_file.write_text(SECRET)
    creds = ["--rpc-tls-cert", str(cert), "--rpc-tls-key", str(key), "--rpc-tls-ca", str(pki["ca"].path),
             "--cluster-secret-file", str(secret_file)]
    small = ["--set", "store.commitlog_segment_size=262144", "--set", "store.cq_entries_per_file=4096",
             "--set", "store.index_slots=4096", "--set", "store.index_entries_per_file=16384"]
    raft, ctl = _free_ports(2)
    procs = [start_proc("controller", ["controller", "--controller-port", str(ctl), "--data-dir", str(tmp_path / "ctl"),
                                       "--raft-addr", f"127.0.0.1:{raft}", "--peers", f"127.0.0.1:{raft}",
                                       "--secret", "s3", *creds])]
    try:
        procs.append(start_proc("nameserver", ["nameserver", "--port", "0", *creds]))
        namesrv = f"127.0.0.1:{procs[-1].ports['namesrv']}"
        for b in ("b1", "b2"):
            procs.append(start_proc(b, ["broker", "--data-dir", str(tmp_path / b), "--port", "0", "--namesrv", namesrv,
                                        "--group", "g", "--broker-id", b, "--controller-addr", f"127.0.0.1:{ctl}",
                                        "--min-insync-replicas", "2", "--heartbeat-s", "1", *small, *creds]))
        gateway = start_proc("gateway", ["gateway", "--namesrv", namesrv, "--rpc-port", "0", "--http-port", "0",
                                         "--mqtt-port", "0", "--amqp-port", "0", "--grpc-port", "0",
                                         "--mqtt-ws-port", "-1", *creds])
        procs.append(gateway)
        url = f"http://127.0.0.1:{gateway.ports['http']}/v1/topics/replicated/messages"
        deadline = time.monotonic() + 60
        while True:  # the group gets a master and its replica joins the in-sync set
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=b"both hold it", method="POST"),
                                            timeout=20) as r:
                    assert r.status == 200
                break
            except OSError as e:  # not up yet, or 5xx while the group forms
                assert time.monotonic() < deadline, f"no acknowledged put: {e}"
                time.sleep(0.5)

        async def state() -> object:
            previous = auth.configure(_mtls(pki, "node2", secret=SECRET))
            client = ControllerClient([("127.0.0.1", ctl)], timeout_s=3.0)
            await client.start()
            try:
                return await client.group_state("g")
            finally:
                await client.stop()
                auth.configure(previous)

        assert asyncio.run(state()).in_sync == frozenset({"b1", "b2"})

        async def bare() -> None:
            client = RpcClient("127.0.0.1", ctl)
            try:
                with pytest.raises(PeerUnavailableError):
                    await client.call("group_state", "g", rpc_timeout=10)
            finally:
                await client.close()

        asyncio.run(bare())
    finally:
        for p in reversed(procs):
            p.stop()
