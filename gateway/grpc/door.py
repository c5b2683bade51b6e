"""The gRPC door of `unimq up`: a grpc.aio server for RocketMQ 5's v2 protocol.

Plaintext by default (the official clients' ``tls_enable=False``); with
``grpc_tls_cert`` and ``grpc_tls_key`` set (``--grpc-tls-cert/--grpc-tls-key``),
or the shared ``tls_cert``/``tls_key``, the same port serves TLS only. grpcio
has its own TLS stack, so the certificate is handed over as PEM through its
certificate fetcher, which also picks up a reload (SIGHUP, ``gateway.tls``). The door registers itself as the processor's
transaction checker, so an open transaction is checked back with a live
producer over its Telemetry stream.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from rocketmq.grpc_protocol import service_pb2 as spb

from gateway.tls import ServerTls

from . import convert as cv
from .service import MessagingService

log = logging.getLogger("unimq.grpc")

_WILDCARD = {"0.0.0.0", "::", ""}


def _listen_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def reloading_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """TLS credentials that follow ``tls``'s reloads: grpcio asks the fetcher before each new
    handshake, and gets the files read again only when ``tls.generation`` moved.

    Client certificates: grpcio can require and verify them or not ask at all, so
    ``tls_verify_client = optional`` does not ask on this door (README "TLS").
    """
    def config() -> Any:
        cert, key, ca = tls.pem()
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    served = [tls.generation]

    def fetch() -> Any:
        if tls.generation == served[0]:
            return None  # unchanged: grpcio keeps the current one
        try:
            fresh = config()
        except OSError as e:
            log.error("gRPC door: keeping the old certificate: %s", e)
            return None
        served[0] = tls.generation
        return fresh

    return grpc.dynamic_ssl_server_credentials(
        config(), fetch, require_client_authentication=tls.files.verify_client == "required")


def _decoding(request_cls: Any, fn: Any, streaming_request: bool, streaming_response: bool) -> Any:
    """Wrap a servicer method so that an undecodable request fails that call with INVALID_ARGUMENT.

    (grpcio's own deserializer path reports a parse failure as UNKNOWN with a
    Python traceback text; the door parses the bytes itself instead.)
    """

    def parse(data: bytes) -> Any:
        return request_cls.FromString(data)

    if streaming_request:
        async def requests(it: Any, context: grpc.aio.ServicerContext) -> Any:
            async for data in it:
                try:
                    yield parse(data)
                except DecodeError as e:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable {request_cls.__name__}: {e}")

        async def stream_stream(it: Any, context: grpc.aio.ServicerContext) -> Any:
            return await fn(requests(it, context), context)

        return stream_stream
    if streaming_response:
        async def unary_stream(data: bytes, context: grpc.aio.ServicerContext) -> Any:
            try:
                request = parse(data)
            except DecodeError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable {request_cls.__name__}: {e}")
            async for response in fn(request, context):
                yield response

        return unary_stream

    async def unary_unary(data: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = parse(data)
        except DecodeError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable {request_cls.__name__}: {e}")
        return await fn(request, context)

    return unary_unary


def service_handler(service: MessagingService) -> grpc.GenericRpcHandler:
    """Every method of apache.rocketmq.v2.MessagingService, from the stubs' descriptor.

    Equivalent to the generated ``add_MessagingServiceServicer_to_server`` except
    that requests are parsed by the door (see :func:`_decoding`).
    """
    desc = spb.DESCRIPTOR.services_by_name["MessagingService"]
    handlers = {}
    for method in desc.methods:
        request_cls = getattr(spb, method.input_type.name)
        fn = getattr(service, method.name)
        wrapped = _decoding(request_cls, fn, method.client_streaming, method.server_streaming)
        serialize = lambda r: r.SerializeToString()  # noqa: E731
        if method.client_streaming and method.server_streaming:
            h = grpc.stream_stream_rpc_method_handler(wrapped, response_serializer=serialize)
        elif method.server_streaming:
            h = grpc.unary_stream_rpc_method_handler(wrapped, response_serializer=serialize)
        elif method.client_streaming:
            h = grpc.stream_unary_rpc_method_handler(wrapped, response_serializer=serialize)
        else:
            h = grpc.unary_unary_rpc_method_handler(wrapped, response_serializer=serialize)
        handlers[method.name] = h
    return grpc.method_handlers_generic_handler(desc.full_name, handlers)


class GrpcDoor:
    """Door protocol (gateway.door): ``start() -> (host, port)``, ``stop()``."""

    name = "grpc"

    def __init__(self, state: Any) -> None:
        self._state = state
        self._server: grpc.aio.Server | None = None
        self.service: MessagingService | None = None

    async def start(self) -> tuple[str, int]:
        settings = self._state.settings
        processor = self._state.processor
        broker = settings.broker
        self.service = MessagingService(
            processor,
            credentials=settings.grpc_credentials,
            identities=getattr(self._state, "identities", None),
            max_delivery_attempts=broker.max_delivery_attempts,
            retry_backoff_ms=tuple(broker.retry_backoff_ms),
            long_polling_ms=min(20_000, broker.max_long_poll_ms),
            cert_identity=bool(getattr(settings, "grpc_cert_identity", False)),
        )
        limit = max(64 << 20, processor.config.max_message_size * 4 + (1 << 20))
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", -1),
                # a port in use is an error, not a shared port, unless several gateways share it
                ("grpc.so_reuseport", 1 if settings.reuse_port else 0),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ]
        )
        server.add_generic_rpc_handlers((service_handler(self.service),))
        address = _listen_address(settings.host, settings.grpc_port)
        files = settings.tls_files(settings.grpc_tls_cert, settings.grpc_tls_key)
        try:
            if files is not None:
                port = server.add_secure_port(address, reloading_credentials(self._state.server_tls(files, "gRPC door")))
            else:
                port = server.add_insecure_port(address)
        except RuntimeError as e:  # grpc reports a failed bind this way
            raise OSError(f"grpc door cannot listen on {address}: {e}") from None
        if not port:
            raise OSError(f"grpc door cannot listen on {address}")
        await server.start()
        self.service.renewer.start()
        self._server = server
        advertised = settings.host if settings.host not in _WILDCARD else "127.0.0.1"
        self.service.default_endpoints = cv.endpoints([(advertised, port)])
        processor.add_transaction_checker(self.service.check_transaction)
        # debug: the process announces every listener once on stdout (unimq: grpc listening on ...)
        log.debug("grpc door on %s (%s)", address, "TLS" if files is not None else "plaintext")
        return settings.host, port

    async def stop(self) -> None:
        if self._server is None:
            return
        if self.service is not None:
            self._state.processor.remove_transaction_checker(self.service.check_transaction)
        await self._server.stop(grace=1.0)
        self._server = None
        if self.service is not None:
            await self.service.renewer.stop()
