"""Persistent sessions' LMQs (one shared log, issue 21) across restarts and SIGKILL.

Why: since LMQ entries live in memory and one shared log written at checkpoints,
what was published to away devices must still reach them, in order, after a clean
restart and after the process is killed (the commitlog rebuilds the entries the log
had not got yet); and the LMQs of a session discarded by a clean start must not
come back.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from core_broker.light_queue import stored_names
from mqtt_fixtures import Paho, config_file, wait_for

pytestmark = pytest.mark.timeout(300)

DEVICES = 150


def _start(unimq_server, cfg: str, data_dir: Path | None = None):
    srv = unimq_server("--config", cfg, data_dir=data_dir)
    srv.config = cfg
    return srv


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["restart", "sigkill"])
def test_away_devices_get_what_was_published_across_a_restart(unimq_server, tmp_path, stop) -> None:
    cfg = config_file(tmp_path)
    srv = _start(unimq_server, cfg)
    port = srv.ports["mqtt"]
    topics = [f"dev/{i}/cmd" for i in range(DEVICES)]
    for i, t in enumerate(topics):  # each device: its own persistent session and QoS 1 topic
        d = Paho(port, f"dev-{i}", clean=False)
        d.subscribe(t, qos=1)
        d.disconnect()
    pub = Paho(port, "pub")
    for k in range(2):
        for i, t in enumerate(topics):
            pub.publish(t, f"{i}-{k}".encode(), qos=1)  # waits for the PUBACK
    pub.disconnect()
    gone = Paho(port, "dev-0", clean=True)  # a clean start discards dev-0's session and LMQ
    gone.disconnect()

    srv.stop(sig=stop)
    srv = _start(unimq_server, cfg, srv.data_dir)
    port = srv.ports["mqtt"]
    pub = Paho(port, "pub")
    for i, t in enumerate(topics):  # while still away, after the restart
        pub.publish(t, f"{i}-2".encode(), qos=1)
    pub.disconnect()
    for i, t in enumerate(topics[1:], start=1):
        d = Paho(port, f"dev-{i}", clean=False)
        assert d.connack[-1][0].session_present
        got = d.get_n(3)
        assert [(m.topic, m.payload, m.qos) for m in got] == [(t, f"{i}-{k}".encode(), 1) for k in range(3)]
        d.disconnect()
    d0 = Paho(port, "dev-0", clean=False)
    assert not d0.connack[-1][0].session_present
    d0.nothing(0.5)  # its subscription went with its session: nothing queued for it
    d0.disconnect()

    data = Path(srv.data_dir)

    def lmqs() -> set[str]:
        return {n for p in data.rglob("consumequeue") for n in stored_names(p) if n.startswith("%LMQ%mqtt/dev-")}

    assert wait_for(lambda: len(lmqs()) >= DEVICES - 1, 30)
    assert not [n for n in lmqs() if n.startswith("%LMQ%mqtt/dev-0/")]
    srv.stop()
