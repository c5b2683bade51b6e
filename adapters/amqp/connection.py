"""One AMQP 0-9-1 client connection: the asyncio transport loop around the protocol's state.

Why an ``asyncio.Protocol`` and not streams: the hot path (publish, deliver,
ack) must not pay a coroutine switch per frame. ``data_received`` feeds the
sans-io :class:`~adapters.amqp.codec.FrameDecoder` and handles publishes
(:mod:`~adapters.amqp.publisher`) and acks inline; the first method that needs
the store or the durable state (declare, bind, get, ...) hands the rest of the
events to one worker task that processes them strictly in order, as AMQP
requires per channel.

What is allowed when is the sans-io state machine :mod:`~adapters.amqp.state`
(``self.state`` moves only through its transition table); the handshake's
decisions are :mod:`~adapters.amqp.handshake`, each channel method's meaning
:mod:`~adapters.amqp.methods`, a channel's deliveries and acks
:mod:`~adapters.amqp.channel`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from typing import Any

from pamqp import commands as C

from core_broker.errors import MessageTooLargeError, TopicNotFoundError, UnimqError
from gateway.access.certs import cert_identity, is_tls, known_identity
from gateway.access.traffic import Lease, Meter, QuotaExceededError, TrafficControl
from gateway.auth import AMQP_SEP, Action, Resource
from gateway.context import RequestContext

from . import codec
from .broker import AmqpBroker
from .channel import Channel
from .errors import AmqpError, method_ids
from .handshake import SERVER_PROPERTIES, authenticate, credentials, tune
from .methods import HANDLERS, NO_DRAIN
from .publisher import MAX_PENDING, RETRIABLE, Publisher
from .queue_state import QueueState
from .state import (
    TRANSITIONS,
    ChannelState,
    ConnState,
    Signal,
    channel_transition,
    no_channel,
    require_open,
    transition,
)
from .vhost import VHost

log = logging.getLogger("unimq.amqp")

__all__ = ["AmqpConnection", "SERVER_PROPERTIES"]

_NO_LIMITS = TrafficControl()  # what a door without an identity store charges: never active
OPEN = ConnState.OPEN
CLOSING = ConnState.CLOSING
CLOSED = ConnState.CLOSED
CH_ABSENT = ChannelState.ABSENT
CH_OPEN = ChannelState.OPEN
CH_CLOSING = ChannelState.CLOSING
# before the connection is tuned, a close is sent and the transport dropped at once (the spec
# allows it and clients expect it); later the client's CloseOk is awaited
_CLOSE_THEN_DROP = (ConnState.HEADER, ConnState.START, ConnState.TUNE)


class AmqpConnection(asyncio.Protocol):
    """Server side of one AMQP connection: the transport loop around the protocol state."""

    def __init__(self, broker: AmqpBroker, settings: Any) -> None:
        self.broker = broker
        self.settings = settings
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.decoder = codec.FrameDecoder(frame_max=max(settings.amqp_frame_max, codec.FRAME_MIN_SIZE),
                                          max_body=broker.max_message_size)
        self.state = ConnState.HEADER  # moved only through state.transition (see state.TRANSITIONS)
        self.frame_max = codec.FRAME_MIN_SIZE
        self.channel_max = settings.amqp_channel_max
        self.heartbeat = 0
        self.channels: dict[int, Channel] = {}
        self.vhost: VHost | None = None
        self.user = ""
        self.peer = ""
        self.ctx = RequestContext(protocol="amqp")
        self.send_ctx = self.ctx
        self.access_cache: dict[tuple[Action, str, str], bool] = {}  # access() answers until users change
        self.may_publish: set[str] = set()  # exchanges access() allowed writing to (the publish hot path)
        self.client_caps: dict[str, Any] = {}
        self.client_properties: dict[str, Any] = {}
        self.writable = True
        self._wbuf: list[bytes] = []
        self._flush_scheduled = False
        self._backlog: deque[Any] = deque()
        self._worker: asyncio.Task[None] | None = None
        self.publisher = Publisher(self)
        self._reading_paused = False
        self._last_recv = time.monotonic()
        self._hb_task: asyncio.Task[None] | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self.exclusive_queues: set[QueueState] = set()  # declared exclusive here: deleted with the connection
        ids = broker.identities
        # traffic limits (gateway.access.traffic): one inactive instance when there is no identity store
        self.traffic: TrafficControl = ids.traffic if ids is not None else _NO_LIMITS
        self.lease: Lease | None = None
        self.meter: Meter | None = None
        self._held_until = 0.0  # reading stopped until then: over its publish rate
        self._hold_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else ""
        self.broker.connections.add(self)
        self._close_timer = self.loop.call_later(10.0, self._handshake_timeout)

    def _handshake_timeout(self) -> None:
        if self.state is not OPEN and self.state is not CLOSED and self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        if self._hold_timer is not None:
            self._hold_timer.cancel()
        prev = self.state
        self.state = transition(prev, Signal.LOST)
        self.writable = False
        self.broker.connections.discard(self)
        if self._hb_task is not None:
            self._hb_task.cancel()
        if self._close_timer is not None:
            self._close_timer.cancel()
        if self._worker is not None and prev is not CLOSED:
            self._worker.cancel()
        self._backlog.clear()
        self._cleanup_channels()

    def _cleanup_channels(self) -> None:
        touched: list[QueueState] = []
        for ch in list(self.channels.values()):
            touched.extend(ch.close_state())
        self.channels.clear()
        if touched or self.exclusive_queues:
            self.broker._spawn(self._after_close(touched))

    async def _after_close(self, touched: list[QueueState]) -> None:
        for q in self.exclusive_queues:
            await self.broker.delete_queue(q)
        self.exclusive_queues.clear()
        for q in touched:
            await self.maybe_auto_delete(q)
            q.wake()

    async def maybe_auto_delete(self, q: QueueState) -> None:
        """Delete an auto-delete queue whose last consumer went away."""
        if q.auto_delete and q.had_consumer and not q.consumers and not q.deleted:
            await self.broker.delete_queue(q)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        for ch in self.channels.values():
            for c in ch.consumers.values():
                c.queue.wake()

    def write(self, data: bytes) -> None:
        if self.transport is None or self.state is CLOSED:
            return
        self._wbuf.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_writes)

    def _flush_writes(self) -> None:
        self._flush_scheduled = False
        if self._wbuf and self.transport is not None and not self.transport.is_closing():
            data = b"".join(self._wbuf) if len(self._wbuf) > 1 else self._wbuf[0]
            self._wbuf.clear()
            self.transport.write(data)
        else:
            self._wbuf.clear()

    def send_method(self, channel: int, m: Any) -> None:
        self.write(codec.encode_method(channel, m))

    def data_received(self, data: bytes) -> None:
        self._last_recv = time.monotonic()
        events = self.decoder.feed(data)
        if not events:
            return
        if self._worker is not None or self._backlog:
            self._backlog.extend(events)
            self._maybe_pause()
            return
        publish = self.publisher.publish
        content = codec.ContentReceived
        for i, ev in enumerate(events):
            st = self.state
            if st is CLOSED:
                return
            try:
                if type(ev) is content and st is OPEN:  # the hot path: a publish
                    publish(ev)
                    continue
                if self._handle_sync(ev):
                    continue
            except AmqpError as e:
                self._on_error(e, getattr(ev, "channel", 0))
                continue
            self._backlog.extend(events[i:])
            self._worker = self.loop.create_task(self._work())
            return
        self._maybe_pause()

    def _maybe_pause(self) -> None:
        if not self._reading_paused and (len(self._backlog) > MAX_PENDING or self.publisher.backlog() > MAX_PENDING):
            self._reading_paused = True
            if self.transport is not None and not self._held_until:
                self.transport.pause_reading()

    def meter_of(self) -> Meter:
        m = self.meter
        if m is None:
            m = self.meter = self.traffic.meter(self.ctx.principal, self.ctx.client_id)
        return m

    def hold(self, wait: float) -> None:
        """Over its publish rate: stop reading the socket for ``wait`` seconds, telling a client that
        takes ``connection.blocked`` (RabbitMQ's flow notice) why it is held."""
        until = self.loop.time() + wait
        if until <= self._held_until:
            return
        first = self._held_until == 0.0
        self._held_until = until
        if self._hold_timer is not None:
            self._hold_timer.cancel()
        self._hold_timer = self.loop.call_at(until, self._release_hold)
        if first:
            self.broker.processor.metrics.inc("quota_throttled", "amqp")
            if self.transport is not None and not self._reading_paused:
                self.transport.pause_reading()
            if self.broker.blocked is None:
                self.notify_blocked("publish rate limit")

    def _release_hold(self) -> None:
        self._hold_timer = None
        self._held_until = 0.0
        if self.state is CLOSED:
            return
        if self.broker.blocked is None:
            self.notify_blocked(None)
        if not self._reading_paused and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def maybe_resume(self) -> None:
        """Read from the socket again once the backlog and the pending publishes are down to half."""
        if self._held_until:
            if self._reading_paused and len(self._backlog) <= MAX_PENDING // 2 \
                    and self.publisher.backlog() <= MAX_PENDING // 2:
                self._reading_paused = False  # the hold's end resumes reading
            return
        if (self._reading_paused and len(self._backlog) <= MAX_PENDING // 2
                and self.publisher.backlog() <= MAX_PENDING // 2):
            self._reading_paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    async def _work(self) -> None:
        try:
            while self._backlog and self.state is not CLOSED:
                ev = self._backlog.popleft()
                ch = getattr(ev, "channel", 0)
                try:
                    if not self._handle_sync(ev):
                        await self._handle_async(ev)
                except AmqpError as e:
                    self._on_error(e, ch)
                except UnimqError as e:
                    self._on_error(self._map_error(e, ev), ch)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # a bug must cost one connection, not the server
                    log.exception("AMQP connection %s: error handling %r", self.peer, ev)
                    self._on_error(AmqpError(codec.INTERNAL_ERROR, f"internal error: {type(e).__name__}",
                                             hard=True), ch)
                self.maybe_resume()
        finally:
            self._worker = None

    @staticmethod
    def _map_error(e: UnimqError, ev: Any) -> AmqpError:
        m = getattr(ev, "method", None)
        cm = method_ids(m) if m is not None else (0, 0)
        if isinstance(e, TopicNotFoundError):
            return AmqpError(codec.NOT_FOUND, str(e), *cm)
        if isinstance(e, MessageTooLargeError):
            return AmqpError(codec.PRECONDITION_FAILED, str(e), *cm)
        if isinstance(e, RETRIABLE):
            return AmqpError(codec.RESOURCE_ERROR, str(e), *cm)
        return AmqpError(codec.INTERNAL_ERROR, f"{e.code}: {e}", *cm, hard=True)

    # ------------------------------------------------------------------ errors and closing

    def _on_error(self, e: AmqpError, channel: int) -> None:
        if e.hard or channel == 0:
            self.close_connection(e.code, e.text, e.class_id, e.method_id)
        else:
            self.close_channel(channel, e.code, e.text, e.class_id, e.method_id)

    def close_channel(self, number: int, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        ch = self.channels.get(number)
        if ch is None or ch.closing:
            return
        ch.closing = True
        self.decoder.discard_channel(number)
        touched = ch.close_state()
        self.send_method(number, codec.method(C.Channel.Close, reply_code=code, reply_text=text,
                                              class_id=class_id, method_id=method_id))
        if touched:
            self.broker._spawn(self._after_close(touched))

    def close_connection(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        if self.state is CLOSING or self.state is CLOSED:
            return
        nxt = transition(self.state, Signal.SERVER_CLOSE)
        if self.state in _CLOSE_THEN_DROP:
            # before Connection.Open the spec allows (and clients expect) close then drop
            self.send_method(0, codec.method(C.Connection.Close, reply_code=code, reply_text=text,
                                             class_id=class_id, method_id=method_id))
            self._flush_writes()
            self.state = nxt
            self.loop.call_later(0.05, self._abort)
            return
        self.state = nxt
        self._cleanup_channels()
        self.send_method(0, codec.method(C.Connection.Close, reply_code=code, reply_text=text,
                                         class_id=class_id, method_id=method_id))
        if self._close_timer is not None:
            self._close_timer.cancel()
        self._close_timer = self.loop.call_later(5.0, self._abort)

    async def shut_down(self) -> None:
        """The door stops: 320 CONNECTION_FORCED to an open connection, its publishes stored (5 s at
        most), its channels' unacknowledged messages back in their queues, the transport closed."""
        if self.state is OPEN:
            self.send_method(0, codec.method(C.Connection.Close, reply_code=codec.CONNECTION_FORCED,
                                             reply_text="CONNECTION_FORCED - broker forced connection closure "
                                                        "with reason 'shutdown'", class_id=0, method_id=0))
        try:  # asyncio.timeout, not wait_for: on 3.11 wait_for can drop a cancel of the stop
            async with asyncio.timeout(5):
                await self.publisher.drain()
        except Exception:  # TimeoutError included: whatever was not stored by then stays unconfirmed
            pass
        if self.state is not CLOSING and self.state is not CLOSED:
            self.state = transition(self.state, Signal.SERVER_CLOSE)
        self._cleanup_channels()
        self._abort()

    def _abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._flush_writes()
            self.transport.close()

    def notify_blocked(self, reason: str | None) -> None:
        if self.state is not OPEN or not self.client_caps.get("connection.blocked"):
            return
        if reason is None:
            self.send_method(0, codec.method(C.Connection.Unblocked))
        else:
            self.send_method(0, codec.method(C.Connection.Blocked, reason=reason))

    # ------------------------------------------------------------------ dispatch

    def _handle_sync(self, ev: Any) -> bool:
        """Handle events that need no await; False hands the event to the worker."""
        t = type(ev)
        if t is codec.ContentReceived:
            require_open(self.state, ev.method, "basic.publish")
            self.publisher.publish(ev)
            return True
        if t is codec.ContentRefused:  # RabbitMQ's answer, before a byte of the body is kept
            if self.channel_for(ev.channel, ev.method) is not None:
                raise AmqpError(codec.PRECONDITION_FAILED, f"message size {ev.size} is larger than configured max "
                                f"size {ev.limit}", 60, 40)
            return True
        if t is codec.MethodReceived:
            m = ev.method
            if type(m) is C.Basic.Ack and self.state is OPEN:
                ch = self.channel_for(ev.channel, m)
                if ch is not None:
                    ch.ack(m.delivery_tag, m.multiple)
                return True
            return False
        if t is codec.HeartbeatReceived:
            return True
        if t is codec.FrameError:
            self._frame_error(ev)
            return True
        if t is codec.ProtocolHeaderReceived:
            self._start()
            return True
        return False

    def _frame_error(self, ev: codec.FrameError) -> None:
        if ev.bad_header:
            if self.transport is not None:
                self.transport.write(codec.PROTOCOL_HEADER)
                self.transport.close()
            self.state = transition(self.state, Signal.LOST)
            return
        self.close_connection(ev.code, f"{codec.REPLY_TEXT.get(ev.code, 'ERROR')} - {ev.text}"[:255],
                              ev.class_id, ev.method_id)
        # the stream cannot be parsed any more (so no CloseOk will be seen): drop it shortly
        if self._close_timer is not None:
            self._close_timer.cancel()
        self._close_timer = self.loop.call_later(0.2, self._abort)

    def channel_for(self, number: int, m: Any) -> Channel | None:
        """The open channel a method is for; None when it is closing (the method is ignored)."""
        ch = self.channels.get(number)
        if ch is None:
            raise no_channel(number, m)
        if ch.closing:
            return None
        return ch

    async def _handle_async(self, ev: Any) -> None:
        if type(ev) is not codec.MethodReceived:
            return
        m = ev.method
        number = ev.channel
        st = self.state
        if st is CLOSED:
            return
        if st is CLOSING:
            # only the end of the close matters now: the peer's CloseOk, or its own Close crossing ours
            if (st, type(m)) in TRANSITIONS:
                if type(m) is C.Connection.Close:
                    self.send_method(0, codec.method(C.Connection.CloseOk))
                self._abort()
            return
        if number == 0:
            await self._connection_method(m)
            return
        require_open(st, m)
        ch = self.channels.get(number)
        cst = CH_ABSENT if ch is None else CH_CLOSING if ch.closing else CH_OPEN
        nxt = channel_transition(cst, m, number)  # 504 for a channel not open for it
        if ch is None:  # Channel.Open
            if number > self.channel_max:
                raise AmqpError(codec.NOT_ALLOWED, f"channel {number} exceeds channel_max {self.channel_max}", 20, 10,
                                hard=True)
            self.channels[number] = Channel(self, number)
            self.send_method(number, codec.method(C.Channel.OpenOk))
            return
        if cst is CH_CLOSING:
            if nxt is CH_ABSENT:  # the client's CloseOk
                del self.channels[number]
            elif type(m) is C.Channel.Close:
                self.send_method(number, codec.method(C.Channel.CloseOk))
            return
        handler = HANDLERS.get(type(m))
        if handler is None:
            raise AmqpError(codec.NOT_IMPLEMENTED, f"method {m.name} is not supported", *method_ids(m), hard=True)
        if type(m) not in NO_DRAIN:
            await self.publisher.drain()
        await handler(self, ch, m)

    # ------------------------------------------------------------------ connection class

    def _start(self) -> None:
        self.state = transition(self.state, Signal.PROTOCOL_HEADER)
        self.send_method(0, codec.method(C.Connection.Start, version_major=0, version_minor=9,
                                         server_properties=SERVER_PROPERTIES, mechanisms=" ".join(self._mechanisms()),
                                         locales="en_US"))

    def _mechanisms(self) -> list[str]:
        """The SASL mechanisms offered: amqp_auth_mechanisms, EXTERNAL only on a TLS connection."""
        configured = getattr(self.settings, "amqp_auth_mechanisms", ["PLAIN", "AMQPLAIN"])
        return [m for m in configured if m != "EXTERNAL" or is_tls(self.transport)]

    def _external_user(self) -> str:
        """EXTERNAL (RabbitMQ's rabbitmq_auth_mechanism_ssl): the CN of the verified client certificate,
        a user of the store (any name while it has none); else 403 in RabbitMQ's words."""
        cn = cert_identity(self.transport) if "EXTERNAL" in self._mechanisms() else None
        if cn is None or not known_identity(self.broker.identities, cn):
            raise AmqpError(codec.ACCESS_REFUSED, "Login was refused using authentication mechanism EXTERNAL. "
                            "For details see the broker logfile.", 10, 11, hard=True)
        return cn

    async def _connection_method(self, m: Any) -> None:
        """A method on channel 0: the table says whether it may come now (else 503) and what follows."""
        nxt = transition(self.state, type(m), m)
        t = type(m)
        if t is C.Connection.StartOk:
            await self._start_ok(m, nxt)
        elif t is C.Connection.TuneOk:
            self._tune_ok(m, nxt)
        elif t is C.Connection.Open:
            vh = self.broker.vhosts.get(m.virtual_host)
            if vh is None:
                raise AmqpError(codec.NOT_ALLOWED, f"vhost '{m.virtual_host}' not found", 10, 40, hard=True)
            ids = self.broker.identities
            if ids is not None and ids.has_users and not ids.rules.may_open_vhost(self.user, vh.name):
                self.broker.processor.metrics.inc("auth_denied", "amqp")
                log.warning("denied: user=%s protocol=amqp from=%s action=open vhost=%r", self.user, self.peer, vh.name)
                raise AmqpError(codec.ACCESS_REFUSED, f"access to vhost '{vh.name}' refused for user '{self.user}'",
                                10, 40, hard=True)
            if ids is not None:  # a connection slot of the user and client id (gateway.access.traffic)
                try:
                    self.lease = ids.traffic.connect(self.ctx.principal, self.ctx.client_id, address=self.peer)
                except QuotaExceededError as e:
                    self.broker.processor.metrics.inc("quota_exceeded", "amqp")
                    log.warning("refused: protocol=amqp user=%s from=%s: %s", self.user, self.peer, e)
                    kind, _, who = str(e.details.get("subject", "")).partition(":")
                    what = "connection rate limit ({:g}/s)" if e.details.get("what") == "connection_rate" \
                        else "connection limit ({})"
                    raise AmqpError(codec.NOT_ALLOWED, f"Connection refused for {kind} '{who}': {kind} "
                                    f"{what.format(e.details.get('limit'))} is reached", 10, 40, hard=True) from None
            self.vhost = vh
            self.state = nxt
            if self._close_timer is not None:
                self._close_timer.cancel()
                self._close_timer = None
            self.send_method(0, codec.method(C.Connection.OpenOk))
            if self.broker.blocked is not None:
                self.notify_blocked(self.broker.blocked)
        elif t is C.Connection.Close:
            self.state = nxt
            await self.publisher.drain()
            self._cleanup_channels()
            self.send_method(0, codec.method(C.Connection.CloseOk))
            self._flush_writes()
            self._abort()
        elif t is C.Connection.CloseOk:
            self._abort()
        elif t is C.Connection.UpdateSecret:
            self.send_method(0, codec.method(C.Connection.UpdateSecretOk))
        # Connection.Blocked / Unblocked from a client: nothing to do

    async def _start_ok(self, m: Any, nxt: ConnState) -> None:
        self.client_properties = m.client_properties or {}
        caps = self.client_properties.get("capabilities")
        self.client_caps = caps if isinstance(caps, dict) else {}
        ids = self.broker.identities
        user: str | None = None
        if ids is not None:
            await ids.throttle.wait("amqp", self.peer)
        if m.mechanism != "EXTERNAL" and ids is not None and (ids.has_users or ids.jwt is not None):
            # a JWT whose subject is the user name, the store, then amqp_users
            name, password = credentials(m.mechanism, m.response)
            if isinstance(name, str) and isinstance(password, str):
                if await ids.token_names(password, name) or \
                        (ids.has_users and await ids.authenticate_password(name, password) is not None):
                    user = name
        if user is None:
            try:
                user = self._external_user() if m.mechanism == "EXTERNAL" else authenticate(m, self.settings, self.peer)
            except AmqpError:
                if ids is not None:
                    ids.throttle.failed("amqp", self.peer)
                self.broker.processor.metrics.inc("auth_failed", "amqp")
                log.warning("login failed: protocol=amqp from=%s", self.peer)
                raise
        if ids is not None:
            ids.throttle.succeeded("amqp", self.peer)
        self.user = user
        self.ctx = RequestContext(protocol="amqp", client_id=str(self.client_properties.get("connection_name") or
                                                                 self.peer), remote_address=self.peer, principal=user)
        # what the door stores on the client's behalf once access() allowed it (RabbitMQ's model: the
        # vhost's exchanges and queues are asked, not the unified topics the door keeps them in)
        self.send_ctx = dataclasses.replace(self.ctx, trusted=True)
        self.state = nxt
        self.send_method(0, codec.method(C.Connection.Tune, channel_max=self.settings.amqp_channel_max,
                                         frame_max=self.settings.amqp_frame_max,
                                         heartbeat=self.settings.amqp_heartbeat))

    def _tune_ok(self, m: Any, nxt: ConnState) -> None:
        t = tune(m, self.settings)
        self.frame_max = t.frame_max
        self.decoder.frame_max = t.frame_max
        self.channel_max = t.channel_max
        self.heartbeat = t.heartbeat
        self.state = nxt
        if self.heartbeat:
            self._hb_task = self.loop.create_task(self._heartbeats())

    async def _heartbeats(self) -> None:
        interval = self.heartbeat
        while self.state is not CLOSED:
            await asyncio.sleep(interval / 2)
            if self.state is CLOSED:
                return
            if self._held_until:  # over its publish rate: its socket is not being read, not silent
                self._last_recv = time.monotonic()
            elif time.monotonic() - self._last_recv > interval * 2:
                log.info("AMQP connection %s missed heartbeats; closing", self.peer)
                if self.transport is not None:
                    self.transport.abort()
                return
            self.write(codec.HEARTBEAT_FRAME)

    # ------------------------------------------------------------------ helpers for handlers

    def access(self, action: Action, kind: str, name: str, m: Any) -> None:
        """RabbitMQ's check of one exchange or queue (configure: CREATE, write: PUBLISH, read: SUBSCRIBE),
        asked of the processor's authorizer once users exist; refused: 403 ACCESS_REFUSED, RabbitMQ's words."""
        if not self.broker.access_enforced:
            return
        key = (action, kind, name)
        ok = self.access_cache.get(key)
        if ok is None:
            vh = self.vhost
            assert vh is not None
            ok = self.broker.processor.allowed(self.ctx, action, Resource.AMQP, f"{vh.name}{AMQP_SEP}{name}")
            if len(self.access_cache) > 1024:
                self.access_cache.clear()
            self.access_cache[key] = ok
        if not ok:
            vh = self.vhost
            raise AmqpError(codec.ACCESS_REFUSED, f"access to {kind} '{name}' in vhost '{vh.name if vh else ''}' "
                            f"refused for user '{self.user}'", *method_ids(m))

    def queue_for(self, ch: Channel, name: str, m: Any) -> QueueState:
        """The queue a method names (empty: the channel's last declared one), if this connection may use it."""
        vh = self.vhost
        assert vh is not None
        if not name:
            name = ch.last_queue
            if not name:
                raise AmqpError(codec.NOT_FOUND, "no previously declared queue", *method_ids(m))
        q = vh.queues.get(name)
        if q is None:
            raise AmqpError(codec.NOT_FOUND, f"no queue '{name}' in vhost '{vh.name}'", *method_ids(m))
        self.check_exclusive(q, m)
        return q

    def check_exclusive(self, q: QueueState, m: Any) -> None:
        """405 RESOURCE_LOCKED when ``q`` is another connection's exclusive queue."""
        if q.exclusive is not None and q.exclusive is not self:
            raise AmqpError(codec.RESOURCE_LOCKED, f"cannot obtain exclusive access to locked queue '{q.name}' in "
                            f"vhost '{q.vhost.name}'. It could be originally declared on another connection or the "
                            "exclusive property value does not match that of the original declaration.", *method_ids(m))
