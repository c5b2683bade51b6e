"""Who may speak the internal RPC: a shared cluster secret, proved without sending it; optional mutual TLS.

Every internal connection (gateway -> broker, broker -> nameserver, gateway ->
nameserver, replica -> master, broker -> controller, ``unimq cluster status``)
is an :class:`~core_broker.remoting.client.RpcClient` talking to an
:class:`~core_broker.remoting.server.RpcServer`, so the check lives here, once,
and runs once per connection, before the first request: the per-call path is
the same with or without it.

The secret (``cluster_secret``, or ``cluster_secret_file``) never crosses the
wire. A challenge-response in frames of their own kind (``codec.AUTH``), both
ends proving they hold it, each over a nonce the other chose::

    client -> server   [AUTH, "hello", client_nonce]
    server -> client   [AUTH, "challenge", server_nonce, HMAC(k, "server" | cn | sn)]
    client -> server   [AUTH, "proof", HMAC(k, "client" | sn | cn)]
    server -> client   [AUTH, "ok"]          or   [AUTH, "refused", why]

k is SHA-256 of the secret; the two proofs carry different labels, so one side's
proof is never a valid answer for the other. A node with a secret refuses a peer
without one (a request before any hello is answered with :class:`RpcAuthError`,
then the connection closes), and a node without a secret refuses a hello (the
settings differ between the two: saying so beats serving half a cluster).
Both ends log the refusal with the peer's address.

Mutual TLS (``rpc_tls_cert``/``_key``/``_ca``) also encrypts: each end presents a
certificate and requires the other's to chain to ``rpc_tls_ca`` (the cluster's
own CA: host names are not checked, the CA is what says "a node of this
cluster"). Both can be on at once. Hand-written because it is forty lines over
``hmac`` and ``ssl``; a library for it would bring a protocol of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import logging
import secrets
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigurationError, UnimqError
from .codec import AUTH, MAX_FRAME, REQUEST, RESPONSE, FrameDecoder, FrameError, encode
from .wire import error_to_wire, register_error

__all__ = [
    "ClusterCredentials", "RpcAuthError", "add_flags", "client_handshake", "client_proof", "configure", "current",
    "from_settings", "server_handshake", "server_proof",
]

log = logging.getLogger("unimq.rpc.auth")

HELLO, CHALLENGE, PROOF, OK, REFUSED = "hello", "challenge", "proof", "ok", "refused"
NONCE_BYTES = 32
#: How long a server waits for a connection's hello and proof before closing it.
HANDSHAKE_TIMEOUT_S = 10.0


class RpcAuthError(UnimqError):
    """The peer did not prove it holds the cluster credentials (or this node lacks them)."""

    code = "UNAUTHENTICATED"


register_error(RpcAuthError)


@dataclass(frozen=True)
class ClusterCredentials:
    """What this process proves itself with on the internal RPC; empty: nothing (the default)."""

    secret: bytes = b""
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    _contexts: dict[str, ssl.SSLContext] = field(default_factory=dict, compare=False, repr=False)

    @property
    def key(self) -> bytes:
        return hashlib.sha256(self.secret).digest() if self.secret else b""

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    def server_ssl(self) -> ssl.SSLContext | None:
        """The listening side's context (client certificates required), None without mTLS."""
        return self._context("server")

    def client_ssl(self) -> ssl.SSLContext | None:
        """The connecting side's context (server certificate required), None without mTLS."""
        return self._context("client")

    def _context(self, side: str) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        ctx = self._contexts.get(side)
        if ctx is None:
            purpose = ssl.Purpose.CLIENT_AUTH if side == "server" else ssl.Purpose.SERVER_AUTH
            ctx = ssl.create_default_context(purpose, cafile=self.tls_ca)
            if side == "server":
                ctx.sslobject_class = _LoggedHandshake
            ctx.check_hostname = False  # the cluster CA vouches for its nodes (module docstring)
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
            self._contexts[side] = ctx
        return ctx

    def reload(self) -> None:
        """Read the TLS files again into the same contexts (SIGHUP): new connections use them."""
        for ctx in self._contexts.values():
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
            ctx.load_verify_locations(cafile=self.tls_ca)


class _LoggedHandshake(ssl.SSLObject):
    """The listening side's TLS object: a refused handshake is logged (asyncio keeps it quiet)."""

    def do_handshake(self) -> None:
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as e:
            log.warning("internal RPC: refused a connection: mutual TLS handshake failed "
                        "(no certificate from the cluster CA?): %s", e)
            raise


_current = ClusterCredentials()


def configure(credentials: ClusterCredentials) -> ClusterCredentials:
    """Make ``credentials`` the process's default for every RpcClient and RpcServer; returns the previous."""
    global _current
    previous, _current = _current, credentials
    return previous


def current() -> ClusterCredentials:
    return _current


def from_settings(secret: str = "", secret_file: str = "", tls_cert: str = "", tls_key: str = "",
                  tls_ca: str = "") -> ClusterCredentials:
    """Credentials from the knobs, checked now (a missing file is a :class:`ConfigurationError`)."""
    if secret and secret_file:
        raise ConfigurationError("cluster_secret and cluster_secret_file: give one, not both")
    if secret_file:
        try:
            secret = Path(secret_file).expanduser().read_text().strip()
        except OSError as e:
            raise ConfigurationError(f"cluster_secret_file: cannot read {secret_file}: {e.strerror or e}") from None
        if not secret:
            raise ConfigurationError(f"cluster_secret_file: {secret_file} is empty")
    given = [bool(tls_cert), bool(tls_key), bool(tls_ca)]
    if any(given) and not all(given):
        raise ConfigurationError("rpc_tls_cert, rpc_tls_key and rpc_tls_ca go together (mutual TLS)")
    creds = ClusterCredentials(secret.encode(), tls_cert, tls_key, tls_ca)
    try:
        creds.server_ssl()
        creds.client_ssl()
    except (OSError, ssl.SSLError) as e:
        raise ConfigurationError(f"rpc_tls_cert/rpc_tls_key/rpc_tls_ca do not load: {e}") from None
    return creds


def server_proof(key: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(key, b"unimq-rpc server|" + client_nonce + server_nonce, hashlib.sha256).digest()


def client_proof(key: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(key, b"unimq-rpc client|" + server_nonce + client_nonce, hashlib.sha256).digest()


def nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def verify(expected: bytes, given: object) -> bool:
    return isinstance(given, bytes) and hmac.compare_digest(expected, given)


async def _next_frame(reader: asyncio.StreamReader, decoder: FrameDecoder) -> list | None:
    """The next frame of the handshake, None when the peer closed first."""
    while True:
        data = await reader.read(4096)
        if not data:
            return None
        frames = decoder.feed(data)
        if frames:
            return frames[0]


async def server_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, decoder: FrameDecoder,
                           creds: ClusterCredentials, name: str, peer: str) -> bool:
    """Make the connecting peer prove the secret (and prove it back); False: refused, logged, answered."""
    key = creds.key
    decoder.max_frame = 4096  # nobody unproven gets to make this process buffer 64 MiB
    refusal = ""
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            first = await _next_frame(reader, decoder)
            if first is None:
                refusal = "closed the connection before authenticating"
                return False
            if first[0] == REQUEST:
                refusal = f"called {first[2]!r} without the cluster secret"
                err = RpcAuthError(f"{name} requires the cluster secret (cluster_secret or cluster_secret_file, "
                                   "--cluster-secret-file); this connection presented none")
                writer.write(encode([RESPONSE, first[1], False, error_to_wire(err)]))
                return False
            if first[0] != AUTH or first[1] != HELLO or not isinstance(first[2], bytes) or len(first[2]) != NONCE_BYTES:
                refusal = "sent something other than a hello"
                return False
            client_nonce, server_nonce = first[2], nonce()
            writer.write(encode([AUTH, CHALLENGE, server_nonce, server_proof(key, client_nonce, server_nonce)]))
            second = await _next_frame(reader, decoder)
            if second is None or second[0] != AUTH or second[1] != PROOF or not verify(
                    client_proof(key, client_nonce, server_nonce), second[2]):
                refusal = "does not hold this cluster's secret (its proof does not verify)"
                writer.write(encode([AUTH, REFUSED, f"{name}: the cluster secrets differ"]))
                return False
            writer.write(encode([AUTH, OK, None]))
            return True
    except TimeoutError:
        refusal = f"did not authenticate within {HANDSHAKE_TIMEOUT_S:.0f}s"
        return False
    except (FrameError, ConnectionError) as e:
        refusal = f"broke off the handshake: {e}"
        return False
    finally:
        decoder.max_frame = MAX_FRAME
        if refusal:
            log.warning("%s: refused %s: it %s", name, peer, refusal)


def refuse_hello(writer: asyncio.StreamWriter, name: str, peer: str) -> None:
    """A node without a secret answers a hello: the two are configured differently."""
    log.warning("%s: refused %s: it presented a cluster secret and this node has none configured", name, peer)
    writer.write(encode([AUTH, REFUSED, f"{name} has no cluster secret configured (this node has one)"]))


async def client_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, decoder: FrameDecoder,
                           creds: ClusterCredentials, address: str) -> None:
    """Prove the secret to the server at ``address`` and check its proof; raise :class:`RpcAuthError` if refused."""
    key = creds.key
    client_nonce = nonce()
    try:
        writer.write(encode([AUTH, HELLO, client_nonce]))
        frame = await _next_frame(reader, decoder)
        if frame is not None and frame[0] == AUTH and frame[1] == CHALLENGE and len(frame) == 4:
            if not verify(server_proof(key, client_nonce, frame[2]) if isinstance(frame[2], bytes) else b"", frame[3]):
                raise RpcAuthError(f"{address} does not hold this cluster's secret (its proof does not verify); "
                                   "check cluster_secret on both")
            writer.write(encode([AUTH, PROOF, client_proof(key, client_nonce, frame[2])]))
            frame = await _next_frame(reader, decoder)
            if frame is not None and frame[0] == AUTH and frame[1] == OK:
                return
        if frame is None:
            raise RpcAuthError(f"{address} closed the connection during the cluster-secret handshake")
        if frame[0] == AUTH and frame[1] == REFUSED:
            raise RpcAuthError(f"{address} refused this node: {frame[2]}")
        raise RpcAuthError(f"{address} answered the cluster-secret handshake with something else")
    except (ssl.SSLError, ConnectionError, FrameError) as e:
        raise RpcAuthError(f"{address} broke off the handshake: {e}") from None


def add_flags(p: argparse.ArgumentParser) -> None:
    """The internal RPC's credential flags (every role, and ``unimq cluster status``)."""
    g = p.add_argument_group("cluster RPC security (README: Securing the cluster)")
    g.add_argument("--cluster-secret", dest="cluster_secret", metavar="S",
                   help="shared secret every node of the cluster proves (challenge-response, never sent)")
    g.add_argument("--cluster-secret-file", dest="cluster_secret_file", metavar="FILE",
                   help="read the cluster secret from FILE (keeps it out of the process list)")
    g.add_argument("--rpc-tls-cert", dest="rpc_tls_cert", metavar="PEM",
                   help="mutual TLS on the internal RPC: this node's certificate (chain)")
    g.add_argument("--rpc-tls-key", dest="rpc_tls_key", metavar="PEM", help="private key of --rpc-tls-cert")
    g.add_argument("--rpc-tls-ca", dest="rpc_tls_ca", metavar="PEM", help="CA every node's certificate chains to")
