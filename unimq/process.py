"""The process starter: one unimq process of any role, from start-up to a clean stop.

:func:`run` starts the role's core (nameserver, broker, processor: see
``unimq.roles``), declares the configured topics, starts the protocol doors in
order (``unimq.doors``), announces each listener on stdout, flips ``/healthz``
to ready, reloads the TLS certificate files on SIGHUP, and on SIGTERM/SIGINT
undoes it all in reverse, so the store is
always shut down last (flushed, checkpointed, abort marker removed) after no
door can write to it any more.

The stdout lines are a contract that tests and scripts parse::

    unimq: http listening on 127.0.0.1:8080
    unimq: ready
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from typing import TYPE_CHECKING

from core_broker.remoting import auth as rpc_auth

from .doors import build_doors
from .node import Node, announce
from .roles import ROLES

if TYPE_CHECKING:
    from core_broker.message_store import MessageStore

    from .settings import UnimqSettings

log = logging.getLogger("unimq.server")

GC_GEN0_THRESHOLD = 10_000  # see where run() sets it

__all__ = ["run"]


def _install_signal_handlers(loop: asyncio.AbstractEventLoop, stop: asyncio.Event, node: Node) -> list[int]:
    """Route SIGTERM/SIGINT to ``stop`` and SIGHUP to :func:`_reload`; returns the signals
    installed (none off the main thread)."""
    installed: list[int] = []
    for sig, handler in ((signal.SIGTERM, stop.set), (signal.SIGINT, stop.set), (signal.SIGHUP, lambda: _reload(node))):
        try:
            loop.add_signal_handler(sig, handler)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread / platform
            continue
        installed.append(sig)
    return installed


def _reload(node: Node) -> None:
    """SIGHUP: read every TLS certificate file again (README "TLS").

    New handshakes use the new files; open connections keep theirs (``gateway.tls``).
    On the loop, not a worker thread: the contexts are used by the loop's handshakes,
    and a reload reads a few small files once in a while.
    """
    contexts = node.state.tls
    ok = sum(tls.reload() for tls in contexts)
    log.info("SIGHUP: %d of %d TLS certificates reloaded", ok, len(contexts))
    try:
        rpc_auth.current().reload()
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
        log.error("SIGHUP: the internal RPC's TLS files did not load (new connections may fail): %s", e)


async def run(
    settings: UnimqSettings,
    ready_event: asyncio.Event | None = None,
    stop_event: asyncio.Event | None = None,
) -> None:
    """Run unimq until SIGTERM/SIGINT (or ``stop_event``), then shut down cleanly.

    ``ready_event`` is set once every door listens and ``/healthz`` answers 200;
    ``stop_event`` lets an in-process caller (tests, embedding) stop the server
    without signals. Returns normally after a clean shutdown; raises if start-up
    fails (a listener that cannot listen: :class:`~unimq.node.StartupError`),
    after undoing whatever had started.
    """
    loop = asyncio.get_running_loop()
    stop = stop_event if stop_event is not None else asyncio.Event()
    node = Node(settings)
    # what this process proves on the internal RPC, and asks of its peers (checked before anything starts)
    previous_credentials = rpc_auth.configure(rpc_auth.from_settings(
        settings.cluster_secret, settings.cluster_secret_file, settings.rpc_tls_cert, settings.rpc_tls_key,
        settings.rpc_tls_ca))
    signals = _install_signal_handlers(loop, stop, node)
    state = node.state
    try:
        # The role's core (nameserver, broker, processor); recovery runs on a worker thread.
        await ROLES[settings.role].start(node)
        if node.store is not None:
            log.info("store started in %s (flush=%s)", settings.store.data_dir, settings.store.flush.value)
            await asyncio.to_thread(_declare_topics, node.store, settings)
        state.processor = node.processor
        if node.processor is not None:
            from .security import start_identities

            state.identities = await start_identities(settings, node.processor)
        for listener in build_doors(state) if node.processor is not None else []:
            if stop.is_set():
                break
            await node.listen(listener.door, listener.label, listener.port)
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
        for door in reversed(node.started):
            try:
                await door.stop()
            except Exception:  # keep stopping the rest: the store must still be shut down
                log.exception("error stopping %s door", door.name)
        if state.identities is not None:
            await state.identities.stop()
        if node.processor is not None:
            # The broker (stopped above, last of all) already wrote the broker state snapshot
            # and shut the store down (flush, checkpoint, abort marker removed); this closes
            # the processor's own connections (gateway role).
            await node.processor.stop()
        if node.store is not None:
            log.info("store shut down cleanly")
        for sig in signals:
            loop.remove_signal_handler(sig)
        rpc_auth.configure(previous_credentials)


def _declare_topics(store: MessageStore, settings: UnimqSettings) -> None:
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
