"""A fault test in the style of Jepsen for replicated broker groups (issue 16).

A group of three brokers, two acknowledging (--min-insync-replicas 2, sync flush), behind a
gateway. Producers on two doors run all the time: HTTP (a 200 is the acknowledgement) and MQTT 5
QoS 1 with paho (a PUBACK below 0x80 is). A consumer group pops and acks over HTTP meanwhile. The
master is SIGKILLed at random moments 8 times and partitioned from everyone else 3 times (fault
proxies in front of every broker's RPC port, which brokers advertise, and of the controller: the
master's RPC proxy refuses connections, its controller link is blackholed), each time until a new
master serves and the group is back to three in sync.

At the end every acknowledged message is read back from the last master exactly once, and the
consumer group has seen every acknowledged HTTP message. How a client's own resend is told apart:
every HTTP attempt carries its attempt number in the body, so a body can never legitimately appear
twice, while a message retried after an error may appear once per attempt; paho resends an MQTT
message itself only after a reconnect, so an MQTT body may appear twice only if a disconnect fell
while it was in flight. Every body read must be one that was sent: a truncated or torn record
served by any broker would show up as a body nobody sent (records are CRC-checked when read, too).
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.properties import Properties  # noqa: F401  (v5 client)

from nameserver.controller_client import ControllerClient, GroupState
from tests.faultproxy import ThreadedFaultProxy
from tests.test_controller_raft import _free_ports
from tests.test_replication import BROKER_SETS, read_all
from unimq.local_cluster import Proc, start_proc

# Each round costs a failover and a rejoin (~6 s on a loaded 2-core machine): 8 kills and 3
# partitions, in a random order (the seed is printed), keep both fault kinds and a kill of a
# broker that rejoined after an earlier fault in every run; the suite ran 20 + 5 (170 s) before.
KILLS = 8
PARTITIONS = 3
IDS = ("b1", "b2", "b3")


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        raft, ctl, *ports = _free_ports(2 + len(IDS))
        self.ctl_port = ctl
        self.controller = start_proc("controller", [
            "controller", "--controller-port", str(ctl), "--data-dir", str(root / "ctl"),
            "--raft-addr", f"127.0.0.1:{raft}", "--peers", f"127.0.0.1:{raft}", "--secret", "j",
            "--lease-ms", "1500"])
        self.nameserver = start_proc("nameserver", ["nameserver", "--port", "0"])
        self.namesrv = f"127.0.0.1:{self.nameserver.ports['namesrv']}"
        self.port = dict(zip(IDS, ports))
        self.rpc_proxy = {b: ThreadedFaultProxy(self.port[b]) for b in IDS}
        self.ctl_proxy = {b: ThreadedFaultProxy(ctl) for b in IDS}
        for p in [*self.rpc_proxy.values(), *self.ctl_proxy.values()]:
            p.start()
        self.brokers: dict[str, Proc] = {}
        for b in IDS:
            self.start_broker(b)
        self.gateway = start_proc("gateway", ["gateway", "--namesrv", self.namesrv, "--rpc-port", "0", "--http-port",
                                              "0", "--mqtt-port", "0", "--amqp-port", "0", "--grpc-port", "0",
                                              "--mqtt-ws-port", "-1"])
        self.http = f"http://127.0.0.1:{self.gateway.ports['http']}"

    def start_broker(self, b: str) -> None:
        self.brokers[b] = start_proc(b, [
            "broker", "--data-dir", str(self.root / b), "--port", str(self.port[b]),
            "--advertise", f"127.0.0.1:{self.rpc_proxy[b].port}", "--namesrv", self.namesrv, "--group", "g",
            "--broker-id", b, "--controller-addr", f"127.0.0.1:{self.ctl_proxy[b].port}",
            "--min-insync-replicas", "2", "--flush", "sync", "--heartbeat-s", "1",
            "--set", "replica_lag_max_ms=1500", "--set", "group_heartbeat_ms=300", *BROKER_SETS])

    def stop(self) -> None:
        for p in [self.gateway, *self.brokers.values(), self.nameserver, self.controller]:
            p.stop()
        for px in [*self.rpc_proxy.values(), *self.ctl_proxy.values()]:
            px.stop()

    def state(self) -> GroupState:
        async def ask() -> GroupState:
            c = ControllerClient([("127.0.0.1", self.ctl_port)], timeout_s=2.0)
            await c.start()
            try:
                return await c.group_state("g")
            finally:
                await c.stop()

        return asyncio.run(ask())

    def wait(self, pred, what: str, timeout: float = 60.0) -> GroupState:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                last = st = self.state()
                if pred(st):
                    return st
            except Exception as e:  # noqa: BLE001 - controller busy, group unknown yet
                last = e
            time.sleep(0.2)
        logs = "\n".join(f"--- {b} (exit {p.popen.poll()}):\n{p.tail(60)}" for b, p in self.brokers.items())
        raise AssertionError(f"{what}: {last}\n{logs}")


def _post(url: str, body: bytes, timeout: float = 30.0) -> int:
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


class HttpProducer(threading.Thread):
    def __init__(self, url: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.stop_ev = url, stop
        self.sent: set[bytes] = set()
        self.acked: set[bytes] = set()

    def run(self) -> None:
        i = 0
        while not self.stop_ev.is_set():
            attempt = 0
            while not self.stop_ev.is_set():
                body = f"h{i:06d}a{attempt:02d}-".encode() + b"x" * 200
                self.sent.add(body)
                if _post(self.url, body) == 200:
                    self.acked.add(body)
                    break
                attempt += 1
                time.sleep(0.05)
            i += 1


class MqttProducer(threading.Thread):
    def __init__(self, port: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.stop_ev = stop
        self.sent: set[bytes] = set()
        self.acked: set[bytes] = set()
        self.maybe_resent: set[bytes] = set()
        self.inflight: dict[int, bytes] = {}
        self.lock = threading.Lock()
        c = self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="jepsen-producer",
                                      protocol=mqtt.MQTTv5)
        c.max_inflight_messages_set(20)
        c.reconnect_delay_set(0.1, 1)
        c.on_publish = self._on_publish
        c.on_disconnect = self._on_disconnect
        c.connect("127.0.0.1", port)
        c.loop_start()

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            body = self.inflight.pop(mid, None)
        if body is not None and not reason_code.is_failure:
            self.acked.add(body)

    def _on_disconnect(self, *args) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            self.maybe_resent.update(self.inflight.values())

    def run(self) -> None:
        i = 0
        while not self.stop_ev.is_set():
            with self.lock:
                if len(self.inflight) >= 20:
                    pass
                else:
                    body = f"m{i:06d}-".encode() + b"y" * 200
                    info = self.client.publish("jepm/dev", body, qos=1)
                    self.inflight[info.mid] = body
                    self.sent.add(body)
                    i += 1
            time.sleep(0.01)
        deadline = time.monotonic() + 30
        while self.inflight and time.monotonic() < deadline:
            time.sleep(0.1)
        self.client.loop_stop()
        self.client.disconnect()


class Consumer(threading.Thread):
    def __init__(self, http: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.http, self.stop_ev = http, stop
        self.seen: set[bytes] = set()

    def once(self) -> int:
        url = f"{self.http}/v1/topics/jeph/groups/jg/pop?max=32&invisible_s=3&wait_s=1"
        req = urllib.request.Request(url, data=b"", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                msgs = json.loads(r.read() or b"{}").get("messages", [])
        except (urllib.error.HTTPError, OSError, ValueError):
            time.sleep(0.2)
            return -1
        if not msgs:
            return 0
        for m in msgs:
            self.seen.add(base64.b64decode(m["body_base64"]))
        ack = json.dumps({"receipt_handles": [m["receipt_handle"] for m in msgs]}).encode()
        _post(f"{self.http}/v1/topics/jeph/groups/jg/ack", ack)  # a lost ack means a redelivery: fine
        return len(msgs)

    def run(self) -> None:
        while not self.stop_ev.is_set():
            self.once()


@pytest.mark.timeout(900)
def test_acknowledged_messages_survive_kills_and_partitions(tmp_path: Path) -> None:
    rnd = random.Random()
    seed = rnd.randrange(1 << 30)
    rnd.seed(seed)
    print(f"jepsen seed={seed}")
    c = Cluster(tmp_path)
    stop = threading.Event()
    try:
        c.wait(lambda s: s.master_id is not None and len(s.in_sync) == 3, "three in sync")
        http = HttpProducer(f"{c.http}/v1/topics/jeph/messages", stop)
        mq = MqttProducer(c.gateway.ports["mqtt"], stop)
        consumer = Consumer(c.http, stop)
        for t in (http, mq, consumer):
            t.start()
        faults = ["kill"] * KILLS + ["partition"] * PARTITIONS
        rnd.shuffle(faults)
        for n, fault in enumerate(faults):
            time.sleep(rnd.uniform(0.2, 1.5))
            st = c.wait(lambda s: s.master_id is not None and len(s.in_sync) == 3, f"fault {n}: three in sync")
            old = st.master_id
            assert old is not None
            if fault == "kill":
                c.brokers[old].kill9()
            else:
                c.rpc_proxy[old].refuse()
                c.ctl_proxy[old].partition()
            c.wait(lambda s: s.master_id not in (None, old), f"fault {n} ({fault} {old}): a new master", 30)
            if fault == "kill":
                c.start_broker(old)
            else:
                time.sleep(rnd.uniform(0.0, 1.0))
                c.rpc_proxy[old].resume()
                c.ctl_proxy[old].resume()
        stop.set()
        for t in (http, mq, consumer):
            t.join(60)
        c.wait(lambda s: s.master_id is not None and len(s.in_sync) == 3, "three in sync at the end")
        # drain the consumer group (messages whose ack was lost come back after 3 s)
        idle_since = time.monotonic()
        deadline = time.monotonic() + 60
        while time.monotonic() - idle_since < 5 and time.monotonic() < deadline:
            if consumer.once() != 0:
                idle_since = time.monotonic()

        h_read = Counter(read_all(c, "jeph"))  # type: ignore[arg-type]
        m_read = Counter(read_all(c, "jepm"))  # type: ignore[arg-type]
        assert len(http.acked) > 100 and len(mq.acked) > 100, (len(http.acked), len(mq.acked))
        lost_h = [b[:10] for b in http.acked if b not in h_read]
        lost_m = [b[:8] for b in mq.acked if b not in m_read]
        assert not lost_h and not lost_m, f"acknowledged and lost: http {lost_h[:5]} ({len(lost_h)}), mqtt {lost_m[:5]} ({len(lost_m)})"
        assert set(h_read) <= http.sent and set(m_read) <= mq.sent, "a body nobody sent was served"
        twice_h = [b[:10] for b, k in h_read.items() if k > 1]
        twice_m = [b[:8] for b, k in m_read.items() if k > 1 and b not in mq.maybe_resent]
        assert not twice_h and not twice_m, f"stored twice though sent once: http {twice_h[:5]}, mqtt {twice_m[:5]}"
        vanished = [b[:10] for b in http.acked if b not in consumer.seen]
        assert not vanished, f"the consumer group never saw {len(vanished)} acknowledged messages: {vanished[:5]}"
        print(f"jepsen: {len(faults)} faults; http acked {len(http.acked)} of {len(http.sent)} sent, "
              f"mqtt acked {len(mq.acked)} of {len(mq.sent)}; consumer saw {len(consumer.seen)}")
    finally:
        stop.set()
        c.stop()
