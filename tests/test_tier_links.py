"""A local link whose origin only the tier holds (issue 17): delivered, not skipped.

A retry, a fired timer or a committed transaction is a link record: its body is
an earlier record's. When that earlier record's segment has left the local disk
(uploaded, then removed by local retention) while the link is still local, a
pull must still deliver the message, its origin read from the tier on the tier's
read workers, never on the event loop. Against real S3-compatible servers (moto,
``rclone serve s3``) on 127.0.0.1 and a real BrokerController.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from core_broker.broker_controller import BrokerController
from core_broker.config import BrokerConfig
from core_broker.model import FilterExpression, GetStatus, Message
from core_broker.topic_config import TopicConfig

from test_tier_read import pull_all
from tier_helpers import S3Server, aws_credentials, s3, tier_config, wait_for  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("aws_credentials")]


def test_a_local_link_to_a_message_only_in_the_tier_is_delivered(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    cfg = tier_config(tmp_path / "d", s3, bucket, retention_hours=1.0, tier_read_block_bytes=16 << 10)

    async def main() -> None:
        bc = BrokerController(cfg, BrokerConfig())
        await bc.start()
        tier, store = bc.tier, bc.store
        assert tier is not None
        try:
            for name, queues in (("T", 1), ("L", 1)):
                bc.create_topic(TopicConfig(name, queues=queues), exist_ok=True)

            def write() -> None:
                origins = [store.put(Message("T", os.urandom(700), tag="ab"[i % 2], keys=(f"k{i}",))).commitlog_offset
                           for i in range(300)]  # several sealed segments
                for i, o in enumerate(origins[:40]):  # the links, in the active segment
                    store.put_link(o, "L", 0, properties={"n": str(i)})

            await asyncio.to_thread(write)
            before = await pull_all(bc, "L", 0)
            tagged_before = await pull_all(bc, "L", 0, FilterExpression("a"))
            assert len(before) == 40 and len(tagged_before) == 20
            await asyncio.to_thread(wait_for, lambda: tier.backlog() == (0, 0), 30)
            active = store.commitlog.files.files[-1].base
            assert store.run_retention(now=time.time() + 10 * 3600) > 0
            assert store.commitlog.min_offset == active  # every origin left; every link stayed
            assert store.min_offset("L", 0) == 0

            threads: set[str] = set()
            get_range = tier.objects.get_range

            def recording(*a, **kw):  # where the ranged GETs run (the client itself is real)
                threads.add(threading.current_thread().name)
                return get_range(*a, **kw)

            tier.objects.get_range = recording  # type: ignore[method-assign]
            assert await pull_all(bc, "L", 0) == before
            assert await pull_all(bc, "L", 0, FilterExpression("a")) == tagged_before
            assert threads and all(n.startswith("unimq-tier-read") for n in threads), threads
            r = await bc.pull("L", 0, 39, 5)
            assert r.status == GetStatus.FOUND and [m.properties["n"] for m in r.messages] == ["39"]
            # without the tier the store skips them, as it always did
            assert store.get("L", 0, 0, 32).messages == []
        finally:
            await bc.stop()

    asyncio.run(main())
