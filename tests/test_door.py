"""What every door needs from below (gateway/door.py), each door's own settings, and how the node names a failed listener."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from adapters.amqp.settings import AmqpSettings
from core_broker.config import StoreConfig
from adapters.cloudevents.settings import HttpSettings
from adapters.mqtt.settings import MqttSettings
from gateway.door import DoorSettings, ListenError, ServerState, bind_socket, check_port, format_address
from gateway.grpc.settings import GrpcSettings
from unimq.node import Node, StartupError
from unimq.settings import UnimqSettings


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_bind_socket_port_0_reports_the_real_port() -> None:
    sock = bind_socket("127.0.0.1", 0)
    try:
        assert sock.getsockname()[1] > 0
    finally:
        sock.close()


def test_bind_socket_on_a_taken_port_names_the_address(busy_port: int) -> None:
    with pytest.raises(ListenError) as info:
        bind_socket("127.0.0.1", busy_port)
    assert info.value.in_use
    assert str(info.value) == f"127.0.0.1:{busy_port} is already in use"


def test_bind_socket_reuse_port_shares_a_port_between_listeners() -> None:
    """Two listeners that both ask for SO_REUSEPORT share a port, and the kernel hands each of
    them connections; a third without it is refused as in use."""
    import socket

    first = bind_socket("127.0.0.1", 0, reuse_port=True)
    port = first.getsockname()[1]
    second = bind_socket("127.0.0.1", port, reuse_port=True)
    try:
        with pytest.raises(ListenError) as info:
            bind_socket("127.0.0.1", port)
        assert info.value.in_use
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
        accepted = []
        for lst in (first, second):
            lst.setblocking(True)
            lst.settimeout(0.5)
            n = 0
            while True:
                try:
                    conn, _ = lst.accept()
                except (socket.timeout, BlockingIOError):
                    break
                conn.close()
                n += 1
            accepted.append(n)
        for c in clients:
            c.close()
        assert sum(accepted) == 32 and all(accepted), accepted
    finally:
        first.close()
        second.close()


def test_format_address_brackets_ipv6() -> None:
    assert format_address("::1", 80) == "[::1]:80"
    assert format_address("127.0.0.1", 80) == "127.0.0.1:80"


@pytest.mark.parametrize("port, off, ok", [(0, False, True), (65535, False, True), (-1, False, False),
                                           (-1, True, True), (-2, True, False), (True, False, False)])
def test_check_port(port: object, off: bool, ok: bool) -> None:
    if ok:
        check_port("x_port", port, off=off)
    else:
        with pytest.raises(ValueError, match="x_port"):
            check_port("x_port", port, off=off)


@pytest.mark.parametrize("cls, bad", [
    (MqttSettings, {"mqtt_ws_port": -2}),
    (MqttSettings, {"mqtt_tls_cert": "/nonexistent.pem"}),
    (AmqpSettings, {"amqp_frame_max": 10}),
    (HttpSettings, {"http_max_body_bytes": 10}),
    (GrpcSettings, {"grpc_credentials": {"": "x"}}),
    (DoorSettings, {"host": ""}),
])
def test_each_door_checks_its_own_knobs_alone_and_composed(cls: type, bad: dict) -> None:
    key = next(iter(bad))
    with pytest.raises(ValueError, match=key.split("_")[0]):
        cls(**bad)
    with pytest.raises(ValueError, match=key.split("_")[0]):
        UnimqSettings(**bad)


def test_the_application_settings_are_the_doors_settings_composed() -> None:
    names = {f.name for f in dataclasses.fields(UnimqSettings)}
    for door in (MqttSettings, AmqpSettings, HttpSettings, GrpcSettings):
        assert issubclass(UnimqSettings, door)
        assert {f.name for f in dataclasses.fields(door)} <= names


@pytest.mark.parametrize("given, ws, tls", [
    ({}, 8083, None),
    ({"mqtt_port": 0}, 0, None),
    ({"mqtt_ws_port": -1}, None, None),
    ({"mqtt_port": 0, "mqtt_ws_port": 9001}, 9001, None),
])
def test_mqtt_side_listeners_follow_the_main_port_unless_given(given: dict, ws: int | None, tls: int | None) -> None:
    s = MqttSettings(**given)
    assert (s.ws_listener_port(), s.tls_listener_port()) == (ws, tls)


def test_mqtt_config_takes_the_doors_packet_limit_unless_given() -> None:
    # The store holds up to 256 MiB (AMQP's 128 MiB messages); MQTT keeps the doors' 4 MiB default
    # (or the store's limit when that is smaller) unless mqtt_max_packet_size says otherwise.
    s = MqttSettings(mqtt_max_inflight=7)
    cfg = s.mqtt_config()
    assert cfg.max_inflight == 7 and cfg.max_packet_size == 4 * 1024 * 1024 + 65536
    small = MqttSettings(store=StoreConfig(max_message_size=1 << 20))
    assert small.mqtt_config().max_packet_size == (1 << 20) + 65536
    assert MqttSettings(mqtt_max_packet_size=1000).mqtt_config().max_packet_size == 1000


def test_server_state_is_ready_only_in_phase_ready() -> None:
    state = ServerState(settings=DoorSettings())
    assert not state.ready
    state.phase = "ready"
    assert state.ready


class _Listener:
    """A real listener on a port of its own choosing, reporting failure as its library would."""

    name = "probe"

    def __init__(self, port: int, raw: bool) -> None:
        self.port, self.raw = port, raw
        self.sock: socket.socket | None = None

    async def start(self) -> tuple[str, int]:
        if self.raw:  # a library that says only that it failed (no errno), as grpcio does
            try:
                self.sock = bind_socket("127.0.0.1", self.port)
            except OSError:
                raise OSError("failed to add port") from None
        else:
            self.sock = bind_socket("127.0.0.1", self.port)
        return self.sock.getsockname()[:2]

    async def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()


@pytest.mark.parametrize("raw", [False, True])
async def test_node_names_the_listener_and_address_it_could_not_take(busy_port: int, raw: bool) -> None:
    node = Node(UnimqSettings())
    with pytest.raises(StartupError) as info:
        await node.listen(_Listener(busy_port, raw), "probe door", busy_port)
    assert str(info.value) == f"cannot start the probe door: 127.0.0.1:{busy_port} is already in use"
    assert node.started == []


async def test_node_announces_a_started_listener_once(capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(UnimqSettings())
    listener = _Listener(0, raw=False)
    host, port = await node.listen(listener, "probe door", 0)
    await listener.stop()
    assert capsys.readouterr().out == f"unimq: probe listening on 127.0.0.1:{port}\n"
    assert node.started == [listener] and node.state.listening == {"probe": (host, port)}
