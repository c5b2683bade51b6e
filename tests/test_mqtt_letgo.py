"""A session offline at one gateway and taken as stored at another is let go without a write.

Why (issue 21, reconnect storms): a device that reconnects through the other gateway of a
shared port finds its session offline at the old one; the new gateway takes it from its
record and writes its own. The old holder used to answer that write with a *release* (its
final state, handed over), which made the new owner write its record once more: three writes
per device that moved, where one does. Only a claim (a session online at its holder: the
claimer waits, ``"h": -1`` in its record) is answered with a release now.

Two MQTT doors (two fleet members with their own gateway ids) over one real in-process
processor and store, real sockets.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from adapters.mqtt import codec as C
from adapters.mqtt.broker import MQTTBroker, MQTTConfig
from adapters.mqtt.server import MQTTDoor
from adapters.mqtt.session_store import KV_SESSIONS
from gateway.context import RequestContext
from mqtt_fixtures import RawClient, in_process_processor

pytestmark = pytest.mark.timeout(60)
CTX = RequestContext(protocol="test", client_id="letgo-test", trusted=True)


async def _until(cond: Callable[[], Any], what: str) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _subscribe_and_leave(port: int, cid: str) -> C.Packet:
    c = RawClient(port)
    try:
        c.connect(cid, clean=False)
        c.send(C.Subscribe(1, [("moves/#", C.SubOptions(qos=1))]))
        return c.recv()
    finally:
        c.close()


def _connect(port: int, cid: str) -> tuple[RawClient, C.Connack]:
    c = RawClient(port)
    return c, c.connect(cid, clean=False)


async def test_an_offline_session_taken_at_another_gateway_is_let_go_without_a_release(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="unimq.mqtt")
    p = await in_process_processor(tmp_path)
    doors = [MQTTDoor(SimpleNamespace(processor=p, settings=None), MQTTBroker(p, MQTTConfig()),
                      host="127.0.0.1", port=0) for _ in range(2)]
    ports = [(await d.start())[1] for d in doors]
    a, b = doors[0].broker, doors[1].broker
    try:
        assert isinstance(await asyncio.to_thread(_subscribe_and_leave, ports[0], "mover"), C.Suback)
        await _until(lambda: "mover" in b.fleet.copies and not b.fleet.copies["mover"].online,
                     "the other gateway's copy of the session, offline")
        c, ack = await asyncio.to_thread(_connect, ports[1], "mover")
        try:
            assert ack.session_present and "moves/#" in b.sessions["mover"].subs
            await _until(lambda: "mover" not in a.sessions and "mover" in a.fleet.copies,
                         "the old gateway to let the session go")
            assert a.fleet.copies["mover"].owner == b.fleet.gid
            await asyncio.sleep(0.3)  # (a release, were one written, would be on its way)
            assert not [r for r in caplog.records if "handed over" in r.getMessage()]
            d = json.loads(await p.kv_get(CTX, KV_SESSIONS, "mover"))
            assert d["o"] == b.fleet.gid and d["h"] == 0 and d["d"] == 0
            assert b.fleet.owns(b.sessions["mover"])
        finally:
            await asyncio.to_thread(c.close)
    finally:
        for d in doors:
            await d.stop()
        await p.stop()
