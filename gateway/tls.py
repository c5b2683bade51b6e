"""TLS for the doors: server contexts built from certificate files, reloaded in place.

Why one module: AMQPS, HTTPS, MQTT over TLS and WSS all take a stdlib
:class:`ssl.SSLContext`, and they must agree on what the knobs mean (which CA
verifies client certificates, what ``tls_verify_client`` asks for) and on how a
reload works. gRPC cannot take an ``SSLContext`` (grpcio has its own TLS stack),
so it reads the same :class:`TlsFiles` through :meth:`ServerTls.pem` and its
``generation`` (``gateway/grpc/door.py``).

Reload without dropping connections: an SSL connection copies the context's
certificate when it is created, so loading new files into the *same* context
(:meth:`ServerTls.reload`) changes what the next handshakes present and leaves
every open connection as it is. The files are first loaded into a scratch
context, so a half-written or mismatched pair is refused (logged) and the old
certificate keeps serving. Hand-written because the stdlib already does the
cryptography: what is left is choosing files and when to read them.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

__all__ = ["VERIFY_CLIENT", "ServerTls", "TlsFiles", "check_verify_client", "server_context"]

log = logging.getLogger("unimq.tls")

#: ``tls_verify_client``: none (never ask for a client certificate), optional (ask, verify one if
#: given, accept a client without), required (refuse a client without a certificate the CA signed).
VERIFY_CLIENT = ("none", "optional", "required")
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def check_verify_client(mode: object, client_ca: object) -> None:
    """Raise ``ValueError`` naming the knob unless ``tls_verify_client`` is usable with ``tls_client_ca``."""
    if mode not in VERIFY_CLIENT:
        raise ValueError(f"tls_verify_client must be one of {'|'.join(VERIFY_CLIENT)}, got {mode!r}")
    if mode != "none" and not client_ca:
        raise ValueError(f"tls_verify_client = {mode} needs tls_client_ca (the CA bundle client certificates chain to)")
    if client_ca and not (isinstance(client_ca, str) and Path(client_ca).expanduser().is_file()):
        raise ValueError(f"tls_client_ca: {client_ca} is not a readable file")


@dataclass(frozen=True)
class TlsFiles:
    """Where one listener's certificate, key and client CA live, and what it asks of clients."""

    cert: str
    key: str
    client_ca: str = ""
    verify_client: str = "none"

    def paths(self) -> tuple[Path, Path, Path | None]:
        ca = Path(self.client_ca).expanduser() if self.client_ca else None
        return Path(self.cert).expanduser(), Path(self.key).expanduser(), ca


def _load(ctx: ssl.SSLContext, files: TlsFiles) -> None:
    cert, key, ca = files.paths()
    ctx.load_cert_chain(cert, key)
    if ca is not None:
        ctx.load_verify_locations(cafile=ca)


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A server-side context presenting ``files``' certificate, verifying clients as configured."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load(ctx, files)
    ctx.verify_mode = _CERT_REQS[files.verify_client]
    return ctx


class ServerTls:
    """One listener's TLS: a context that keeps its identity while its files are reloaded.

    ``generation`` grows with each successful reload (gRPC's certificate fetcher
    reads it to know when to hand grpcio the new files).
    """

    def __init__(self, files: TlsFiles, label: str) -> None:
        self.files = files
        self.label = label
        self.context = server_context(files)
        self.generation = 0

    def reload(self) -> bool:
        """Read the files again; new handshakes use them. False (and logged) if they do not load."""
        try:
            server_context(self.files)  # a scratch load first: a bad pair must not half-apply
            _load(self.context, self.files)
        except (OSError, ssl.SSLError, ValueError) as e:
            log.error("%s: keeping the old certificate, the files did not load: %s", self.label, e)
            return False
        self.generation += 1
        log.info("%s: certificate reloaded from %s", self.label, self.files.cert)
        return True

    def pem(self) -> tuple[bytes, bytes, bytes | None]:
        """The certificate chain, key and client CA as PEM bytes (for grpcio)."""
        cert, key, ca = self.files.paths()
        return cert.read_bytes(), key.read_bytes(), ca.read_bytes() if ca is not None else None
