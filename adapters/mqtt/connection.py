"""One MQTT network connection: the thin loop between a transport and the door.

The transport (TCP, TLS or WebSocket: ``server.py``) calls :meth:`Connection.feed`
with received bytes and :meth:`Connection.lost` when it is gone; the connection
decodes with the sans-io codec, asks the sans-io state machine (``state.py``)
whether each packet is legal now, and hands it to the door (``broker.py``).
Packets are handled in order by one worker task at a time; consecutive PUBLISH
packets are stored as one batch, and every per-packet rule (Receive Maximum,
topic aliases, payload format) is still judged per packet. A subscriber's
PUBACKs are settled straight off the bytes when nothing is queued before them
(the delivery hot path: no task or coroutine per acknowledgement).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Coroutine

from gateway.access.traffic import Lease, Meter, QuotaExceededError, TrafficControl

from . import codec as C
from .codec import Decoder, MQTTProtocolError, encode, encode_properties, encode_publish, encode_publish0
from .config import MQTTConfig
from .mapping import Outgoing, now_ms
from .session import NONE, Inflight, Session
from .state import ACCEPT, CLOSE, LOST, ConnectionState

if TYPE_CHECKING:
    from .broker import MQTTBroker

log = logging.getLogger("unimq.mqtt")

__all__ = ["Connection", "effective_keepalive"]

_PUBACK = struct.Struct(">BBH").pack  # a 3.1.1 (or success) PUBACK: type, length 2, packet id


def effective_keepalive(requested: int, v5: bool, cfg: MQTTConfig) -> int:
    """The keepalive (seconds) a connection is held to: 1.5 times it of silence drops it.

    ``server_keepalive`` imposes one value on v5 clients (it has a way to say so);
    ``max_keepalive`` caps every client's, as Mosquitto's ``max_keepalive`` does (which
    refuses a 3.1.1 client above the cap instead: here it is held to the cap).
    """
    if v5 and cfg.server_keepalive:
        return cfg.server_keepalive
    cap = cfg.max_keepalive
    if cap and (requested == 0 or requested > cap):
        return cap
    return requested



class Connection:
    """One MQTT network connection, independent of the transport (TCP or WebSocket).

    The transport calls :meth:`feed` with received bytes and :meth:`lost` when
    it is gone; the connection writes through ``transport.write`` and closes with
    ``transport.close``. Packets are handled in order by one worker task at a
    time; consecutive PUBLISH packets are stored as one batch.
    """

    # Slots: ten thousand idle connections must stay small (no per-instance dict).
    __slots__ = ("broker", "config", "counters", "delivery", "transport", "peer", "decoder", "version",
                 "session", "will", "publish_will", "proto", "closed", "connected", "writable", "window",
                 "problem_info", "keepalive", "last_rx", "alias_in", "alias_out", "alias_out_max", "max_out_packet",
                 "inbox", "_worker", "_wbuf", "_wsize", "_flush_scheduled", "_paused", "_freed", "_timer", "loop",
                 "lease", "meter", "_held", "_connack_held", "_connecting")

    def __init__(self, broker: MQTTBroker, transport: Any, peer: str) -> None:
        self.broker = broker
        self.config: MQTTConfig = broker.config
        self.counters = broker.counters
        self.delivery = broker.delivery
        self.transport = transport
        self.peer = peer
        self.decoder = Decoder(max_packet_size=broker.config.max_packet_size)
        self.version = C.MQTT_311
        self.session: Session | None = None
        self.will: C.Will | None = None
        self.publish_will = True
        self.proto = ConnectionState()
        # Mirrors of the protocol state read on the delivery hot path (plain attributes are
        # cheaper than asking the state machine): closed = DISCONNECTING or CLOSED,
        # connected = a session was attached (CONNACK 0 sent) and not yet detached.
        self.closed = False
        self.connected = False
        self.writable = True
        self.window = broker.config.max_inflight
        self.problem_info = True
        self.keepalive = 0
        self.last_rx = time.monotonic()
        # v5 topic aliases, made when first used (None: none yet; most connections never have any)
        self.alias_in: dict[int, str] | None = None
        self.alias_out: dict[str, int] | None = None
        self.alias_out_max = 0
        self.max_out_packet = 0
        self.inbox: deque[Any] | None = None  # packets waiting for the worker (None while there are none)
        self._worker: asyncio.Task[None] | None = None
        self._wbuf: list[bytes] = []
        self._wsize = 0
        self._flush_scheduled = False
        self._paused = False
        self._freed = False  # acknowledgements freed window room during this inbox run
        self._timer: asyncio.TimerHandle | None = None  # the keepalive check, once connected
        self._connack_held = False  # writes wait for the CONNACK (see hold)
        self._connecting = False  # a CONNECT handled without a worker is on its way (see work_on)
        self.loop = asyncio.get_running_loop()
        broker.connect_deadlines.add(self, self.last_rx + broker.config.connect_timeout_s)
        self.lease: Lease | None = None  # a connection slot of its user and client id (gateway.access.traffic)
        self.meter: Meter | None = None  # its publish budget, made once a limit exists
        self._held = False  # reading stopped: over its publish rate

    # -- transport side

    def feed(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_rx = time.monotonic()
        n = len(data)
        self.counters.bytes_in += n
        if (not n & 3 and data[0] == 0x40 and self._worker is None and not self.inbox and self.session is not None
                and not self.decoder.buffered and data[0::4] == b"\x40" * (n >> 2)
                and data[1::4] == b"\x02" * (n >> 2)):
            # Nothing but whole success PUBACKs (4 bytes each), nothing queued before them:
            # what a subscriber sends back, read straight off the bytes.
            done = self._on_pubacks(data)
            if done == n:
                return
            data = data[done:]  # a packet id 0: the decoder says what is wrong with it
        try:
            pkts = self.decoder.feed(data)
            err = None
        except MQTTProtocolError as e:
            pkts, err = e.packets, e
        if pkts:
            if (err is None and self.session is None and len(pkts) == 1 and type(pkts[0]) is C.Connect
                    and self._worker is None and not self._connecting and self.inbox is None
                    and self.proto.legal(C.CONNECT)):
                pkt = pkts[0]
                self.proto.receive(C.CONNECT)  # (legal again when the worker handles it after all)
                self.version = pkt.protocol_level
                if self.broker.connect_now(self, pkt):  # a new device's CONNECT: no worker task
                    self._connecting = not self.closed
                    return
            if self._worker is None and not self.inbox and self.session is not None:
                # Nothing is queued before them: a subscriber's PUBACKs are settled right
                # here, without a task or a coroutine per packet (the delivery hot path).
                i = 0
                n = len(pkts)
                while i < n and type(pkts[i]) is C.PubAck:
                    self._on_puback(pkts[i])  # type: ignore[arg-type]  # (checked just above)
                    i += 1
                if i:
                    if self._freed and i == n and err is None:
                        self._freed = False
                        if not self.closed:
                            self.delivery.wake(self.session)
                    pkts = pkts[i:]
            if pkts:
                if self.inbox is None:
                    self.inbox = deque(pkts)
                else:
                    self.inbox.extend(pkts)
        if err is not None:
            if self.inbox is None:
                self.inbox = deque()
            self.inbox.append(err)
        if not self.inbox:
            return
        if self._worker is None and not self._connecting:
            self._worker = self.loop.create_task(self._work())
        if len(self.inbox) > 4096 and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def release_lease(self) -> None:
        lease = self.lease
        if lease is not None:
            self.lease = None
            lease.release()

    def meter_of(self, traffic: TrafficControl) -> Meter:
        m = self.meter
        if m is None:
            s = self.session
            m = self.meter = traffic.meter(s.ctx.principal if s is not None else None,
                                           s.client_id if s is not None else "")
        return m

    def lost(self) -> None:
        self.release_lease()
        self.broker.connect_deadlines.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.proto.move(LOST)
        self.closed = True
        if self._worker is not None and not self._worker.done() and self._worker is not asyncio.current_task():
            self._worker.cancel()
        if self.connected:
            self.broker.detach(self)
        self.connected = False

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        s = self.session
        if s is not None:
            self.delivery.wake(s)
            self.broker.shared.wake_session(s)

    # -- writing

    def send(self, data: bytes) -> None:
        if self.closed:
            return
        self._wbuf.append(data)
        self._wsize += len(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def hold(self) -> None:
        """Keep what is sent from now on until :meth:`send_first` (a session is attached, its
        CONNACK waits for its record to be stored, and a delivery must not come first)."""
        self._connack_held = True

    def send_first(self, data: bytes) -> None:
        """Send ``data`` (the CONNACK) before whatever was kept since :meth:`hold`, and the rest."""
        self._connack_held = False
        self._wbuf.insert(0, data)
        self._wsize += len(data)
        self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._wbuf and not self.closed and not self._connack_held:
            data = b"".join(self._wbuf) if len(self._wbuf) > 1 else self._wbuf[0]
            self._wbuf = []
            self._wsize = 0
            self.counters.bytes_out += len(data)
            self.transport.write(data)

    def close(self, reason_code: int | None = None, message: str = "", *, publish_will: bool = True) -> None:
        """Close this connection, with a v5 DISCONNECT carrying ``reason_code`` when it has one."""
        if self.closed:
            return
        self.publish_will = publish_will
        if reason_code is not None and self.connected and self.version == C.MQTT_5:
            props = {"reason_string": message} if (message and self.problem_info) else None
            self.send(encode(C.Disconnect(reason_code, props), C.MQTT_5))
        self._flush()
        self.proto.move(CLOSE)
        self.closed = True
        self.release_lease()
        self.broker.connect_deadlines.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            self.transport.close()
        except Exception:  # pragma: no cover
            pass

    def refuse(self, code: int, message: str) -> None:
        """Answer a CONNECT with a failure CONNACK and close."""
        if self._connack_held:  # nothing kept goes before (or instead of) the CONNACK
            self._connack_held = False
            self._wbuf.clear()
            self._wsize = 0
        if self.version == C.MQTT_5:
            props = {"reason_string": message} if self.problem_info else None
            self.send(encode(C.Connack(False, code, props), C.MQTT_5))
        else:
            self.send(encode(C.Connack(False, C.V5_TO_V3_CONNACK.get(code, C.CONNACK_V3_SERVER_UNAVAILABLE)),
                             self.version))
        self.close(publish_will=False)

    def deliver(self, out: Outgoing, qos: int, retain: bool, sub_ids: list[int] | None) -> None:
        """Send an application message outside the LMQ path (QoS 0 fast path, retained)."""
        if self.closed:
            return
        s = self.session
        if qos == 0 and self.transport.get_write_buffer_size() + self._wsize > self.config.qos0_drop_buffer:
            self.counters.qos0_dropped += 1
            return
        ut = out.ut
        if ut:  # counted for the processor's metrics (flushed per batch: Delivery.count_out)
            d = self.delivery
            counts, nbytes = d.out_counts, d.out_bytes
            counts[ut] = counts.get(ut, 0) + 1
            nbytes[ut] = nbytes.get(ut, 0) + len(out.payload)
        if qos == 0:
            self.send_publish(out, 0, retain, False, 0, sub_ids)
            return
        assert s is not None
        pid = s.alloc_pid()
        s.inflight[pid] = Inflight(out, qos, None, 0, None, sub_ids)
        self.send_publish(out, qos, retain, False, pid, sub_ids)

    def deliver_q0(self, outs: list[Outgoing]) -> None:
        """Send QoS 0 messages of one publish batch (no retain flag, no subscription ids) in one write.

        The fan-in hot path: what :meth:`deliver` does per message (the QoS 0 drop threshold,
        the delivery counts, the encoding) done in one loop, each message's 3.1.1 encoding
        kept on the message for its other subscribers (fan-out); a v5 connection takes
        :meth:`deliver` (properties to build per connection).
        """
        if self.closed:
            return
        if self.version == C.MQTT_5:
            for out in outs:
                self.deliver(out, 0, False, None)
            return
        d = self.delivery
        counts, nbytes = d.out_counts, d.out_bytes
        room = self.config.qos0_drop_buffer - self.transport.get_write_buffer_size() - self._wsize
        parts: list[bytes] = []
        size = 0
        ut = ""
        k = nb = 0
        for out in outs:
            if size > room:
                self.counters.qos0_dropped += 1
                continue
            data = out.q0
            if data is None:
                data = out.q0 = encode_publish0(out.tb, out.payload)
            parts.append(data)
            size += len(data)
            if out.ut is not ut:  # counted for the processor's metrics, per unified topic
                if k and ut:
                    counts[ut] = counts.get(ut, 0) + k
                    nbytes[ut] = nbytes.get(ut, 0) + nb
                ut = out.ut
                k = nb = 0
            k += 1
            nb += len(out.payload)
        if k and ut:
            counts[ut] = counts.get(ut, 0) + k
            nbytes[ut] = nbytes.get(ut, 0) + nb
        if parts:
            self.counters.pub_out += len(parts)
            self.send(b"".join(parts) if len(parts) > 1 else parts[0])

    def send_publish(self, out: Outgoing, qos: int, retain: bool, dup: bool, pid: int,
                     sub_ids: list[int] | None) -> None:
        self.counters.pub_out += 1
        if self.version != C.MQTT_5:
            data = encode_publish(out.tb, out.payload, qos, retain, dup, pid, None)
        else:
            tb = out.tb
            if out.expiry_at or sub_ids or self.alias_out_max:
                base = out.v5props()
                props = dict(base) if base else {}
                if out.expiry_at:
                    props["message_expiry_interval"] = max(0, (out.expiry_at - now_ms() + 999) // 1000)
                if sub_ids:
                    props["subscription_identifier"] = sub_ids
                aliases = self.alias_out  # made in attach when the client takes aliases
                if aliases is not None:
                    alias = aliases.get(out.topic)
                    if alias is not None:
                        tb = b""
                        props["topic_alias"] = alias
                    elif len(aliases) < self.alias_out_max:
                        alias = len(aliases) + 1
                        aliases[out.topic] = alias
                        props["topic_alias"] = alias
                pb = encode_properties(props)
            else:
                cached = out._v5
                if cached is None:
                    cached = out._v5 = encode_properties(out.v5props())
                pb = cached
            data = encode_publish(tb, out.payload, qos, retain, dup, pid, pb)
        if self.max_out_packet and len(data) > self.max_out_packet:
            # v5 3.1.2.25: a message too big for the client is discarded as if delivered
            if qos and self.session is not None:
                f = self.session.inflight.pop(pid, None)
                if f is not None:
                    self.delivery.acked(self.session, f)
            return
        self.send(data)

    # -- protocol

    def connect_timed_out(self) -> None:
        """No CONNECT within ``connect_timeout_s`` (``deadlines.py``): close."""
        if not self.connected and not self.closed:
            self.close()

    def _keepalive_check(self) -> None:
        self._timer = None
        if self.closed or not self.keepalive:
            return
        limit = self.keepalive * 1.5
        idle = time.monotonic() - self.last_rx
        if idle >= limit and not self._held:  # (held over its rate: its socket is not being read)
            log.info("mqtt: %s silent for %.1fs (keepalive %ds): disconnecting", self.peer, idle, self.keepalive)
            self.close(C.RC_KEEP_ALIVE_TIMEOUT, "keep alive timeout")
            self.lost()
            return
        self._timer = self.loop.call_later(limit - idle if idle < limit else limit, self._keepalive_check)

    def attach(self, s: Session, pkt: C.Connect) -> None:
        """The CONNECT is accepted: ``s`` is this connection's session (CONNACK 0 follows)."""
        cfg = self.config
        self.proto.move(ACCEPT)
        self.session = s
        s.conn = self
        self.connected = True
        self.will = pkt.will
        props = pkt.properties
        ka = effective_keepalive(pkt.keepalive, pkt.protocol_level == C.MQTT_5, cfg)
        if pkt.protocol_level == C.MQTT_5:
            self.window = min(cfg.max_inflight, props.get("receive_maximum", 65535))
            self.alias_out_max = min(props.get("topic_alias_maximum", 0), 65535)
            self.max_out_packet = props.get("maximum_packet_size", 0)
            if self.alias_out_max:
                self.alias_out = {}
        self.keepalive = ka
        self.broker.connect_deadlines.discard(self)
        if ka:
            self._timer = self.loop.call_later(ka * 1.5, self._keepalive_check)

    def work_on(self, first: Coroutine[Any, Any, None] | None) -> None:
        """The CONNECT handled without a worker (``broker.connect_now``) goes on: ``first`` (the rest
        of it) in a worker task, then the packets that came meanwhile; None: it is done."""
        self._connecting = False
        if first is not None:
            self._worker = self.loop.create_task(self._work(first))
        elif self.inbox and not self.closed:
            self._worker = self.loop.create_task(self._work())

    async def _work(self, first: Coroutine[Any, Any, None] | None = None) -> None:
        inbox = self.inbox
        try:
            if first is not None:
                await first
                inbox = self.inbox
            while inbox and not self.closed:
                pkt = inbox.popleft()
                if type(pkt) is C.PubAck:
                    self._on_puback(pkt)
                elif isinstance(pkt, C.Publish):
                    batch = [pkt]
                    while inbox and len(batch) < 512 and type(inbox[0]) is C.Publish:
                        batch.append(inbox.popleft())
                    await self._on_publish(batch)
                elif isinstance(pkt, MQTTProtocolError):
                    self._protocol_error(pkt)
                else:
                    await self._dispatch(pkt)
                if self._paused and len(inbox) < 1024 and not self.closed and not self._held:
                    self._paused = False
                    self.transport.resume_reading()
            if self._freed:
                self._freed = False
                if self.session is not None and not self.closed:
                    self.delivery.wake(self.session)
        except MQTTProtocolError as e:
            self._protocol_error(e)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("mqtt: error handling a packet from %s", self.peer)
            self.close(C.RC_UNSPECIFIED_ERROR, "internal error")
            self.lost()
        finally:
            self._worker = None
            if inbox is not None and not inbox and self.inbox is inbox:
                self.inbox = None  # an idle connection keeps no deque (768 bytes)

    def _protocol_error(self, e: MQTTProtocolError) -> None:
        """Close this connection only, with the reason code where the protocol has one.

        Before a successful CONNECT: a v5 client gets a CONNACK with the reason code, a
        3.1/3.1.1 client a CONNACK only for an unacceptable protocol level (its one
        defined answer), anything else is closed silently. After it: a v5 client gets a
        DISCONNECT with the reason code (and reason string), a 3.1.1 client is closed.
        """
        log.info("mqtt: protocol error from %s: %s", self.peer, e.message)
        if not self.connected:
            version = self.decoder.version
            if version == C.MQTT_5:
                props = {"reason_string": e.message} if self.problem_info else None
                self.send(encode(C.Connack(False, e.reason_code, props), C.MQTT_5))
            elif e.connack_v3 is not None:
                self.send(encode(C.Connack(False, e.connack_v3), C.MQTT_311))
            self.close(publish_will=False)
        else:
            self.close(e.reason_code, e.message)
        self.lost()

    async def _dispatch(self, pkt: Any) -> None:
        t = pkt.type
        self.proto.receive(t)  # raises for a packet not allowed now
        b = self.broker
        if t == C.CONNECT:
            self.version = pkt.protocol_level
            if pkt.protocol_level == C.MQTT_5:
                self.problem_info = pkt.properties.get("request_problem_information", 1) != 0
            await b.connect(self, pkt)
            return
        s = self.session
        if s is None:  # pragma: no cover - the decoder requires CONNECT first
            raise MQTTProtocolError(C.RC_PROTOCOL_ERROR, "packet before CONNECT")
        if t == C.PUBACK:
            self._on_puback(pkt)
        elif t == C.PUBREC:
            f = s.inflight.get(pkt.packet_id)
            if f is not None and f.qos == 2:
                del s.inflight[pkt.packet_id]
                if pkt.reason_code < 0x80:
                    if s.pubrel is NONE:
                        s.pubrel = set()
                    s.pubrel.add(pkt.packet_id)  # type: ignore[union-attr]
                    if s.persistent:  # the PUBREL to send outlives a restart (see session.py)
                        await b.session_store.save(s)
                    self.delivery.acked(s, f)
                    self.send(encode(C.PubRel(pkt.packet_id), self.version))
                else:
                    self.delivery.acked(s, f)
                    self._freed = True
            elif pkt.packet_id in s.pubrel:
                self.send(encode(C.PubRel(pkt.packet_id), self.version))
            else:
                self.send(encode(C.PubRel(pkt.packet_id, C.RC_PACKET_ID_NOT_FOUND), self.version))
        elif t == C.PUBCOMP:
            if pkt.packet_id in s.pubrel:
                s.pubrel.discard(pkt.packet_id)  # type: ignore[union-attr]  # (held: a set)
                self._freed = True
        elif t == C.PUBREL:
            if pkt.packet_id in s.qos2_in:
                s.qos2_in.discard(pkt.packet_id)  # type: ignore[union-attr]  # (held: a set)
                if s.persistent:  # released before PUBCOMP: the id may be reused right after
                    await b.session_store.save(s)
                self.send(encode(C.PubComp(pkt.packet_id), self.version))
            else:
                self.send(encode(C.PubComp(pkt.packet_id, C.RC_PACKET_ID_NOT_FOUND), self.version))
        elif t == C.SUBSCRIBE:
            await b.subscribe(self, pkt)
        elif t == C.UNSUBSCRIBE:
            await b.unsubscribe(self, pkt)
        elif t == C.PINGREQ:
            self.send(b"\xd0\x00")
        elif t == C.DISCONNECT:
            await self._on_disconnect(pkt)

    def _on_pubacks(self, data: bytes) -> int:
        """Settle a run of 4-byte PUBACKs (see :meth:`feed`), then wake the pump once.

        Returns the bytes consumed: all of them, or up to a PUBACK with packet id 0
        (malformed; left to the decoder)."""
        s = self.session
        assert s is not None
        inflight = s.inflight
        acked = self.delivery.acked
        freed = False
        done = 0
        for hi, lo in zip(data[2::4], data[3::4]):
            pid = hi << 8 | lo
            if not pid:
                break
            f = inflight.get(pid)
            if f is not None and f.qos == 1:
                del inflight[pid]
                acked(s, f)
                freed = True
            done += 4
        if freed and not self.closed:
            self.delivery.wake(s)
        return done

    def _on_puback(self, pkt: C.PubAck) -> None:
        s = self.session
        if s is None:  # pragma: no cover - the decoder requires CONNECT first
            raise MQTTProtocolError(C.RC_PROTOCOL_ERROR, "packet before CONNECT")
        f = s.inflight.get(pkt.packet_id)
        if f is not None and f.qos == 1:
            del s.inflight[pkt.packet_id]
            self.delivery.acked(s, f)
            self._freed = True  # the pump is woken once the inbox is drained

    async def _on_disconnect(self, pkt: C.Disconnect) -> None:
        s = self.session
        assert s is not None
        if self.version == C.MQTT_5:
            new = pkt.properties.get("session_expiry_interval")
            if new is not None:
                if s.expiry == 0 and new != 0:
                    raise MQTTProtocolError(C.RC_PROTOCOL_ERROR, "session expiry set on DISCONNECT after 0 at CONNECT")
                s.expiry = min(new, self.config.max_session_expiry)
        self.publish_will = pkt.reason_code == C.RC_DISCONNECT_WITH_WILL
        self._flush()
        self.closed = True
        try:
            self.transport.close()
        except Exception:  # pragma: no cover
            pass
        self.lost()

    async def _on_publish(self, batch: list[C.Publish]) -> None:
        s = self.session
        assert s is not None
        v5 = self.version == C.MQTT_5
        items: list[C.Publish] = []
        broker = self.broker
        cfg = self.config
        self.proto.receive(C.PUBLISH)  # once per batch: every packet in it is a PUBLISH
        self.counters.pub_in += len(batch)
        access = broker.access
        acl = access.enforced
        denied: list[bool] | None = None  # per item, once the ACL file refused one
        # Every per-packet rule is judged per packet, as if each had arrived alone: the QoS 2
        # ids this batch adds count against Receive Maximum, and a packet that breaks a rule
        # ends the batch there (the ones before it are stored and acknowledged, then the error).
        q2_new: set[int] = set()
        err: MQTTProtocolError | None = None
        for p in batch:
            props = p.properties
            if props is not None:  # v5 only
                topic = p.topic
                if "topic_alias" in props:
                    alias = props["topic_alias"]
                    if alias > cfg.topic_alias_maximum:
                        err = MQTTProtocolError(C.RC_TOPIC_ALIAS_INVALID, f"topic alias {alias} is out of range")
                        break
                    if topic:
                        if self.alias_in is None:
                            self.alias_in = {}
                        self.alias_in[alias] = topic
                    else:
                        topic = self.alias_in.get(alias) if self.alias_in else None  # type: ignore[assignment]
                        if topic is None:
                            err = MQTTProtocolError(C.RC_PROTOCOL_ERROR, f"unknown topic alias {alias}")
                            break
                        p.topic = topic  # resolved from a topic alias
                if v5 and props.get("payload_format_indicator") == 1:
                    try:
                        p.payload.decode("utf-8")
                    except UnicodeDecodeError:
                        if p.qos:
                            self.send(encode(C.PubAck(p.packet_id, C.RC_PAYLOAD_FORMAT_INVALID) if p.qos == 1 else
                                             C.PubRec(p.packet_id, C.RC_PAYLOAD_FORMAT_INVALID), self.version))
                        continue
            if p.qos == 2:
                pid = p.packet_id
                if pid in s.qos2_in:
                    self.send(encode(C.PubRec(pid), self.version))  # duplicate: stored already
                    continue
                if pid in q2_new:
                    continue  # resent within this batch: the first one's PUBREC answers both
                if v5 and len(s.qos2_in) + len(q2_new) >= cfg.receive_maximum:
                    err = MQTTProtocolError(C.RC_RECEIVE_MAX_EXCEEDED, "receive maximum exceeded")
                    break
                q2_new.add(pid)
            if acl and not access.can_write(s, p.topic):
                if denied is None:
                    denied = [False] * len(items)
                denied.append(True)
            elif denied is not None:
                denied.append(False)
            items.append(p)
        ids = broker.identities
        if items and ids is not None and ids.traffic.active:
            items, denied = await self._within_rate(ids.traffic, items, denied)
        if items:
            await self._store_and_ack(items, denied)
        if err is not None:
            raise err

    async def _within_rate(self, traffic: TrafficControl, items: list[C.Publish],
                           denied: list[bool] | None) -> tuple[list[C.Publish], list[bool] | None]:
        """Charge a batch to the client's publish budget (``gateway.access.traffic``): over its rate,
        stop reading its socket until it is paid off, then store it; when that persists, refuse what is
        left: v5 PUBACK/PUBREC 0x97 (QoS 0: DISCONNECT 0x97), 3.1.1 closed. Nothing refused is stored
        or acknowledged."""
        meter = self.meter_of(traffic)
        wait = 0.0
        kept = len(items)
        for i, p in enumerate(items):
            try:
                wait = meter.charge(1, len(p.payload))
            except QuotaExceededError as e:
                kept = i
                refusal = e
                break
        metrics = self.broker.processor.metrics
        if wait > 0:
            metrics.inc("quota_throttled", "mqtt")
            self._held = True
            self.transport.pause_reading()
            try:
                await asyncio.sleep(wait)
            finally:
                self._held = False
                self.last_rx = time.monotonic()  # its silence meanwhile was ours
                if not self._paused and not self.closed:
                    self.transport.resume_reading()
        if kept == len(items):
            return items, denied
        metrics.inc("quota_exceeded", "mqtt")
        refused = items[kept:]
        items = items[:kept]
        denied = denied[:kept] if denied is not None else None
        if kept:
            await self._store_and_ack(items, denied)
        if self.version == C.MQTT_5 and all(p.qos for p in refused):
            out = []
            for p in refused:  # (their QoS 2 ids were not taken: a resend is a new message)
                out.append(encode(C.PubAck(p.packet_id, C.RC_QUOTA_EXCEEDED, {"reason_string": str(refusal)}
                                           if self.problem_info else None) if p.qos == 1 else
                                  C.PubRec(p.packet_id, C.RC_QUOTA_EXCEEDED), self.version))
            self.send(b"".join(out))
        else:
            log.info("mqtt: %s over its publish quota: %s", self.peer, refusal)
            self.close(C.RC_QUOTA_EXCEEDED, str(refusal))
            self.lost()
        return [], None

    async def _store_and_ack(self, items: list[C.Publish], denied: list[bool] | None) -> None:
        """Store a batch of accepted PUBLISHes and send their PUBACKs / PUBRECs in one write."""
        s = self.session
        assert s is not None
        broker = self.broker
        v5 = self.version == C.MQTT_5
        if denied is None:
            codes = await broker.publish(s.ctx, s.client_id, items)
        else:  # refused by the ACL file: 0x87 for v5; 3.1.1 has no code, the message is dropped
            allowed = [p for p, d in zip(items, denied) if not d]
            stored = iter(await broker.publish(s.ctx, s.client_id, allowed) if allowed else ())
            refused = C.RC_NOT_AUTHORIZED if v5 else 0
            codes = [refused if d else next(stored) for d in denied]
        out: list[bytes] = []
        version = self.version
        qos2_stored = False
        for p, code in zip(items, codes):
            qos = p.qos
            if not qos:
                continue
            if not v5:
                if code >= 0x80:
                    raise MQTTProtocolError(code, "the message could not be stored")
                code = 0
            if qos == 1:
                out.append(encode(C.PubAck(p.packet_id, code), version) if code else _PUBACK(0x40, 2, p.packet_id))
            else:
                if code < 0x80:
                    if s.qos2_in is NONE:
                        s.qos2_in = set()
                    s.qos2_in.add(p.packet_id)  # type: ignore[union-attr]
                    qos2_stored = True
                out.append(encode(C.PubRec(p.packet_id, code), version))
        if qos2_stored and s.persistent:
            # the ids awaiting PUBREL are durable before the PUBRECs go out (see session.py)
            await broker.session_store.save(s)
        if out:
            self.send(b"".join(out))
