"""`unimq up`: one process, one store, many doors.

Why this shape: every protocol door (HTTP/CloudEvents now; MQTT, AMQP, gRPC
and the nameserver later) is an object with ``start() -> (host, port)`` and
``stop()``. :func:`run` opens the store, starts the doors in order, announces
each one on stdout, flips ``/healthz`` to ready, and on SIGTERM/SIGINT undoes
it all in reverse, so the store is always shut down last (flushed,
checkpointed, abort marker removed) after no door can write to it any more.

Adding a door means writing a class that satisfies :class:`Door` and listing
it in :func:`build_doors`; nothing else here changes.

The stdout lines are a contract that tests and scripts parse::

    unimq: http listening on 127.0.0.1:8080
    unimq: ready
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, Protocol

import uvicorn

from adapters.cloudevents.http_app import create_app
from gateway.embedded_uvicorn import EmbeddedUvicorn
from gateway.settings import UnimqSettings

log = logging.getLogger("unimq.server")

GC_GEN0_THRESHOLD = 10_000  # see where run() sets it

__all__ = ["Door", "HttpDoor", "ServerState", "announce", "bind_socket", "build_doors", "run"]


@dataclass
class ServerState:
    """What the doors share: the settings, the store, and the lifecycle phase.

    ``phase`` is "starting", then "ready" once every door listens, then
    "stopping" from the first signal on; ``/healthz`` reports it.
    """

    settings: UnimqSettings
    store: Any = None
    # The MessagingProcessor every adapter calls, once it exists (gateway/processor.py).
    processor: Any = None
    phase: str = "starting"
    listening: dict[str, tuple[str, int]] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.phase == "ready"


class Door(Protocol):
    """A network listener in front of the processor (one per protocol)."""

    name: str

    async def start(self) -> tuple[str, int]:
        """Start listening; return the bound (host, port), the real port when 0 was asked."""
        ...

    async def stop(self) -> None:
        """Stop accepting, close connections; must be safe to call once after start()."""
        ...


def bind_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """Bind and listen on (host, port) ourselves, so that port 0 yields a known real port.

    Also reports a port already in use as a plain OSError here, instead of
    letting a server library log it and call sys.exit.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, socktype, proto, _, addr = infos[0]
    sock = socket.socket(family, socktype, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class HttpDoor:
    """The HTTP door: FastAPI (health, later CloudEvents) served by uvicorn on the running loop."""

    name = "http"

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._server: EmbeddedUvicorn | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> tuple[str, int]:
        settings = self._state.settings
        sock = bind_socket(settings.host, settings.http_port)
        config = uvicorn.Config(
            create_app(self._state),
            log_level="warning",
            log_config=None,  # keep the process's logging setup (gateway.cli) instead of uvicorn's
            lifespan="on",  # the app's lifespan starts and stops the HTTP door's push deliveries
            access_log=False,
            timeout_graceful_shutdown=5,
        )
        server = EmbeddedUvicorn(config)
        self._server = server
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name="unimq-http")
        while not server.started:
            if self._task.done():
                sock.close()
                exc = self._task.exception() if not self._task.cancelled() else None
                raise RuntimeError(f"http door failed to start: {exc!r}") from exc
            await asyncio.sleep(0.01)
        bound = sock.getsockname()
        return bound[0], bound[1]

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await self._task
        except (asyncio.CancelledError, SystemExit):  # uvicorn may sys.exit on odd failures
            pass


def build_doors(state: ServerState) -> list[Door]:
    """Every door that exists so far, in start order (stopped in reverse).

    Later issues add: nameserver (namesrv_port), gRPC (grpc_port), MQTT
    (mqtt_port), AMQP (amqp_port), after HTTP. HTTP starts first so it stops
    last: ``/healthz`` keeps answering (503, "stopping") while the others drain.
    """
    enabled = set(state.settings.doors)
    doors: list[Door] = []
    if "http" in enabled:
        doors.append(HttpDoor(state))
    if "grpc" in enabled:
        from gateway.grpc import GrpcDoor  # late: grpcio and the v2 stubs are heavy imports

        doors.append(GrpcDoor(state))
    if "mqtt" in enabled:
        doors += _mqtt_doors(state)
    if "amqp" in enabled:
        from adapters.amqp.server import AmqpDoor

        doors.append(AmqpDoor(state))
    return doors


def _mqtt_doors(state: ServerState) -> list[Door]:
    """The MQTT door (TCP); unless ``mqtt_ws_port`` is -1, MQTT over WebSocket; with a
    certificate, MQTT over TLS - all three sharing one broker (sessions, subscriptions)."""
    from adapters.mqtt.server import MQTTDoor, MQTTTlsDoor, MQTTWebSocketDoor

    settings = state.settings
    tcp = MQTTDoor(state)
    doors: list[Door] = [tcp]
    ws_port = getattr(settings, "mqtt_ws_port", None)
    if ws_port is None:
        ws_port = 0 if settings.mqtt_port == 0 else 8083
    if ws_port >= 0:
        doors.append(MQTTWebSocketDoor(state, tcp.broker, port=ws_port))
    if getattr(settings, "mqtt_tls_cert", ""):
        tls_port = settings.mqtt_tls_port
        if tls_port is None:
            tls_port = 0 if settings.mqtt_port == 0 else 8883
        doors.append(MQTTTlsDoor(state, tcp.broker, port=tls_port))
    return doors


def announce(text: str) -> None:
    """Print one ``unimq: ...`` contract line to stdout, flushed at once (tests wait on it)."""
    print(f"unimq: {text}", file=sys.stdout, flush=True)


def _format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _install_signal_handlers(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> list[int]:
    """Route SIGTERM/SIGINT to ``stop``; returns the signals installed (none off the main thread)."""
    installed: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread / platform
            continue
        installed.append(sig)
    return installed


async def run(
    settings: UnimqSettings,
    ready_event: asyncio.Event | None = None,
    stop_event: asyncio.Event | None = None,
) -> None:
    """Run unimq until SIGTERM/SIGINT (or ``stop_event``), then shut down cleanly.

    ``ready_event`` is set once every door listens and ``/healthz`` answers 200;
    ``stop_event`` lets an in-process caller (tests, embedding) stop the server
    without signals. Returns normally after a clean shutdown; raises if start-up
    fails, after undoing whatever had started.
    """
    from gateway.roles import start_core  # imported late: the store is heavy

    loop = asyncio.get_running_loop()
    stop = stop_event if stop_event is not None else asyncio.Event()
    signals = _install_signal_handlers(loop, stop)
    state = ServerState(settings=settings)
    started: list[Door] = []
    try:
        def on_listen(name: str, addr: tuple[str, int]) -> None:
            state.listening[name] = addr
            announce(f"{name} listening on {_format_address(*addr)}")

        # The role's core (nameserver, broker, processor); recovery runs on a worker thread.
        await start_core(settings, state, started, on_listen)
        if state.store is not None:
            log.info("store started in %s (flush=%s)", settings.store.data_dir, settings.store.flush.value)
        if state.store is not None:
            await asyncio.to_thread(_declare_topics, state.store, settings)
        for door in build_doors(state) if state.processor is not None else []:
            if stop.is_set():
                break
            host, port = await door.start()
            started.append(door)
            state.listening[door.name] = (host, port)
            announce(f"{door.name} listening on {_format_address(host, port)}")
        if not stop.is_set():
            # What start-up allocated (modules, doors, recovered state) lives until shutdown:
            # collect once, then move it out of the collector's reach (gc.freeze), so the
            # full collections that message traffic triggers now and then scan only what
            # was allocated since, instead of pausing the loop for every import's objects.
            gc.collect()
            gc.freeze()
            # Then a gen-0 collection every 10,000 net allocations instead of CPython's 700
            # (gen 1 and 2 keep their defaults: a gen-1 pass stays bounded, full passes keep
            # CPython's rule of running only once long-lived objects grew by 25%). Measured
            # with `python -m bench --only amqp --quick` back to back (load ~7 on 2 cores),
            # broker CPU per message, persistent / transient: 700: 53 / 54 us; 10,000: 34 /
            # 29 us; (10000, 50, 100): 43 / 32 us; (50000, 20, 1000): 37 / 26 us. At 700 the
            # run made ~520 gen-0 and ~46 gen-1 passes (~0.45 s of collector time, passes up
            # to 12 ms); at 10,000 one pass of 1.4-5.8 ms. 50,000 saves no more CPU here but
            # each young pass then scans up to 5x as much (~45 ms seen for its full passes
            # before), which is what the MQTT p99 < 2 ms floor cannot take. The MQTT QoS 0/1
            # paths keep almost nothing past a message (a 20,000-message QoS 1 run: 24 gen-0
            # passes at 700, none at 10,000). Not periodic gc.freeze(): frozen objects are
            # never collected, so cyclic garbage made after start-up would leak.
            gc.set_threshold(GC_GEN0_THRESHOLD, 10, 10)
            state.phase = "ready"
            announce("ready")
            if ready_event is not None:
                ready_event.set()
            await stop.wait()
        log.info("stopping")
    finally:
        state.phase = "stopping"
        for door in reversed(started):
            try:
                await door.stop()
            except Exception:  # keep stopping the rest: the store must still be shut down
                log.exception("error stopping %s door", door.name)
        if state.processor is not None:
            # The broker door (stopped above, last of all) already wrote the broker state
            # snapshot and shut the store down (flush, checkpoint, abort marker removed);
            # this closes the processor's own connections (gateway role).
            await state.processor.stop()
        if state.store is not None:
            log.info("store shut down cleanly")
        for sig in signals:
            loop.remove_signal_handler(sig)


def _declare_topics(store: Any, settings: UnimqSettings) -> None:
    """Create the config file's ``[[topics]]`` that the store does not have yet.

    The store is the source of truth: a topic that already exists keeps its
    queues and type (a differing type is logged, not overwritten, because
    changing a live topic's type would break its clients). Blocking (writes
    topics.json): call it in a worker thread.
    """
    from core_broker.errors import TopicExistsError
    from core_broker.topic_config import TopicConfig

    for topic in settings.topics:
        try:
            store.topics.create(
                TopicConfig(name=topic.name, queues=topic.queues, message_type=topic.type), exist_ok=True
            )
        except TopicExistsError as exc:
            log.warning("topic %r declared as %s in the config: %s; keeping it as it is", topic.name, topic.type.value, exc)
