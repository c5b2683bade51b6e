"""What serving a subscriber on another gateway costs (adapters/mqtt/tail.py).

    python -m bench.tail_cost [N]     # N QoS 0 messages per run (default 5000)

Why: with several gateways, a clean subscriber's gateway reads what the others store
(a tail of the store topic) instead of receiving it from memory. One nameserver, one
broker and two gateways (``unimq.local_cluster``); a publisher on gateway B sends N
QoS 0 messages to one topic while a clean subscriber on B (local) or on A (remote, by
the tail) takes them; the runs alternate (local, remote, local, remote) so the
machine's load falls on both alike. Reported per run: CPU microseconds per message
of each gateway and of the broker (utime + stime from /proc), and seconds until the
last delivery. Wall-clock figures are noisy on a shared machine; CPU per message less so.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import paho.mqtt.client as paho

from unimq.local_cluster import Cluster, Proc

try:
    from .procs import cpu_seconds
except ImportError:  # run as a script
    from bench.procs import cpu_seconds  # type: ignore[no-redef]

STORE = [f"--set={k}={v}" for k, v in {"store.commitlog_segment_size": 64 * 1024 * 1024,
                                          "store.cq_entries_per_file": 100_000}.items()]


def _client(port: int, on_message: object = None) -> paho.Client:
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="tc-" + uuid.uuid4().hex[:8])
    if on_message is not None:
        c.on_message = on_message  # type: ignore[assignment]
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def _run(c: Cluster, sub_gw: Proc, pub_gw: Proc, n: int, topic: str) -> dict[str, float]:
    got = threading.Event()
    count = [0]

    def on_message(cl: object, u: object, m: object) -> None:
        count[0] += 1
        if count[0] >= n:
            got.set()

    sub = _client(sub_gw.ports["mqtt"], on_message)
    sub.subscribe(topic + "/#", 0)
    pub = _client(pub_gw.ports["mqtt"])
    deadline = time.monotonic() + 30  # the subscription is served once a probe arrives
    while count[0] == 0 and time.monotonic() < deadline:
        pub.publish(topic + "/probe", b"p", 0).wait_for_publish(10)
        time.sleep(0.2)
    time.sleep(1.0)
    count[0] = 0
    procs = {"gateway A": c.gateways[0], "gateway B": c.gateways[1], "broker": next(iter(c.brokers.values()))}
    before = {k: cpu_seconds(p.popen.pid) for k, p in procs.items()}
    t0 = time.monotonic()
    body = b"x" * 100
    for i in range(n):
        pub.publish(topic + "/d", body, 0)
        if i % 500 == 499:
            time.sleep(0.01)  # (paho's own queue stays small)
    ok = got.wait(120)
    took = time.monotonic() - t0
    out = {k: (cpu_seconds(p.popen.pid) - before[k]) / n * 1e6 for k, p in procs.items()}
    out["seconds"] = took
    out["delivered"] = float(count[0] if ok else count[0])
    for cl in (sub, pub):
        cl.disconnect()
        cl.loop_stop()
    return out


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv else 5000
    with tempfile.TemporaryDirectory(prefix="tail-cost-") as d:
        c = Cluster(Path(d), brokers=1, gateways=2, extra_broker_args=STORE).start()
        try:
            a, b = c.gateways
            for i, (name, sub_gw) in enumerate([("local", b), ("remote", a)] * 2):
                r = _run(c, sub_gw, b, n, f"tc{i}")
                print(f"{name:6} (subscriber on {'B' if sub_gw is b else 'A'}): delivered {int(r['delivered'])}/{n} "
                      f"in {r['seconds']:.2f} s; CPU us/msg: gateway A {r['gateway A']:.1f}, "
                      f"gateway B {r['gateway B']:.1f}, broker {r['broker']:.1f}", flush=True)
        finally:
            c.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
