"""The sans-io AMQP codec: hand-written hot paths agree with pamqp, and no input makes it raise.

Why hypothesis: the codec's fast paths (Basic.Publish/Ack decode,
Basic.Deliver/GetOk/Ack and content-header encode) are hand-written for
speed; pamqp is the reference they must agree with for every value, and the
decoder must turn any byte string, cut anywhere, into events or one
FrameError - never an exception - since it faces the network. The last test
fuzzes a live `unimq up` with random frames after a real handshake and checks
it keeps serving.
"""

from __future__ import annotations

import datetime
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as C
from pamqp import frame as pframe
from pamqp import header as pheader

from adapters.amqp import codec

NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:", max_size=60)
ANY_NAME = st.text(max_size=60).filter(lambda s: len(s.encode()) <= 255)
SHORTSTR = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
TAG = st.integers(min_value=0, max_value=2**63 - 1)  # pamqp marshals delivery tags as signed


def _events(data: bytes, cuts: list[int] | None = None) -> list[object]:
    d = codec.FrameDecoder(expect_protocol_header=False)
    if not cuts:
        return d.feed(data)
    out: list[object] = []
    pos = 0
    for c in sorted(set(cuts)):
        out += d.feed(data[pos:c])
        pos = c
    out += d.feed(data[pos:])
    return out


@given(exchange=ANY_NAME, rk=ANY_NAME, mandatory=st.booleans(), immediate=st.booleans())
def test_publish_fast_path_matches_pamqp(exchange: str, rk: str, mandatory: bool, immediate: bool) -> None:
    m = codec.method(C.Basic.Publish, exchange=exchange, routing_key=rk, mandatory=mandatory, immediate=immediate)
    data = pframe.marshal(m, 3) + pframe.marshal(pheader.ContentHeader(0, 0, C.Basic.Properties()), 3)
    (ev,) = _events(data)
    assert isinstance(ev, codec.ContentReceived)
    p = ev.method
    assert (p.exchange, p.routing_key, p.mandatory, p.immediate) == (exchange, rk, mandatory, immediate)
    assert ev.channel == 3 and ev.body == b""


@given(tag=TAG, multiple=st.booleans())
def test_ack_fast_path_matches_pamqp(tag: int, multiple: bool) -> None:
    (ev,) = _events(pframe.marshal(C.Basic.Ack(delivery_tag=tag, multiple=multiple), 1))
    assert isinstance(ev, codec.MethodReceived)
    assert (ev.method.delivery_tag, ev.method.multiple) == (tag, multiple)
    assert codec.encode_basic_ack(1, tag, multiple) == pframe.marshal(C.Basic.Ack(delivery_tag=tag, multiple=multiple), 1)


@given(ctag=SHORTSTR, tag=TAG, redelivered=st.booleans(), exchange=NAME, rk=SHORTSTR,
       count=st.integers(min_value=0, max_value=2**32 - 1))
def test_deliver_and_get_ok_encoders_match_pamqp(ctag: str, tag: int, redelivered: bool, exchange: str, rk: str,
                                                 count: int) -> None:
    ctag = ctag.encode()[:255].decode("utf-8", "ignore")
    rk = rk.encode()[:255].decode("utf-8", "ignore")
    ref = pframe.marshal(C.Basic.Deliver(consumer_tag=ctag, delivery_tag=tag, redelivered=redelivered,
                                         exchange=exchange, routing_key=rk), 5)
    assert codec.encode_deliver(5, ctag, tag, redelivered, exchange, rk) == ref
    ref = pframe.marshal(C.Basic.GetOk(delivery_tag=tag, redelivered=redelivered, exchange=exchange, routing_key=rk,
                                       message_count=count), 5)
    assert codec.encode_get_ok(5, tag, redelivered, exchange, rk, count) == ref


HEADER_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**63, max_value=2**63 - 1), SHORTSTR),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(NAME.filter(bool), inner, max_size=3)),
    max_leaves=6,
)

PROPS = st.fixed_dictionaries({}, optional={
    "content_type": SHORTSTR, "content_encoding": SHORTSTR,
    "headers": st.dictionaries(NAME.filter(bool), HEADER_VALUES, min_size=1, max_size=4),
    "delivery_mode": st.integers(1, 2), "priority": st.integers(0, 9), "correlation_id": SHORTSTR,
    "reply_to": SHORTSTR, "expiration": st.integers(0, 10**9).map(str), "message_id": SHORTSTR,
    "timestamp": st.integers(0, 2**32 - 1), "message_type": SHORTSTR, "user_id": SHORTSTR, "app_id": SHORTSTR,
})


@given(props=PROPS, body_size=st.integers(0, 2**40))
def test_content_header_round_trip_against_pamqp(props: dict, body_size: int) -> None:
    props = {k: v for k, v in props.items() if v != ""}  # pamqp leaves empty strings out
    pamqp_props = dict(props)
    if "timestamp" in pamqp_props:
        pamqp_props["timestamp"] = datetime.datetime.fromtimestamp(props["timestamp"], tz=datetime.timezone.utc)
    ref = pheader.ContentHeader(0, body_size, C.Basic.Properties(**pamqp_props)).marshal()
    class_id, size, decoded, raw = codec.decode_properties(ref)
    assert class_id == 60 and size == body_size
    assert decoded == props
    # our encoder writes what pamqp reads back as the same properties
    mine = struct.pack(">HHQ", 60, 0, body_size) + codec.encode_properties(props, raw)
    back = pheader.ContentHeader()
    back.unmarshal(mine)
    for k, v in pamqp_props.items():
        assert getattr(back.properties, k) == v, k


@given(props=PROPS, body_size=st.integers(0, 2**40))
def test_cached_header_decoding_equals_the_plain_one(props: dict, body_size: int) -> None:
    """decode_header (cached by the property bytes) answers what decode_properties does, twice."""
    props = {k: v for k, v in props.items() if v != ""}
    payload = struct.pack(">HHQ", 60, 0, body_size) + codec.encode_properties(props)
    ref = codec.decode_properties(payload)
    for _ in range(2):
        class_id, size, decoded, raw, pb = codec.decode_header(payload)
        assert (class_id, size, decoded, raw) == ref and pb == payload[12:]


@given(ctag=SHORTSTR, tag=TAG, redelivered=st.booleans(), exchange=NAME, rk=SHORTSTR, props=PROPS,
       body=st.binary(max_size=9000), frame_max=st.integers(4096, 9000))
def test_delivery_template_equals_deliver_plus_content(ctag: str, tag: int, redelivered: bool, exchange: str,
                                                       rk: str, props: dict, body: bytes, frame_max: int) -> None:
    ctag = ctag.encode()[:255].decode("utf-8", "ignore")
    rk = rk.encode()[:255].decode("utf-8", "ignore")
    enc = codec.encode_properties(props)
    ref = codec.encode_deliver(2, ctag, tag, redelivered, exchange, rk) + codec.encode_content(2, enc, body, frame_max)
    for _ in range(2):  # the second time from the cached parts
        assert codec.encode_delivery(2, ctag, tag, redelivered, exchange, rk, enc, body, frame_max) == ref


@given(bodies=st.lists(st.binary(max_size=300), min_size=1, max_size=4), frame_max=st.integers(4096, 9000),
       cuts=st.lists(st.integers(0, 4000), max_size=8))
def test_split_bodies_and_arbitrary_read_boundaries(bodies: list[bytes], frame_max: int, cuts: list[int]) -> None:
    stream = b""
    for i, b in enumerate(bodies):
        stream += pframe.marshal(C.Basic.Publish(exchange="x", routing_key=str(i)), 1)
        props = codec.encode_properties({"message_id": str(i)})
        stream += codec.encode_content(1, props, b, 4096 if len(b) % 2 else frame_max)
        stream += codec.HEARTBEAT_FRAME
    evs = _events(stream, cuts)
    got = [(e.method.routing_key, e.body, e.properties) for e in evs if isinstance(e, codec.ContentReceived)]
    assert got == [(str(i), b, {"message_id": str(i)}) for i, b in enumerate(bodies)]
    assert sum(isinstance(e, codec.HeartbeatReceived) for e in evs) == len(bodies)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=5), header=st.booleans())
def test_decoder_never_raises(data: bytes, cuts: list[int], header: bool) -> None:
    d = codec.FrameDecoder(frame_max=4096, expect_protocol_header=header)
    pos = 0
    evs: list[object] = []
    for c in sorted(set(cuts)) + [len(data)]:
        evs += d.feed(data[pos:c])
        pos = c
    errors = [e for e in evs if isinstance(e, codec.FrameError)]
    assert len(errors) <= 1
    if errors:
        assert evs[-1] is errors[0]
        assert errors[0].code in (501, 502, 503, 505, 540)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """Plausible-looking frames: valid methods, mangled ones, stray content, junk."""
    kind = draw(st.sampled_from(["method", "mangled", "content", "junk", "publish"]))
    ch = draw(st.integers(0, 5))
    if kind == "method":
        m = draw(st.sampled_from([
            C.Channel.Open(), C.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), C.Queue.Declare(queue="fz"), C.Basic.Get(queue="fz"),
            C.Basic.Ack(delivery_tag=draw(TAG)), C.Basic.Qos(prefetch_count=3), C.Exchange.Declare(exchange="fz-ex"),
            C.Basic.Consume(queue="fz"), C.Tx.Select(), C.Confirm.Select(), C.Queue.Purge(queue="fz"),
            C.Basic.Nack(delivery_tag=draw(TAG)), C.Channel.Flow(active=False),
        ]))
        return pframe.marshal(m, ch)
    if kind == "publish":
        body = draw(st.binary(max_size=50))
        return (pframe.marshal(C.Basic.Publish(exchange="", routing_key="fz"), ch)
                + pframe.marshal(pheader.ContentHeader(0, len(body), C.Basic.Properties()), ch)
                + (struct.pack(">BHI", 3, ch, len(body)) + body + b"\xce" if body else b""))
    if kind == "mangled":
        raw = bytearray(pframe.marshal(C.Queue.Bind(queue="fz", exchange="amq.direct"), ch))
        i = draw(st.integers(0, len(raw) - 1))
        raw[i] = draw(st.integers(0, 255))
        return bytes(raw)
    if kind == "content":
        payload = draw(st.binary(max_size=30))
        return struct.pack(">BHI", draw(st.sampled_from([2, 3])), ch, len(payload)) + payload + b"\xce"
    return draw(st.binary(min_size=1, max_size=40))


@pytest.mark.timeout(120)
def test_live_server_survives_fuzzed_frames(server) -> None:  # type: ignore[no-untyped-def]
    from test_amqp_e2e import _raw_connect, _still_serving

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(frames(), min_size=1, max_size=8))
    def run(seq: list[bytes]) -> None:
        s = _raw_connect(server.amqp_port)
        try:
            s.sendall(b"".join(seq))
            s.settimeout(0.1)
            try:
                while s.recv(65536):
                    pass
            except (socket.timeout, ConnectionResetError):
                pass
        finally:
            s.close()

    run()
    _still_serving(server)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from test_amqp_e2e import start_unimq, stop_unimq

    s = start_unimq(tmp_path_factory.mktemp("amqp-fuzz-data"), tmp_path_factory.mktemp("amqp-fuzz-log"))
    yield s
    assert stop_unimq(s) == 0
    err = s.stderr.read_text()
    assert "Traceback" not in err, err
