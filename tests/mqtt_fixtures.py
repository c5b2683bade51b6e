"""Helpers of the MQTT door suite (tests/test_mqtt_*.py).

Two kinds of peers: real client libraries nobody here wrote (paho-mqtt in
3.1.1 and 5.0 modes, amqtt, mosquitto_pub/sub) for behaviour a device sees,
and :class:`RawClient`, a blocking socket speaking packets through the door's
own codec, for what libraries hide (DUP flags, packet ids, malformed bytes,
silence for the keepalive). Every wait has a deadline and fails with what it
saw; nothing asserts how fast anything happened.
"""

from __future__ import annotations

import queue
import socket
import time
import uuid
from types import SimpleNamespace
from typing import Any, AsyncIterator, Callable

import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.mqtt import codec as C

WAIT = 10.0


def wait_for(cond: Callable[[], Any], timeout: float = WAIT, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Paho:
    """A paho-mqtt client on its own network thread that records what it receives."""

    def __init__(self, port: int, client_id: str | None = None, *, v5: bool = False, clean: bool = True,
                 host: str = "127.0.0.1", transport: str = "tcp", ws_path: str = "/mqtt", keepalive: int = 60,
                 username: str | None = None, password: str | None = None, will: tuple | None = None,
                 session_expiry: int | None = None, connect: bool = True, properties: Properties | None = None) -> None:
        self.client_id = client_id if client_id is not None else "t-" + uuid.uuid4().hex[:10]
        self.v5 = v5
        kw: dict[str, Any] = {}
        if not v5:
            kw["clean_session"] = clean
        self.c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             protocol=paho.MQTTv5 if v5 else paho.MQTTv311, transport=transport, **kw)
        if transport == "websockets":
            self.c.ws_set_options(path=ws_path)
        self.messages: queue.Queue[paho.MQTTMessage] = queue.Queue()
        self.received: list[paho.MQTTMessage] = []
        self.connack: list[Any] = []
        self.disconnects: list[Any] = []
        self.subacks: list[Any] = []
        self.c.on_message = self._on_message
        self.c.on_connect = lambda c, u, flags, rc, props: self.connack.append((flags, rc, props))
        self.c.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.append(rc)
        self.c.on_subscribe = lambda c, u, mid, rcs, props: self.subacks.append(rcs)
        if username is not None:
            self.c.username_pw_set(username, password)
        if will is not None:
            topic, payload, qos, retain, *rest = will
            self.c.will_set(topic, payload, qos, retain, properties=rest[0] if rest else None)
        self.host, self.port, self.keepalive = host, port, keepalive
        self.session_expiry = session_expiry
        self.clean = clean
        self.properties = properties
        if connect:
            self.connect()

    def _on_message(self, c: Any, u: Any, m: paho.MQTTMessage) -> None:
        self.received.append(m)
        self.messages.put(m)

    def connect(self, expect_ok: bool = True) -> Any:
        kw: dict[str, Any] = {}
        if self.v5:
            props = self.properties or Properties(PacketTypes.CONNECT)
            if self.session_expiry is not None:
                props.SessionExpiryInterval = self.session_expiry
            kw["properties"] = props
            kw["clean_start"] = self.clean
        n = len(self.connack)
        self.c.connect(self.host, self.port, keepalive=self.keepalive, **kw)
        self.c.loop_start()
        wait_for(lambda: len(self.connack) > n, what=f"CONNACK for {self.client_id}")
        flags, rc, props = self.connack[-1]
        if expect_ok:
            assert not rc.is_failure, f"connect refused: {rc}"
        return self.connack[-1]

    def subscribe(self, topic: str, qos: int = 0, **kw: Any) -> list[Any]:
        n = len(self.subacks)
        if self.v5 and "options" not in kw:
            kw["options"] = paho.SubscribeOptions(qos=qos)
            rc, _ = self.c.subscribe(topic, **kw)
        else:
            rc, _ = self.c.subscribe(topic, qos, **kw)
        assert rc == 0
        wait_for(lambda: len(self.subacks) > n, what=f"SUBACK for {topic}")
        return self.subacks[-1]

    def publish(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False,
                properties: Properties | None = None) -> paho.MQTTMessageInfo:
        info = self.c.publish(topic, payload, qos, retain, properties=properties)
        info.wait_for_publish(WAIT)
        assert info.is_published()
        return info

    def get(self, timeout: float = WAIT) -> paho.MQTTMessage:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no message within {timeout}s; got {self.topics()}") from None

    def get_n(self, n: int, timeout: float = WAIT) -> list[paho.MQTTMessage]:
        return [self.get(timeout) for _ in range(n)]

    def nothing(self, wait: float = 0.5) -> None:
        """Assert no message arrives within ``wait`` seconds (a bounded negative check)."""
        try:
            m = self.messages.get(timeout=wait)
        except queue.Empty:
            return
        raise AssertionError(f"{self.client_id}: unexpected message on {m.topic}: {m.payload!r}")

    def topics(self) -> list[str]:
        return [m.topic for m in self.received]

    def disconnect(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()

    def kill(self) -> None:
        """Drop the TCP connection without DISCONNECT (an abrupt network loss)."""
        self.c.loop_stop()
        sock = self.c.socket()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class RawClient:
    """A blocking MQTT client built on the door's sans-io codec (for protocol-level tests)."""

    def __init__(self, port: int, version: int = C.MQTT_311, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=WAIT)
        self.version = version
        self.decoder = C.Decoder(server_side=False, version=version)
        self.pending: list[C.Packet] = []

    def send(self, pkt: C.Packet | bytes) -> None:
        self.sock.sendall(pkt if isinstance(pkt, (bytes, bytearray)) else C.encode(pkt, self.version))

    def connect(self, client_id: str, clean: bool = True, keepalive: int = 60, **kw: Any) -> C.Connack:
        self.send(C.Connect(client_id, protocol_level=self.version, clean_start=clean, keepalive=keepalive, **kw))
        p = self.recv()
        assert isinstance(p, C.Connack), p
        return p

    def recv(self, timeout: float = WAIT) -> C.Packet:
        deadline = time.monotonic() + timeout
        while not self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no packet received in time")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise AssertionError("no packet received in time") from None
            if not data:
                raise ConnectionError("closed by the server")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def recv_type(self, t: type, timeout: float = WAIT) -> Any:
        p = self.recv(timeout)
        assert isinstance(p, t), f"expected {t.__name__}, got {p!r}"
        return p

    def closed_by_server(self, timeout: float = WAIT) -> list[C.Packet]:
        """Wait until the server closes; return the packets it sent before closing."""
        got: list[C.Packet] = list(self.pending)
        self.pending = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"server did not close the connection; got {got}")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except ConnectionResetError:
                return got
            if not data:
                return got
            try:
                got.extend(self.decoder.feed(data))
            except C.MQTTProtocolError:
                pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass



def start_unimq(tmp_path_factory: Any, *extra: str) -> Any:
    """Start `unimq up` like conftest's ``unimq_server`` does, for module-scoped fixtures.

    Returns the conftest ``UnimqProcess``; the caller stops it (``stop()``).
    """
    import os
    import subprocess
    import sys

    from conftest import (LISTEN_LINE, PORT_FLAGS, REPO_ROOT, TEST_STORE_ARGS, UnimqProcess, _config_sets_segment_size,
                          _unimq_command)

    data_dir = tmp_path_factory.mktemp("unimq-data")
    stderr_path = tmp_path_factory.mktemp("unimq-log") / "stderr.txt"
    args = [*_unimq_command(), "up", "--data-dir", str(data_dir), "--host", "127.0.0.1"]
    for flag in PORT_FLAGS:
        args += [flag, "0"]
    if not _config_sets_segment_size(extra):
        args += TEST_STORE_ARGS
    args += list(extra)
    with stderr_path.open("w") as err:
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1)
    server = UnimqProcess(proc=proc, data_dir=data_dir, stderr_path=stderr_path)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    import threading

    server.pump = threading.Thread(target=pump, daemon=True)
    server.pump.start()
    deadline = time.monotonic() + 60
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"unimq not ready; stderr:\n{server.stderr()}") from None
        if line is None:
            raise AssertionError(f"unimq exited early; stderr:\n{server.stderr()}")
        m = LISTEN_LINE.match(line)
        if m:
            server.ports[m["door"]] = int(m["port"])
        elif line == "unimq: ready":
            return server


# A small store: the default 1 GiB preallocated commitlog segment per test server would
# fill the disk, and the disk thresholds are off so a full shared disk cannot change an outcome.
SMALL_STORE = """
[store]
commitlog_segment_size = 8388608
cq_entries_per_file = 20000
index_slots = 2000
index_entries_per_file = 8000
disk_min_free_ratio = 0.0
disk_refuse_free_ratio = 0.0
"""


def config_file(directory: Any, extra: str = "") -> str:
    """Write a unimq TOML config (``extra`` top-level keys + the small store) and return its path."""
    from pathlib import Path

    path = Path(directory) / "unimq-mqtt.toml"
    path.write_text(extra + "\n" + SMALL_STORE)
    return str(path)


async def in_process_processor(tmp_path: Any) -> Any:
    """A started MessagingProcessor over a real small store in ``tmp_path`` (merged mode)."""
    from core_broker.config import StoreConfig
    from gateway.deployment import merged_processor

    p = merged_processor(StoreConfig(data_dir=tmp_path, commitlog_segment_size=16 << 20,
                                     cq_entries_per_file=10_000, index_slots=1000, index_entries_per_file=4000,
                                     disk_min_free_ratio=0.0, disk_refuse_free_ratio=0.0))
    await p.start()
    return p


@pytest.fixture
async def processor(tmp_path: Any) -> Any:
    """:func:`in_process_processor`, stopped after the test (import it into a test module to use it)."""
    p = await in_process_processor(tmp_path)
    yield p
    await p.stop()


@pytest.fixture
async def door(tmp_path: Any) -> AsyncIterator[SimpleNamespace]:
    """An MQTT door on 127.0.0.1 (port 0) over :func:`in_process_processor`: ``.processor``,
    ``.port``, ``.broker`` (import it into a test module to use it)."""
    from adapters.mqtt.broker import MQTTBroker, MQTTConfig
    from adapters.mqtt.server import MQTTDoor

    p = await in_process_processor(tmp_path)
    d = MQTTDoor(SimpleNamespace(processor=p, settings=None), MQTTBroker(p, MQTTConfig()), host="127.0.0.1", port=0)
    _, port = await d.start()
    try:
        yield SimpleNamespace(processor=p, port=port, broker=d.broker)
    finally:
        await d.stop()
        await p.stop()
