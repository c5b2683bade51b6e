"""The AMQP connection's sans-io parts: the state machine's transition table and the handshake's decisions.

Why direct: the end-to-end tests drive these through a socket and a client
library, which only ever takes the allowed path; the refused transitions
(a method out of turn is 503 COMMAND_INVALID), the SASL parsing and the tuning
bounds are checked here without a server.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
from pamqp import commands as C
from pamqp import encode as pencode

from adapters.amqp import codec
from adapters.amqp.errors import AmqpError, method_ids
from adapters.amqp.handshake import authenticate, credentials, tune
from adapters.amqp.state import (
    LIVE,
    TRANSITIONS,
    ChannelState,
    ConnState,
    Signal,
    channel_transition,
    require_open,
    transition,
)

S = ConnState
CH = ChannelState


def test_the_handshake_walks_the_table_to_open() -> None:
    state = S.HEADER
    for event in (Signal.PROTOCOL_HEADER, C.Connection.StartOk, C.Connection.TuneOk, C.Connection.Open):
        state = transition(state, event)
    assert state is S.OPEN
    assert transition(S.OPEN, C.Connection.UpdateSecret) is S.OPEN


def test_a_method_out_of_turn_is_refused_with_503() -> None:
    m = C.Connection.Open(virtual_host="/")
    with pytest.raises(AmqpError) as ei:
        transition(S.START, C.Connection.Open, m)  # Open before StartOk
    e = ei.value
    assert e.code == codec.COMMAND_INVALID and e.hard
    assert (e.class_id, e.method_id) == method_ids(m) == (10, 40)
    assert e.text == "COMMAND_INVALID - unexpected method Connection.Open on channel 0 (state start)"
    # a second StartOk once tuning began, a TuneOk before authentication, a channel method on channel 0
    for state, event in ((S.TUNE, C.Connection.StartOk), (S.START, C.Connection.TuneOk), (S.OPEN, C.Channel.Open),
                         (S.OPEN_WAIT, C.Connection.UpdateSecret)):
        assert (state, event) not in TRANSITIONS
        with pytest.raises(AmqpError):
            transition(state, event)


def test_close_and_loss_from_every_state() -> None:
    for s in LIVE:
        assert transition(s, C.Connection.Close) is S.CLOSING
        assert transition(s, Signal.SERVER_CLOSE) is S.CLOSING
        assert transition(s, C.Connection.CloseOk) is s  # nothing to close: the connection is dropped
    for s in ConnState:
        assert transition(s, Signal.LOST) is S.CLOSED
    # closing: only the end of the close is a transition; a second close by the door is not one
    assert transition(S.CLOSING, C.Connection.CloseOk) is S.CLOSING
    assert transition(S.CLOSING, C.Connection.Close) is S.CLOSING
    with pytest.raises(AmqpError):
        transition(S.CLOSING, Signal.SERVER_CLOSE)
    with pytest.raises(AmqpError):
        transition(S.CLOSED, C.Connection.Close)
    with pytest.raises(AmqpError):
        transition(S.START, Signal.PROTOCOL_HEADER)  # the header comes once


def test_channel_methods_need_an_open_connection() -> None:
    m = C.Basic.Consume(queue="q")
    require_open(S.OPEN, m)
    for s in (S.HEADER, S.START, S.TUNE, S.OPEN_WAIT, S.CLOSING):
        with pytest.raises(AmqpError) as ei:
            require_open(s, m)
        assert ei.value.code == 503 and ei.value.hard and (ei.value.class_id, ei.value.method_id) == (60, 20)
    with pytest.raises(AmqpError, match="basic.publish before the connection is open"):
        require_open(S.TUNE, C.Basic.Publish(), "basic.publish")


def test_a_channel_is_opened_once_used_and_closed() -> None:
    opened = channel_transition(CH.ABSENT, C.Channel.Open(), 1)
    assert opened is CH.OPEN
    assert channel_transition(CH.OPEN, C.Basic.Qos(), 1) is CH.OPEN
    assert channel_transition(CH.OPEN, C.Channel.Close(), 1) is CH.ABSENT
    # closed by the door: everything but the client's CloseOk is ignored
    assert channel_transition(CH.CLOSING, C.Basic.Ack(), 1) is CH.CLOSING
    assert channel_transition(CH.CLOSING, C.Channel.Close(), 1) is CH.CLOSING
    assert channel_transition(CH.CLOSING, C.Channel.CloseOk(), 1) is CH.ABSENT


def test_a_channel_not_open_for_a_method_is_refused_with_504() -> None:
    with pytest.raises(AmqpError) as ei:
        channel_transition(CH.ABSENT, C.Queue.Declare(queue="q"), 3)
    e = ei.value
    assert e.code == codec.CHANNEL_ERROR and e.hard and (e.class_id, e.method_id) == (50, 10)
    assert e.text == "CHANNEL_ERROR - expected 'channel.open' on channel 3"
    for state in (CH.OPEN, CH.CLOSING):
        with pytest.raises(AmqpError, match="second 'channel.open' seen on channel 3") as ei:
            channel_transition(state, C.Channel.Open(), 3)
        assert ei.value.code == 504


def test_sasl_credentials() -> None:
    assert credentials("PLAIN", b"\x00guest\x00secret") == ("guest", "secret")
    assert credentials("PLAIN", "\x00guest\x00secret") == ("guest", "secret")
    assert credentials("PLAIN", b"guest") == (None, None)
    table = pencode.field_table({"LOGIN": "bob", "PASSWORD": "pw"})
    assert credentials("AMQPLAIN", table[4:]) == ("bob", "pw")  # the response is the table without its length
    assert credentials("AMQPLAIN", b"\xff") == (None, None)
    with pytest.raises(AmqpError) as ei:
        credentials("EXTERNAL", b"")
    assert ei.value.code == codec.ACCESS_REFUSED and ei.value.hard
    assert struct.unpack(">I", table[:4])[0] == len(table) - 4


def _start_ok(user: str, password: str) -> C.Connection.StartOk:
    return C.Connection.StartOk(mechanism="PLAIN", response=f"\x00{user}\x00{password}")


def test_login_and_loopback_users() -> None:
    settings = SimpleNamespace(amqp_users={"guest": "guest", "app": "pw"}, amqp_loopback_users=["guest"])
    assert authenticate(_start_ok("app", "pw"), settings, "10.0.0.7:5000") == "app"
    assert authenticate(_start_ok("guest", "guest"), settings, "127.0.0.1:5000") == "guest"
    with pytest.raises(AmqpError, match="can only connect via localhost"):
        authenticate(_start_ok("guest", "guest"), settings, "10.0.0.7:5000")
    with pytest.raises(AmqpError, match="Login was refused") as ei:
        authenticate(_start_ok("app", "wrong"), settings, "127.0.0.1:5000")
    assert ei.value.code == codec.ACCESS_REFUSED and (ei.value.class_id, ei.value.method_id) == (10, 11)


def test_tuning_within_the_doors_limits() -> None:
    settings = SimpleNamespace(amqp_frame_max=131072, amqp_channel_max=2047)
    t = tune(C.Connection.TuneOk(channel_max=0, frame_max=0, heartbeat=30), settings)
    assert (t.frame_max, t.channel_max, t.heartbeat) == (131072, 2047, 30)  # 0: the server's value
    t = tune(C.Connection.TuneOk(channel_max=10, frame_max=8192, heartbeat=0), settings)
    assert (t.frame_max, t.channel_max, t.heartbeat) == (8192, 10, 0)
    for fm in (codec.FRAME_MIN_SIZE - 1, 131073):
        with pytest.raises(AmqpError) as ei:
            tune(C.Connection.TuneOk(channel_max=0, frame_max=fm, heartbeat=0), settings)
        assert ei.value.code == codec.NOT_ALLOWED and ei.value.hard
