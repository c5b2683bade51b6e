"""Which protocol doors a process opens, wired to its processor, in start order.

The only module that knows every door. A door is built from the process's
shared :class:`~gateway.door.ServerState` (settings and processor); adding one
means writing a class that satisfies :class:`~gateway.door.Door` and listing it
in :func:`build_doors`, with its client table (:class:`~gateway.clients.ClientSource`)
registered in ``state.clients`` for the admin API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from gateway.door import Door, ServerState

if TYPE_CHECKING:
    from .settings import UnimqSettings

__all__ = ["DOOR_NAMES", "Listener", "build_doors"]

#: The protocol doors the ``doors`` setting may name.
DOOR_NAMES = ("http", "grpc", "mqtt", "amqp")


class Listener(NamedTuple):
    """A door to start, the port it is asked to listen on, and its name for a user."""

    door: Door
    port: int
    label: str


def build_doors(state: ServerState[UnimqSettings]) -> list[Listener]:
    """Every enabled door, in start order (stopped in reverse).

    HTTP starts first so it stops last: ``/healthz`` keeps answering (503,
    "stopping") while the others drain.
    """
    settings = state.settings
    enabled = set(settings.doors)
    doors: list[Listener] = []
    if "http" in enabled:
        from adapters.cloudevents.server import HttpDoor

        doors.append(Listener(HttpDoor(state), settings.http_port, "HTTP door"))
    if "grpc" in enabled:
        from gateway.grpc import GrpcDoor  # late: grpcio and the v2 stubs are heavy imports
        from gateway.grpc.clients import GrpcClients

        grpc_door = GrpcDoor(state)
        state.clients.register(GrpcClients(grpc_door))
        doors.append(Listener(grpc_door, settings.grpc_port, "gRPC door"))
    if "mqtt" in enabled:
        doors += _mqtt_doors(state)
    if "amqp" in enabled:
        from adapters.amqp.clients import AmqpClients
        from adapters.amqp.server import AmqpDoor, AmqpTlsDoor

        amqp = AmqpDoor(state)
        state.clients.register(AmqpClients(amqp))  # its TLS door shares its broker: one table
        doors.append(Listener(amqp, settings.amqp_port, "AMQP door"))
        amqps_port = settings.amqps_listener_port()
        if amqps_port is not None:
            doors.append(Listener(AmqpTlsDoor(state, amqp, amqps_port), amqps_port, "AMQPS door"))
    return doors


def _mqtt_doors(state: ServerState[UnimqSettings]) -> list[Listener]:
    """MQTT over TCP; over WebSocket unless turned off; over TLS and secure WebSocket with a
    certificate - one broker."""
    from adapters.mqtt.clients import MqttClients
    from adapters.mqtt.server import MQTTDoor, MQTTTlsDoor, MQTTWebSocketDoor

    settings = state.settings
    tcp = MQTTDoor(state)
    state.clients.register(MqttClients(tcp.broker))
    doors = [Listener(tcp, settings.mqtt_port, "MQTT door")]
    ws_port = settings.ws_listener_port()
    if ws_port is not None:
        doors.append(Listener(MQTTWebSocketDoor(state, tcp.broker, port=ws_port), ws_port, "MQTT over WebSocket door"))
    tls_port = settings.tls_listener_port()
    if tls_port is not None:
        doors.append(Listener(MQTTTlsDoor(state, tcp.broker, port=tls_port), tls_port, "MQTT over TLS door"))
    wss_port = settings.wss_listener_port()
    if wss_port is not None:
        doors.append(Listener(MQTTWebSocketDoor(state, tcp.broker, port=wss_port, secure=True), wss_port,
                              "MQTT over secure WebSocket door"))
    return doors
