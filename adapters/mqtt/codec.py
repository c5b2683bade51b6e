"""A sans-io MQTT 3.1, 3.1.1 and 5.0 codec: bytes in, packets out; packets in, bytes out.

Why hand-written: unimq needs the *server* side of MQTT 5 (decoding CONNECT
with its will and properties, SUBSCRIBE options, AUTH, every v5 reason code)
with strict validation, in the sans-io style the architecture asks for
(h11/wsproto: no sockets, no event loop, fuzzable). Checked on PyPI before
writing this: ``mqtt-codec`` (last release 2019) covers only 3.1.1;
``mqttproto`` (sans-io, v5) is client-side only and not even published on the
package index this project installs from; ``gmqtt``, ``aiomqtt`` and
``paho-mqtt`` are clients bound to their own I/O; ``amqtt`` is a whole broker
whose codec lives inside its asyncio streams and stops at 3.1.1. None is a
well-kept sans-io codec covering v5 on the server side, so this module is one,
kept small: the hot path (PUBLISH and its acknowledgements) is decoded inline
without per-field function calls.

Use: :class:`Decoder` (``feed(data) -> list[packet]``) and :func:`encode`
(``encode(packet, version) -> bytes``). The decoder learns the protocol
version from CONNECT (server side) or is told it (client side). Every
violation raises :class:`MQTTProtocolError` carrying the v5 reason code (and,
for CONNECT, the 3.1.1 CONNACK return code), so the server can answer with the
right code before closing; nothing else ever escapes ``feed``.

The codec is four modules behind this one: ``packets`` (types, reason codes,
packet classes, the protocol error), ``properties`` (v5 properties and the
primitive wire types), ``decoder`` and ``encoder``. Import from here.
"""

from __future__ import annotations

from .decoder import Decoder
from .encoder import CONNACK_V3_OK, encode, encode_many, encode_publish, encode_publish0
from .packets import *  # noqa: F401,F403 - packet types, reason codes, packet classes, MQTTProtocolError
from .properties import PROPERTIES, PROPERTY_IDS, encode_properties

__all__ = [
    "MQTTProtocolError",
    "Decoder",
    "encode",
    "encode_publish",
    "encode_publish0",
    "encode_many",
    "CONNACK_V3_OK",
    "encode_properties",
    "PROPERTIES",
    "PROPERTY_IDS",
    "Connect",
    "Will",
    "Connack",
    "Publish",
    "PubAck",
    "PubRec",
    "PubRel",
    "PubComp",
    "Subscribe",
    "SubOptions",
    "Suback",
    "Unsubscribe",
    "Unsuback",
    "PingReq",
    "PingResp",
    "Disconnect",
    "Auth",
    "Packet",
]
