"""One AMQP 0-9-1 client connection: handshake, channels, and every method's semantics.

Why an ``asyncio.Protocol`` and not streams: the hot path (publish, deliver,
ack) must not pay a coroutine switch per frame. ``data_received`` feeds the
sans-io :class:`~adapters.amqp.codec.FrameDecoder` and handles publishes
and acks inline; the first method that needs the store or the durable state
(declare, bind, get, ...) hands the rest of the events to one worker task
that processes them strictly in order, as AMQP requires per channel.

Publishes are pipelined: each is routed at once (exchange and bindings as
they are now) and appended to the connection's pending batch; one sender
task stores whole batches with a single ``processor.send`` (group commit
under ``--flush sync``) and then sends the publisher confirms of the batch
(``multiple``). Any other method first waits until the pending publishes
are stored, so a publish followed by a get or a declare on the same
connection sees its message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from pamqp import commands as C

from core_broker.errors import (
    MessageTooLargeError,
    NotEnoughInSyncReplicasError,
    NotMasterError,
    StoreFullError,
    TopicNotFoundError,
    UnimqError,
)
from gateway.context import RequestContext

from . import codec
from .broker import AmqpBroker
from .durable import args_key
from .errors import AmqpError
from .lease import Lease
from .queue_state import UNBOUNDED_CREDIT, QueueState
from .vhost import VHost
from .mapping import build_message, encoded_delivery
from .routing import EXCHANGE_TYPES, Binding, Exchange

# Refusals a client may retry (a soft 506 channel error, and basic.nack under confirms): the
# disk is full, or a replicated group has too few in-sync replicas or is changing masters.
_RETRIABLE = (StoreFullError, NotEnoughInSyncReplicasError, NotMasterError)

log = logging.getLogger("unimq.amqp")

MAX_PENDING = 4096  # publishes waiting to be stored before the connection stops reading
MAX_BATCH = 1024  # the processor's batch limit

SERVER_PROPERTIES = {
    "product": "unimq",
    "version": "0.1.0",
    "platform": "Python",
    "cluster_name": "unimq",
    "copyright": "unimq contributors",
    "information": "AMQP 0-9-1 door of unimq (https://www.rabbitmq.com/amqp-0-9-1-reference.html dialect)",
    "capabilities": {
        "publisher_confirms": True,
        "exchange_exchange_bindings": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
        "per_consumer_qos": True,
        "consumer_priorities": False,
        "direct_reply_to": False,
    },
}


# A publish on its way to the store: channel, message, queues it reaches, confirm sequence
# (negative: nack), delivery template (raw properties, exchange, routing key) or None.
Pub = tuple["Channel", Any, list[QueueState], "int | None", Any]


def _cm(m: Any) -> tuple[int, int]:
    return m.index >> 16, m.index & 0xFFFF


class Consumer:
    __slots__ = ("channel", "queue", "tag", "no_ack", "exclusive", "prefetch", "unacked")

    def __init__(self, channel: "Channel", queue: QueueState, tag: str, no_ack: bool, exclusive: bool,
                 prefetch: int) -> None:
        self.channel = channel
        self.queue = queue
        self.tag = tag
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.unacked = 0

    def credit(self) -> int:
        ch = self.channel
        if not ch.active or ch.closing or not ch.conn.writable:
            return 0
        if self.no_ack:
            return UNBOUNDED_CREDIT
        n = self.prefetch - self.unacked if self.prefetch else UNBOUNDED_CREDIT
        if ch.global_prefetch:
            n = min(n, ch.global_prefetch - len(ch.unacked))
        return n if n > 0 else 0


class Channel:
    def __init__(self, conn: "AmqpConnection", number: int) -> None:
        self.conn = conn
        self.number = number
        self.closing = False  # we sent Channel.Close and wait for CloseOk
        self.active = True  # Channel.Flow from the client
        self.next_tag = 1
        self.unacked: dict[int, Lease] = {}
        self.consumers: dict[str, Consumer] = {}
        self.prefetch = 0  # for consumers created from now on (basic.qos global=false)
        self.global_prefetch = 0  # shared by the channel's consumers (basic.qos global=true)
        self.confirm = False
        self.pub_seq = 0
        self.tx = False
        self.tx_pubs: list[tuple[Any, list[QueueState], int | None, Any]] = []
        self.tx_acks: list[tuple[str, int, bool, bool]] = []  # (kind, tag, multiple, requeue)
        self.last_queue = ""

    # -- deliveries -------------------------------------------------------------------

    def deliver(self, consumer: Consumer, lease: Lease) -> None:
        """Send one message to a consumer (called by the queue's pump)."""
        tag = self.next_tag
        self.next_tag = tag + 1
        m = lease.msg
        tmpl = lease.tmpl
        if tmpl is None:
            tmpl = encoded_delivery(m)
        conn = self.conn
        conn.write(codec.encode_delivery(self.number, consumer.tag, tag, lease.attempt > 1, tmpl[1], tmpl[2],
                                         tmpl[0], m.body, conn.frame_max))
        q = lease.queue
        lane = lease.lane
        if lease.offset >= lane.hw:
            lane.hw = lease.offset + 1
        if consumer.no_ack:
            q.count -= 1
            conn.broker.ack_lease(lease)
        else:
            lease.tag = tag
            lease.consumer = consumer
            lease.channel = self
            self.unacked[tag] = lease
            consumer.unacked += 1
            q.unacked += 1

    def server_cancel(self, consumer: Consumer) -> None:
        """The queue went away: forget the consumer and tell the client if it understands Basic.Cancel."""
        self.consumers.pop(consumer.tag, None)
        if self.closing:
            return
        caps = self.conn.client_caps
        if caps.get("consumer_cancel_notify"):
            self.conn.send_method(self.number, codec.method(C.Basic.Cancel, consumer_tag=consumer.tag, nowait=True))

    # -- settling ------------------------------------------------------------------------

    def _take(self, tag: int, multiple: bool, cm: tuple[int, int]) -> list[Lease]:
        un = self.unacked
        if multiple:
            out = []
            if tag == 0:
                out = list(un.values())
                un.clear()
                return out
            if tag not in un and not any(t <= tag for t in un):
                raise AmqpError(codec.PRECONDITION_FAILED, f"unknown delivery tag {tag}", *cm)
            tags = []
            for t in un:  # delivery tags were inserted in increasing order
                if t > tag:
                    break
                tags.append(t)
            pop = un.pop
            return [pop(t) for t in tags]
        lease = un.pop(tag, None)
        if lease is None:
            raise AmqpError(codec.PRECONDITION_FAILED, f"unknown delivery tag {tag}", *cm)
        return [lease]

    def _settled(self, lease: Lease) -> QueueState:
        c = lease.consumer
        if c is not None:
            c.unacked -= 1
        q = lease.queue
        q.unacked -= 1
        return q

    def ack(self, tag: int, multiple: bool) -> None:
        if self.tx:
            self._take_check(tag, multiple, (60, 80))
            self.tx_acks.append(("ack", tag, multiple, False))
            return
        woken: set[QueueState] = set()
        broker = self.conn.broker
        for lease in self._take(tag, multiple, (60, 80)):
            q = self._settled(lease)
            q.count -= 1
            broker.ack_lease(lease)
            woken.add(q)
        for q in woken:
            q.wake()

    def _take_check(self, tag: int, multiple: bool, cm: tuple[int, int]) -> None:
        if multiple:
            if tag and not any(t <= tag for t in self.unacked):
                raise AmqpError(codec.PRECONDITION_FAILED, f"unknown delivery tag {tag}", *cm)
        elif tag not in self.unacked:
            raise AmqpError(codec.PRECONDITION_FAILED, f"unknown delivery tag {tag}", *cm)

    async def reject(self, tag: int, multiple: bool, requeue: bool, cm: tuple[int, int]) -> None:
        if self.tx:
            self._take_check(tag, multiple, cm)
            self.tx_acks.append(("nack", tag, multiple, requeue))
            return
        await self._reject(self._take(tag, multiple, cm), requeue)

    async def _reject(self, leases: list[Lease], requeue: bool) -> None:
        broker = self.conn.broker
        for lease in leases:
            q = self._settled(lease)
            if requeue:
                broker.release(lease)
            else:
                q.count -= 1
                await broker.dead_letter(q, lease, "rejected")
            q.wake()

    def requeue_all(self) -> None:
        """Give every unacked message of this channel back to its queue (close, recover)."""
        broker = self.conn.broker
        leases = list(self.unacked.values())
        self.unacked.clear()
        for lease in leases:
            self._settled(lease)
            broker.release(lease)
        for c in self.consumers.values():
            c.unacked = 0

    def close_state(self) -> list[QueueState]:
        """Drop consumers, requeue unacked; returns the queues whose consumers changed."""
        touched: list[QueueState] = []
        for c in list(self.consumers.values()):
            q = c.queue
            q.drop_consumer(c)
            touched.append(q)
        self.consumers.clear()
        self.requeue_all()
        self.tx_pubs.clear()
        self.tx_acks.clear()
        return touched


class AmqpConnection(asyncio.Protocol):
    """Server side of one AMQP connection."""

    def __init__(self, broker: AmqpBroker, settings: Any) -> None:
        self.broker = broker
        self.settings = settings
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.decoder = codec.FrameDecoder(frame_max=max(settings.amqp_frame_max, codec.FRAME_MIN_SIZE),
                                          max_body=broker.max_message_size)
        self.state = "header"  # header -> start -> tune -> open_wait -> open -> closing -> closed
        self.frame_max = codec.FRAME_MIN_SIZE
        self.channel_max = settings.amqp_channel_max
        self.heartbeat = 0
        self.channels: dict[int, Channel] = {}
        self.vhost: VHost | None = None
        self.user = ""
        self.peer = ""
        self.ctx = RequestContext(protocol="amqp")
        self.client_caps: dict[str, Any] = {}
        self.client_properties: dict[str, Any] = {}
        self.writable = True
        self._wbuf: list[bytes] = []
        self._flush_scheduled = False
        self._backlog: deque[Any] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._pending: list[Pub] = []
        self._sender: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._reading_paused = False
        self._last_recv = time.monotonic()
        self._hb_task: asyncio.Task[None] | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self._exclusive: set[QueueState] = set()
        self._tmpls: dict[tuple[bytes, str, str], tuple[bytes, str, str]] = {}

    # ------------------------------------------------------------------ transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else ""
        self.broker.connections.add(self)
        self._close_timer = self.loop.call_later(10.0, self._handshake_timeout)

    def _handshake_timeout(self) -> None:
        if self.state not in ("open", "closed") and self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        prev = self.state
        self.state = "closed"
        self.writable = False
        self.broker.connections.discard(self)
        if self._hb_task is not None:
            self._hb_task.cancel()
        if self._close_timer is not None:
            self._close_timer.cancel()
        if self._worker is not None and prev != "closed":
            self._worker.cancel()
        self._backlog.clear()
        self._cleanup_channels()

    def _cleanup_channels(self) -> None:
        touched: list[QueueState] = []
        for ch in list(self.channels.values()):
            touched.extend(ch.close_state())
        self.channels.clear()
        if touched or self._exclusive:
            self.broker._spawn(self._after_close(touched))

    async def _after_close(self, touched: list[QueueState]) -> None:
        for q in self._exclusive:
            await self.broker.delete_queue(q)
        self._exclusive.clear()
        for q in touched:
            await self._maybe_auto_delete(q)
            q.wake()

    async def _maybe_auto_delete(self, q: QueueState) -> None:
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
        if self.transport is None or self.state == "closed":
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
        publish = self._publish
        content = codec.ContentReceived
        for i, ev in enumerate(events):
            st = self.state
            if st == "closed":
                return
            try:
                if type(ev) is content and st == "open":  # the hot path: a publish
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
        if not self._reading_paused and (len(self._backlog) > MAX_PENDING or len(self._pending) > MAX_PENDING):
            self._reading_paused = True
            if self.transport is not None:
                self.transport.pause_reading()

    def _maybe_resume(self) -> None:
        if self._reading_paused and len(self._backlog) <= MAX_PENDING // 2 and len(self._pending) <= MAX_PENDING // 2:
            self._reading_paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()

    async def _work(self) -> None:
        try:
            while self._backlog and self.state != "closed":
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
                self._maybe_resume()
        finally:
            self._worker = None

    @staticmethod
    def _map_error(e: UnimqError, ev: Any) -> AmqpError:
        m = getattr(ev, "method", None)
        cm = _cm(m) if m is not None else (0, 0)
        if isinstance(e, TopicNotFoundError):
            return AmqpError(codec.NOT_FOUND, str(e), *cm)
        if isinstance(e, MessageTooLargeError):
            return AmqpError(codec.PRECONDITION_FAILED, str(e), *cm)
        if isinstance(e, _RETRIABLE):
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
        if self.state in ("closing", "closed"):
            return
        if self.state in ("header", "start", "tune"):
            # before Connection.Open the spec allows (and clients expect) close then drop
            self.send_method(0, codec.method(C.Connection.Close, reply_code=code, reply_text=text,
                                             class_id=class_id, method_id=method_id))
            self._flush_writes()
            self.state = "closing"
            self.loop.call_later(0.05, self._abort)
            return
        self.state = "closing"
        self._cleanup_channels()
        self.send_method(0, codec.method(C.Connection.Close, reply_code=code, reply_text=text,
                                         class_id=class_id, method_id=method_id))
        if self._close_timer is not None:
            self._close_timer.cancel()
        self._close_timer = self.loop.call_later(5.0, self._abort)

    def _abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._flush_writes()
            self.transport.close()

    def notify_blocked(self, reason: str | None) -> None:
        if self.state != "open" or not self.client_caps.get("connection.blocked"):
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
            if self.state != "open":
                raise AmqpError(codec.COMMAND_INVALID, "basic.publish before the connection is open", 60, 40,
                                hard=True)
            self._publish(ev)
            return True
        if t is codec.ContentRefused:  # RabbitMQ's answer, before a byte of the body is kept
            if self._channel(ev.channel, ev.method) is not None:
                raise AmqpError(codec.PRECONDITION_FAILED, f"message size {ev.size} is larger than configured max "
                                f"size {ev.limit}", 60, 40)
            return True
        if t is codec.MethodReceived:
            m = ev.method
            if type(m) is C.Basic.Ack and self.state == "open":
                ch = self._channel(ev.channel, m)
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
            self.state = "closed"
            return
        self.close_connection(ev.code, f"{codec.REPLY_TEXT.get(ev.code, 'ERROR')} - {ev.text}"[:255],
                              ev.class_id, ev.method_id)
        # the stream cannot be parsed any more (so no CloseOk will be seen): drop it shortly
        if self._close_timer is not None:
            self._close_timer.cancel()
        self._close_timer = self.loop.call_later(0.2, self._abort)

    def _channel(self, number: int, m: Any) -> Channel | None:
        """The open channel a method is for; None when it is closing (the method is ignored)."""
        ch = self.channels.get(number)
        if ch is None:
            raise AmqpError(codec.CHANNEL_ERROR, f"expected 'channel.open' on channel {number}", *_cm(m), hard=True)
        if ch.closing:
            return None
        return ch

    async def _handle_async(self, ev: Any) -> None:
        if type(ev) is not codec.MethodReceived:
            return
        m = ev.method
        number = ev.channel
        st = self.state
        if st == "closed":
            return
        if st == "closing":
            if isinstance(m, C.Connection.CloseOk):
                self._abort()
            elif isinstance(m, C.Connection.Close):
                self.send_method(0, codec.method(C.Connection.CloseOk))
                self._abort()
            return
        if number == 0:
            await self._connection_method(m)
            return
        if st != "open":
            raise AmqpError(codec.COMMAND_INVALID, f"{m.name} before the connection is open", *_cm(m), hard=True)
        if isinstance(m, C.Channel.Open):
            if number in self.channels:
                raise AmqpError(codec.CHANNEL_ERROR, f"second 'channel.open' seen on channel {number}", 20, 10,
                                hard=True)
            if number > self.channel_max:
                raise AmqpError(codec.NOT_ALLOWED, f"channel {number} exceeds channel_max {self.channel_max}", 20, 10,
                                hard=True)
            self.channels[number] = Channel(self, number)
            self.send_method(number, codec.method(C.Channel.OpenOk))
            return
        ch = self.channels.get(number)
        if ch is None:
            raise AmqpError(codec.CHANNEL_ERROR, f"expected 'channel.open' on channel {number}", *_cm(m), hard=True)
        if ch.closing:
            if isinstance(m, C.Channel.CloseOk):
                del self.channels[number]
            elif isinstance(m, C.Channel.Close):
                self.send_method(number, codec.method(C.Channel.CloseOk))
            return
        handler = _HANDLERS.get(type(m))
        if handler is None:
            raise AmqpError(codec.NOT_IMPLEMENTED, f"method {m.name} is not supported", *_cm(m), hard=True)
        if type(m) not in _NO_DRAIN:
            await self.drain()
        await handler(self, ch, m)

    async def drain(self) -> None:
        """Wait until every publish received so far is stored."""
        while self._pending or self._sender is not None:
            await self._idle.wait()

    # ------------------------------------------------------------------ connection class

    def _start(self) -> None:
        self.state = "start"
        self.send_method(0, codec.method(C.Connection.Start, version_major=0, version_minor=9,
                                         server_properties=SERVER_PROPERTIES, mechanisms="PLAIN AMQPLAIN",
                                         locales="en_US"))

    async def _connection_method(self, m: Any) -> None:
        st = self.state
        if isinstance(m, C.Connection.StartOk) and st == "start":
            self._start_ok(m)
        elif isinstance(m, C.Connection.TuneOk) and st == "tune":
            self._tune_ok(m)
        elif isinstance(m, C.Connection.Open) and st == "open_wait":
            vh = self.broker.vhosts.get(m.virtual_host)
            if vh is None:
                raise AmqpError(codec.NOT_ALLOWED, f"vhost '{m.virtual_host}' not found", 10, 40, hard=True)
            self.vhost = vh
            self.state = "open"
            if self._close_timer is not None:
                self._close_timer.cancel()
                self._close_timer = None
            self.send_method(0, codec.method(C.Connection.OpenOk))
            if self.broker.blocked is not None:
                self.notify_blocked(self.broker.blocked)
        elif isinstance(m, C.Connection.Close):
            self.state = "closing"
            await self.drain()
            self._cleanup_channels()
            self.send_method(0, codec.method(C.Connection.CloseOk))
            self._flush_writes()
            self._abort()
        elif isinstance(m, C.Connection.CloseOk):
            self._abort()
        elif isinstance(m, C.Connection.UpdateSecret) and st == "open":
            self.send_method(0, codec.method(C.Connection.UpdateSecretOk))
        elif isinstance(m, (C.Connection.Blocked, C.Connection.Unblocked)):
            pass
        else:
            raise AmqpError(codec.COMMAND_INVALID, f"unexpected method {m.name} on channel 0 (state {st})",
                            *_cm(m), hard=True)

    def _start_ok(self, m: Any) -> None:
        self.client_properties = m.client_properties or {}
        caps = self.client_properties.get("capabilities")
        self.client_caps = caps if isinstance(caps, dict) else {}
        resp = m.response
        raw = resp.encode("utf-8") if isinstance(resp, str) else bytes(resp or b"")
        user = password = None
        if m.mechanism == "PLAIN":
            parts = raw.split(b"\x00")
            if len(parts) == 3:
                user, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        elif m.mechanism == "AMQPLAIN":
            try:
                import struct

                from pamqp import decode as pdecode

                table = pdecode.field_table(struct.pack(">I", len(raw)) + raw)[1]
                user, password = table.get("LOGIN"), table.get("PASSWORD")
                if isinstance(user, bytes):
                    user = user.decode("utf-8", "replace")
                if isinstance(password, bytes):
                    password = password.decode("utf-8", "replace")
            except (ValueError, TypeError):
                pass
        else:
            raise AmqpError(codec.ACCESS_REFUSED, f"unsupported authentication mechanism '{m.mechanism}'", 10, 11,
                            hard=True)
        users = self.settings.amqp_users
        if user is None or users.get(user) != password:
            raise AmqpError(codec.ACCESS_REFUSED,
                            f"Login was refused using authentication mechanism {m.mechanism}. For details see the "
                            "broker logfile.", 10, 11, hard=True)
        if user in self.settings.amqp_loopback_users:
            host = self.peer.rsplit(":", 1)[0]
            if not (host.startswith("127.") or host in ("::1", "localhost") or host.startswith("::ffff:127.")):
                raise AmqpError(codec.ACCESS_REFUSED, f"user '{user}' can only connect via localhost", 10, 11,
                                hard=True)
        self.user = user
        self.ctx = RequestContext(protocol="amqp", client_id=str(self.client_properties.get("connection_name") or
                                                                 self.peer), remote_address=self.peer, principal=user)
        self.state = "tune"
        self.send_method(0, codec.method(C.Connection.Tune, channel_max=self.settings.amqp_channel_max,
                                         frame_max=self.settings.amqp_frame_max,
                                         heartbeat=self.settings.amqp_heartbeat))

    def _tune_ok(self, m: Any) -> None:
        fm = m.frame_max or self.settings.amqp_frame_max
        if fm < codec.FRAME_MIN_SIZE:
            raise AmqpError(codec.NOT_ALLOWED, f"frame_max={fm} < {codec.FRAME_MIN_SIZE} min size", 10, 31, hard=True)
        if fm > self.settings.amqp_frame_max:
            raise AmqpError(codec.NOT_ALLOWED, f"frame_max={fm} > {self.settings.amqp_frame_max} max size", 10, 31,
                            hard=True)
        self.frame_max = fm
        self.decoder.frame_max = fm
        cm = m.channel_max or self.settings.amqp_channel_max
        self.channel_max = min(cm, self.settings.amqp_channel_max)
        self.heartbeat = m.heartbeat
        self.state = "open_wait"
        if self.heartbeat:
            self._hb_task = self.loop.create_task(self._heartbeats())

    async def _heartbeats(self) -> None:
        interval = self.heartbeat
        while self.state not in ("closed",):
            await asyncio.sleep(interval / 2)
            if self.state == "closed":
                return
            if time.monotonic() - self._last_recv > interval * 2:
                log.info("AMQP connection %s missed heartbeats; closing", self.peer)
                if self.transport is not None:
                    self.transport.abort()
                return
            self.write(codec.HEARTBEAT_FRAME)

    # ------------------------------------------------------------------ publishing

    def _publish(self, ev: codec.ContentReceived) -> None:
        m = ev.method
        ch = self._channel(ev.channel, m)
        if ch is None:
            return
        vh = self.vhost
        assert vh is not None
        exname = m.exchange
        ex = vh.exchanges.get(exname)
        if ex is None:
            raise AmqpError(codec.NOT_FOUND, f"no exchange '{exname}' in vhost '{vh.name}'", 60, 40)
        if ex.internal:
            raise AmqpError(codec.ACCESS_REFUSED, f"cannot publish to internal exchange '{exname}' in vhost "
                            f"'{vh.name}'", 60, 40)
        if m.immediate:
            raise AmqpError(codec.NOT_IMPLEMENTED, "immediate=true", 60, 40, hard=True)
        body = ev.body
        if len(body) > self.broker.max_message_size:
            raise AmqpError(codec.PRECONDITION_FAILED, f"message size {len(body)} is larger than configured max "
                            f"size {self.broker.max_message_size}", 60, 40)
        props = ev.properties
        if props:
            uid = props.get("user_id")
            if uid is not None and uid != self.user:
                raise AmqpError(codec.PRECONDITION_FAILED, f"user_id property set to '{uid}' but authenticated user "
                                f"was '{self.user}'", 60, 40)
            exp = props.get("expiration")
            if exp is not None and not (exp.isdigit() and len(exp) < 19):
                raise AmqpError(codec.PRECONDITION_FAILED, f"invalid expiration '{exp}'", 60, 40)
            headers = props.get("headers")
        else:
            headers = None
        rk = m.routing_key
        queues = vh.route(exname, rk, headers)
        rejected = False
        if queues:
            for q in queues:
                if q.max_length is not None and q.rejects_publish():
                    rejected = True
                    queues = [x for x in queues if not x.rejects_publish()]
                    break
        topic, mqtt = vh.unified_topic(exname, rk)
        raw_props = ev.raw_props
        targets = queues[0].targets if len(queues) == 1 else tuple(t for q in queues for t in q.targets)
        msg = build_message(topic, mqtt, exname, rk, props, ev.raw_headers, body, targets,
                            raw_props)
        # what a delivery from memory sends: the properties exactly as published
        if raw_props is not None:
            key = (raw_props, exname, rk)
            tmpl = self._tmpls.get(key)
            if tmpl is None:
                if len(self._tmpls) >= 1024:
                    self._tmpls.clear()
                tmpl = self._tmpls[key] = key  # shared by the publishes that repeat it
        else:
            tmpl = None
        seq = None
        if ch.confirm:
            ch.pub_seq += 1
            seq = ch.pub_seq
            if rejected:
                seq = -seq  # nack once stored
        if m.mandatory and not queues and not rejected:
            self.write(
                codec.encode_method(ch.number, codec.method(C.Basic.Return, reply_code=codec.NO_ROUTE,
                                                            reply_text="NO_ROUTE", exchange=exname, routing_key=rk))
                + codec.encode_content(ch.number, codec.encode_properties(props, ev.raw_headers), body,
                                       self.frame_max)
            )
        if ch.tx:
            ch.tx_pubs.append((msg, queues, seq, tmpl))
            return
        self._pending.append((ch, msg, queues, seq, tmpl))
        if self._sender is None:
            self._idle.clear()
            self._sender = self.loop.create_task(self._send_loop())

    async def _send_loop(self) -> None:
        try:
            while self._pending and self.state != "closed":
                batch = self._pending[:MAX_BATCH]
                del self._pending[: len(batch)]
                await self._store(batch)
                self._maybe_resume()
        finally:
            self._pending.clear() if self.state == "closed" else None
            self._sender = None
            self._idle.set()

    async def _store(self, batch: list[Pub]) -> None:
        broker = self.broker
        try:
            results = await broker.send(self.ctx, [b[1] for b in batch])
        except UnimqError as e:
            if isinstance(e, StoreFullError):
                broker.set_blocked("low on disk")
            log.warning("AMQP connection %s: storing %d message(s) failed: %s", self.peer, len(batch), e)
            failed: set[Channel] = set()
            last_seq: dict[Channel, int] = {}
            for ch, _msg, _qs, seq, _t in batch:
                if seq is not None:
                    last_seq[ch] = abs(seq)
                else:
                    failed.add(ch)
            for ch, seq in last_seq.items():
                if not ch.closing:
                    self.write(codec.encode_method(ch.number, codec.method(C.Basic.Nack, delivery_tag=seq,
                                                                           multiple=True, requeue=False)))
            code = codec.RESOURCE_ERROR if isinstance(e, _RETRIABLE) else codec.INTERNAL_ERROR
            for ch in failed:
                if ch.number in self.channels:
                    self.close_channel(ch.number, code, f"{codec.REPLY_TEXT[code]} - message not stored: {e}", 60, 40)
            return
        touched: dict[QueueState, None] = {}
        for (_ch, msg, queues, _seq, tmpl), r in zip(batch, results):
            if queues:
                # the first extra-dispatch targets are these queues' LMQs, in this order
                offs = r.extra_offsets
                for i, q in enumerate(queues):
                    q.on_enqueued(msg, offs[i] if i < len(offs) else None, r.broker, tmpl)
                    if q.max_length is not None:
                        touched[q] = None
        for q in touched:
            await q.enforce_max_length()
        self._confirm(batch)

    def _confirm(self, batch: list[Pub]) -> None:
        acks: dict[Channel, int] = {}
        for ch, _msg, _qs, seq, _t in batch:
            if seq is None:
                continue
            if seq < 0:  # rejected by a full queue (x-overflow reject-publish)
                if ch in acks:
                    self.write(codec.encode_basic_ack(ch.number, acks.pop(ch), True))
                self.write(codec.encode_method(ch.number, codec.method(C.Basic.Nack, delivery_tag=-seq,
                                                                       multiple=False, requeue=False)))
                continue
            acks[ch] = seq
        for ch, seq in acks.items():
            if not ch.closing and ch.number in self.channels:
                self.write(codec.encode_basic_ack(ch.number, seq, True))

    # ------------------------------------------------------------------ helpers for handlers

    def queue_for(self, ch: Channel, name: str, m: Any) -> QueueState:
        vh = self.vhost
        assert vh is not None
        if not name:
            name = ch.last_queue
            if not name:
                raise AmqpError(codec.NOT_FOUND, "no previously declared queue", *_cm(m))
        q = vh.queues.get(name)
        if q is None:
            raise AmqpError(codec.NOT_FOUND, f"no queue '{name}' in vhost '{vh.name}'", *_cm(m))
        self.check_exclusive(q, m)
        return q

    def check_exclusive(self, q: QueueState, m: Any) -> None:
        if q.exclusive is not None and q.exclusive is not self:
            raise AmqpError(codec.RESOURCE_LOCKED, f"cannot obtain exclusive access to locked queue '{q.name}' in "
                            f"vhost '{q.vhost.name}'. It could be originally declared on another connection or the "
                            "exclusive property value does not match that of the original declaration.", *_cm(m))


# ============================================================================== method handlers


async def _channel_close(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    touched = ch.close_state()
    conn.decoder.discard_channel(ch.number)
    del conn.channels[ch.number]
    conn.send_method(ch.number, codec.method(C.Channel.CloseOk))
    for q in touched:
        await conn._maybe_auto_delete(q)
        q.wake()


async def _channel_close_ok(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    pass  # CloseOk for a close we did not send: ignore


async def _channel_flow(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    ch.active = bool(m.active)
    conn.send_method(ch.number, codec.method(C.Channel.FlowOk, active=ch.active))
    if ch.active:
        for c in ch.consumers.values():
            c.queue.wake()


async def _channel_flow_ok(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    pass


def _reserved(name: str) -> bool:
    return name.startswith("amq.")


async def _exchange_declare(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    vh = conn.vhost
    assert vh is not None
    name = m.exchange
    ex = vh.exchanges.get(name)
    if m.passive:
        if ex is None:
            raise AmqpError(codec.NOT_FOUND, f"no exchange '{name}' in vhost '{vh.name}'", 40, 10)
    else:
        if name == "":
            raise AmqpError(codec.ACCESS_REFUSED, "operation not permitted on the default exchange", 40, 10)
        if m.exchange_type not in EXCHANGE_TYPES:
            raise AmqpError(codec.COMMAND_INVALID, f"unknown exchange type '{m.exchange_type}'", 40, 10, hard=True)
        args = m.arguments or {}
        if ex is not None:
            diff = ex.equivalent(m.exchange_type, m.durable, m.auto_delete, m.internal, args)
            if diff is not None:
                raise AmqpError(codec.PRECONDITION_FAILED,
                                f"inequivalent arg for exchange '{name}' in vhost '{vh.name}': {diff}", 40, 10)
        else:
            if _reserved(name):
                raise AmqpError(codec.ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'",
                                40, 10)
            ex = Exchange(name, m.exchange_type, m.durable, m.auto_delete, m.internal, dict(args))
            vh.exchanges[name] = ex
            vh.version += 1
            await conn.broker.save_exchange(vh, ex)
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Exchange.DeclareOk))


async def _exchange_delete(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    vh = conn.vhost
    assert vh is not None
    name = m.exchange
    if name == "" or _reserved(name):
        raise AmqpError(codec.ACCESS_REFUSED, f"operation not permitted on exchange '{name}'", 40, 20)
    ex = vh.exchanges.get(name)
    if ex is not None:
        if m.if_unused and ex.bindings:
            raise AmqpError(codec.PRECONDITION_FAILED, f"exchange '{name}' in vhost '{vh.name}' in use", 40, 20)
        await conn.broker.delete_exchange(vh, ex)
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Exchange.DeleteOk))


def _exchange(conn: AmqpConnection, name: str, m: Any) -> Exchange:
    vh = conn.vhost
    assert vh is not None
    ex = vh.exchanges.get(name)
    if ex is None:
        raise AmqpError(codec.NOT_FOUND, f"no exchange '{name}' in vhost '{vh.name}'", *_cm(m))
    return ex


async def _exchange_bind(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    vh = conn.vhost
    assert vh is not None
    if m.source == "" or m.destination == "":
        raise AmqpError(codec.ACCESS_REFUSED, "operation not permitted on the default exchange", *_cm(m))
    args = m.arguments or {}
    b = Binding(m.source, m.destination, True, m.routing_key, args_key(args))
    if isinstance(m, C.Exchange.Bind):
        _exchange(conn, m.source, m)
        _exchange(conn, m.destination, m)
        await conn.broker.add_binding(vh, b, dict(args))
        if not m.nowait:
            conn.send_method(ch.number, codec.method(C.Exchange.BindOk))
    else:
        # Like RabbitMQ, removing a binding whose source or destination is gone succeeds: clean-up code
        # (aio-pika's RPC close(), unbinds after an auto-delete cascade) unbinds what may already be gone.
        await conn.broker.remove_binding(vh, b)
        if not m.nowait:
            conn.send_method(ch.number, codec.method(C.Exchange.UnbindOk))


async def _queue_declare(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    vh = conn.vhost
    assert vh is not None
    broker = conn.broker
    name = m.queue
    if m.passive:
        q = conn.queue_for(ch, name, m)
    else:
        if not name:
            name = broker.generated_name("amq.gen-")
        q = vh.queues.get(name)
        args = dict(m.arguments or {})
        if q is not None:
            conn.check_exclusive(q, m)
            diff = q.equivalent(m.durable, m.exclusive, m.auto_delete, args)
            if diff is not None:
                raise AmqpError(codec.PRECONDITION_FAILED, diff, 50, 10)
        else:
            if _reserved(name) and not name.startswith("amq.gen-"):
                raise AmqpError(codec.ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'", 50, 10)
            dlx = args.get("x-dead-letter-exchange")
            if isinstance(dlx, (bytes, bytearray)):
                args["x-dead-letter-exchange"] = bytes(dlx).decode("utf-8", "replace")
            qt = args.get("x-queue-type")
            if qt is not None and qt not in ("classic", "quorum", "stream"):
                raise AmqpError(codec.PRECONDITION_FAILED, f"invalid arg 'x-queue-type' for queue '{name}': {qt!r}",
                                50, 10)
            q = await broker.declare_queue(vh, name, m.durable, conn if m.exclusive else None, m.auto_delete, args)
            if m.exclusive:
                conn._exclusive.add(q)
    q.last_used = time.monotonic()
    ch.last_queue = q.name
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Queue.DeclareOk, queue=q.name, message_count=q.ready(),
                                                 consumer_count=len(q.consumers)))


async def _queue_bind(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    vh = conn.vhost
    assert vh is not None
    if m.exchange == "":
        raise AmqpError(codec.ACCESS_REFUSED, "operation not permitted on the default exchange", *_cm(m))
    args = m.arguments or {}
    if isinstance(m, C.Queue.Bind):
        q = conn.queue_for(ch, m.queue, m)
        _exchange(conn, m.exchange, m)
        b = Binding(m.exchange, q.name, False, m.routing_key, args_key(args))
        await conn.broker.add_binding(vh, b, dict(args))
        if not m.nowait:
            conn.send_method(ch.number, codec.method(C.Queue.BindOk))
    else:
        # Unbind is idempotent as in RabbitMQ: a missing queue, exchange or binding answers Unbind-Ok
        # (aio-pika's RPC close() unbinds its auto-deleted queue after it is gone).
        name = m.queue or ch.last_queue
        q = vh.queues.get(name) if name else None
        if q is not None:
            conn.check_exclusive(q, m)
        elif not name:
            raise AmqpError(codec.NOT_FOUND, "no previously declared queue", *_cm(m))
        b = Binding(m.exchange, name, False, m.routing_key, args_key(args))
        await conn.broker.remove_binding(vh, b)
        conn.send_method(ch.number, codec.method(C.Queue.UnbindOk))


async def _queue_purge(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    q = conn.queue_for(ch, m.queue, m)
    n = await q.purge()
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Queue.PurgeOk, message_count=n))


async def _queue_delete(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    vh = conn.vhost
    assert vh is not None
    name = m.queue or ch.last_queue
    q = vh.queues.get(name)
    n = 0
    if q is not None:
        conn.check_exclusive(q, m)
        if m.if_unused and q.consumers:
            raise AmqpError(codec.PRECONDITION_FAILED, f"queue '{name}' in vhost '{vh.name}' in use", 50, 40)
        if m.if_empty and q.ready():
            raise AmqpError(codec.PRECONDITION_FAILED, f"queue '{name}' in vhost '{vh.name}' is not empty", 50, 40)
        n = await conn.broker.delete_queue(q)
        conn._exclusive.discard(q)
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Queue.DeleteOk, message_count=n))


async def _basic_qos(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    if m.prefetch_size:
        raise AmqpError(codec.NOT_IMPLEMENTED, "prefetch_size!=0 (%d)" % m.prefetch_size, 60, 10, hard=True)
    if m.global_:
        ch.global_prefetch = m.prefetch_count
    else:
        ch.prefetch = m.prefetch_count
    conn.send_method(ch.number, codec.method(C.Basic.QosOk))
    for c in ch.consumers.values():
        c.queue.wake()


async def _basic_consume(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    q = conn.queue_for(ch, m.queue, m)
    tag = m.consumer_tag or conn.broker.generated_name("amq.ctag-")
    if tag in ch.consumers:
        raise AmqpError(codec.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", 60, 20, hard=True)
    if m.exclusive and q.consumers:
        raise AmqpError(codec.ACCESS_REFUSED, f"queue '{q.name}' in vhost '{q.vhost.name}' in exclusive use", 60, 20)
    if any(c.exclusive for c in q.consumers):
        raise AmqpError(codec.ACCESS_REFUSED, f"queue '{q.name}' in vhost '{q.vhost.name}' in exclusive use", 60, 20)
    c = Consumer(ch, q, tag, m.no_ack, m.exclusive, ch.prefetch)
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Basic.ConsumeOk, consumer_tag=tag))
    ch.consumers[tag] = c
    q.consumers.append(c)
    q.had_consumer = True
    q.last_used = time.monotonic()
    q.wake()


async def _basic_cancel(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    c = ch.consumers.pop(m.consumer_tag, None)
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Basic.CancelOk, consumer_tag=m.consumer_tag))
    if c is not None:
        q = c.queue
        q.last_used = time.monotonic()
        q.drop_consumer(c)
        await conn._maybe_auto_delete(q)


async def _basic_get(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    q = conn.queue_for(ch, m.queue, m)
    lease = await q.take_one()
    if lease is None:
        conn.send_method(ch.number, codec.method(C.Basic.GetEmpty))
        return
    tag = ch.next_tag
    ch.next_tag += 1
    lane = lease.lane
    if lease.offset >= lane.hw:
        lane.hw = lease.offset + 1
    if m.no_ack:
        q.count -= 1
        conn.broker.ack_lease(lease)
    else:
        lease.tag = tag
        lease.channel = ch
        ch.unacked[tag] = lease
        q.unacked += 1
    if not lease.read_back:
        q.count_out(1)
    enc, exchange, rk = encoded_delivery(lease.msg)
    conn.write(codec.encode_get_ok(ch.number, tag, lease.attempt > 1, exchange, rk, q.ready())
               + codec.encode_content(ch.number, enc, lease.msg.body, conn.frame_max))


async def _basic_reject(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    await ch.reject(m.delivery_tag, False, m.requeue, (60, 90))


async def _basic_nack(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    await ch.reject(m.delivery_tag, m.multiple, m.requeue, (60, 120))


async def _basic_recover(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    touched = {lease.queue for lease in ch.unacked.values()}
    ch.requeue_all()
    for q in touched:
        q.wake()
    if isinstance(m, C.Basic.Recover):
        conn.send_method(ch.number, codec.method(C.Basic.RecoverOk))


async def _basic_ack_async(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    ch.ack(m.delivery_tag, m.multiple)


async def _confirm_select(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    if ch.tx:
        raise AmqpError(codec.PRECONDITION_FAILED, "cannot switch from tx to confirm mode", 85, 10)
    ch.confirm = True
    if not m.nowait:
        conn.send_method(ch.number, codec.method(C.Confirm.SelectOk))


async def _tx_select(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    if ch.confirm:
        raise AmqpError(codec.PRECONDITION_FAILED, "cannot switch from confirm to tx mode", 90, 10)
    ch.tx = True
    conn.send_method(ch.number, codec.method(C.Tx.SelectOk))


async def _tx_commit(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    if not ch.tx:
        raise AmqpError(codec.PRECONDITION_FAILED, "channel is not transactional", 90, 20)
    pubs, ch.tx_pubs = ch.tx_pubs, []
    acks, ch.tx_acks = ch.tx_acks, []
    for i in range(0, len(pubs), MAX_BATCH):
        part = pubs[i : i + MAX_BATCH]
        await conn._store([(ch, msg, qs, seq, t) for msg, qs, seq, t in part])
        if ch.closing:
            return
    ch.tx = False  # apply the acks for real, then back to tx mode
    try:
        for kind, tag, multiple, requeue in acks:
            if kind == "ack":
                ch.ack(tag, multiple)
            else:
                await ch.reject(tag, multiple, requeue, (60, 120))
    finally:
        ch.tx = True
    conn.send_method(ch.number, codec.method(C.Tx.CommitOk))


async def _tx_rollback(conn: AmqpConnection, ch: Channel, m: Any) -> None:
    if not ch.tx:
        raise AmqpError(codec.PRECONDITION_FAILED, "channel is not transactional", 90, 30)
    ch.tx_pubs.clear()
    ch.tx_acks.clear()
    conn.send_method(ch.number, codec.method(C.Tx.RollbackOk))


_HANDLERS = {
    C.Channel.Close: _channel_close,
    C.Channel.CloseOk: _channel_close_ok,
    C.Channel.Flow: _channel_flow,
    C.Channel.FlowOk: _channel_flow_ok,
    C.Exchange.Declare: _exchange_declare,
    C.Exchange.Delete: _exchange_delete,
    C.Exchange.Bind: _exchange_bind,
    C.Exchange.Unbind: _exchange_bind,
    C.Queue.Declare: _queue_declare,
    C.Queue.Bind: _queue_bind,
    C.Queue.Unbind: _queue_bind,
    C.Queue.Purge: _queue_purge,
    C.Queue.Delete: _queue_delete,
    C.Basic.Qos: _basic_qos,
    C.Basic.Consume: _basic_consume,
    C.Basic.Cancel: _basic_cancel,
    C.Basic.Get: _basic_get,
    C.Basic.Ack: _basic_ack_async,
    C.Basic.Reject: _basic_reject,
    C.Basic.Nack: _basic_nack,
    C.Basic.Recover: _basic_recover,
    C.Basic.RecoverAsync: _basic_recover,
    C.Confirm.Select: _confirm_select,
    C.Tx.Select: _tx_select,
    C.Tx.Commit: _tx_commit,
    C.Tx.Rollback: _tx_rollback,
}

# Methods that need not wait for pending publishes to be stored.
_NO_DRAIN = {C.Basic.Ack, C.Basic.Reject, C.Basic.Nack, C.Channel.Flow, C.Channel.FlowOk, C.Channel.CloseOk,
             C.Basic.Qos, C.Basic.Consume, C.Basic.Cancel, C.Confirm.Select}
