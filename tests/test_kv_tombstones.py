"""Door-state tombstones end after ``kv_tombstone_ttl_s``, in memory and in the snapshot.

Why: every ended MQTT persistent session and deleted AMQP queue leaves a versioned
tombstone (last-writer-wins replication needs it to beat a stale copy). Kept for
ever they grow memory and every 5 s snapshot without bound for a fleet of devices
whose client ids come and go. A real BrokerController on a real store: put,
delete, let the tombstone age, restart from the snapshot.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from core_broker.broker_controller import BrokerController, kv_version
from core_broker.config import BrokerConfig

from store_helpers import make_config

pytestmark = pytest.mark.timeout(60)


def test_tombstones_older_than_the_ttl_are_forgotten(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = BrokerConfig(kv_tombstone_ttl_s=3600)
        bc = BrokerController(make_config(tmp_path / "data"), cfg)
        await bc.start()
        hour_ms = 3600 * 1000
        old = kv_version() - ((2 * hour_ms) << 20)  # written two hours ago by some gateway
        await bc.kv_put("mqtt.sessions", "gone-long-ago", b"s", version=old)
        await bc.kv_put("mqtt.sessions", "gone-long-ago", None, version=old + 1)
        await bc.kv_put("mqtt.sessions", "gone-just-now", b"s")
        await bc.kv_put("mqtt.sessions", "gone-just-now", None)
        await bc.kv_put("mqtt.sessions", "alive-old", b"keep", version=old + 2)
        items = bc.kv_items_versioned("mqtt.sessions")
        assert items["gone-long-ago"] == (old + 1, None)  # a tombstone, for now
        # a stale copy of the deleted entry is refused while the tombstone stands
        await bc.kv_put("mqtt.sessions", "gone-long-ago", b"stale", version=old)
        assert bc.kv_get("mqtt.sessions", "gone-long-ago") is None

        assert bc.prune_tombstones() == 1
        items = bc.kv_items_versioned("mqtt.sessions")
        assert "gone-long-ago" not in items
        assert items["gone-just-now"][1] is None  # younger than the TTL: kept
        assert items["alive-old"][1] == b"keep"  # live entries never expire
        await bc.stop()

        bc = BrokerController(make_config(tmp_path / "data"), cfg)
        await bc.start()
        items = bc.kv_items_versioned("mqtt.sessions")
        assert set(items) == {"gone-just-now", "alive-old"}
        assert bc.kv_items("mqtt.sessions") == {"alive-old": b"keep"}
        await bc.stop()

    asyncio.run(main())


def test_a_snapshot_prunes_by_itself(tmp_path: Path) -> None:
    async def main() -> None:
        bc = BrokerController(make_config(tmp_path / "data"), BrokerConfig(kv_tombstone_ttl_s=0.0))
        await bc.start()
        await bc.kv_put("amqp.queues", "q1", b"def")
        await bc.kv_put("amqp.queues", "q1", None)
        time.sleep(0.01)  # the tombstone is older than a TTL of zero
        await bc.write_snapshot()
        assert bc.kv_items_versioned("amqp.queues") == {}
        await bc.stop()

    asyncio.run(main())
