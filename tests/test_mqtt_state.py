"""adapters.mqtt.state: the connection's protocol state machine, sans-io; and the keepalive rule."""

from __future__ import annotations

import pytest

from adapters.mqtt import codec as C
from adapters.mqtt.config import MQTTConfig
from adapters.mqtt.connection import effective_keepalive
from adapters.mqtt.state import ACCEPT, CLOSE, LOST, TRANSITIONS, ConnectionState, State

CLIENT_PACKETS = (C.CONNECT, C.PUBLISH, C.PUBACK, C.PUBREC, C.PUBREL, C.PUBCOMP, C.SUBSCRIBE, C.UNSUBSCRIBE,
                  C.PINGREQ, C.DISCONNECT, C.AUTH)


def test_only_connect_is_legal_before_connect():
    st = ConnectionState()
    assert st.state is State.AWAITING_CONNECT
    for t in CLIENT_PACKETS:
        assert st.legal(t) == (t == C.CONNECT)
    with pytest.raises(C.MQTTProtocolError) as e:
        st.receive(C.PUBLISH)
    assert e.value.reason_code == C.RC_PROTOCOL_ERROR


def test_accepted_connection_takes_session_packets_but_not_a_second_connect():
    st = ConnectionState()
    st.receive(C.CONNECT)
    assert st.move(ACCEPT) is State.CONNECTED
    for t in (C.PUBLISH, C.PUBACK, C.PUBREC, C.PUBREL, C.PUBCOMP, C.SUBSCRIBE, C.UNSUBSCRIBE, C.PINGREQ):
        assert st.receive(t) is State.CONNECTED
    for t in (C.CONNECT, C.AUTH):  # MQTT-3.1.0-2; no enhanced authentication
        with pytest.raises(C.MQTTProtocolError):
            st.receive(t)
    assert st.receive(C.DISCONNECT) is State.DISCONNECTING
    assert not any(st.legal(t) for t in CLIENT_PACKETS)  # nothing is handled any more
    assert st.move(LOST) is State.CLOSED


def test_refused_connect_and_server_close():
    st = ConnectionState()
    st.receive(C.CONNECT)
    assert st.move(CLOSE) is State.DISCONNECTING
    assert st.move(CLOSE) is State.DISCONNECTING  # closing twice is harmless
    with pytest.raises(RuntimeError):
        st.move(ACCEPT)  # a bug: accepting a closed connection
    assert st.move(LOST) is State.CLOSED and st.move(LOST) is State.CLOSED
    assert st.move(CLOSE) is State.CLOSED


def test_every_state_can_lose_its_transport():
    assert all(TRANSITIONS[(s, LOST)] is State.CLOSED for s in State)


def test_keepalive_cap_and_override():
    capped = MQTTConfig(max_keepalive=60)
    assert effective_keepalive(30, True, capped) == 30  # less than the cap: its own
    assert effective_keepalive(600, True, capped) == 60
    assert effective_keepalive(0, False, capped) == 60  # no keepalive at all: held to the cap
    assert effective_keepalive(0, False, MQTTConfig()) == 0
    forced = MQTTConfig(server_keepalive=7, max_keepalive=60)
    assert effective_keepalive(30, True, forced) == 7  # v5 can be told
    assert effective_keepalive(30, False, forced) == 30  # 3.1.1 cannot: the cap still holds
