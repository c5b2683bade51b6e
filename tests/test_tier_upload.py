"""Tiered storage uploads (issue 17), against a real S3-compatible server (moto) on 127.0.0.1.

What must hold: sealed segments (never the active one) reach the tier whole,
with the queue entries and keys that find their messages; an upload interrupted
by a kill leaves nothing a reader could take for data; the object store down
never blocks a put, the backlog grows and drains once it is back.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core_broker.consume_queue import ENTRY as CQ_ENTRY
from core_broker.model import Message

from tier_helpers import (  # noqa: F401 (fixtures)
    S3Server, aws_credentials, aws_env, close_tiered, fill, manifests, open_tiered, parts, s3, tier_config,
    via_temporary_key, wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("aws_credentials")]
REPO = Path(__file__).resolve().parent.parent


def test_sealed_segments_are_uploaded_whole_and_the_active_one_never(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    store, tier = open_tiered(tier_config(tmp_path / "d", s3, bucket))
    try:
        fill(store, 300)  # ~300 KB: five 64 KiB segments
        files = list(store.commitlog.files.files)
        assert len(files) >= 4
        wait_for(lambda: tier.backlog() == (0, 0))
        sid = store.store_id
        got = manifests(s3, bucket, sid)
        assert sorted(got) == [mf.base for mf in files[:-1]]  # every sealed one, not the active one
        assert files[-1].base not in got
        assert not any(f"/{files[-1].base:020d}" in k for k in s3.keys(bucket))
        assert not [k for k in s3.keys(bucket) if "/tmp/" in k]
        for mf in files[:-1]:
            m = got[mf.base]
            assert m.inline  # records, index and keys in one object: two requests per segment
            got_parts = parts(s3, bucket, sid, m)
            data, index = got_parts["segment"], got_parts["index"]
            assert data == mf.path.read_bytes()  # byte for byte, and what the manifest says
            assert len(data) == m.size and hashlib.sha256(data).hexdigest() == m.sha256
            assert len(index) == m.index_length
            # the index holds exactly the local consume-queue entries that point into the segment
            cq = store._cqs[("T", 0)]
            local = [qo for qo in range(cq.min_offset, cq.max_offset) if mf.base <= cq.entry(qo)[0] < mf.end]
            ((topic, qid, first, end, pos, size),) = m.queues
            assert (topic, qid, first, end, size) == ("T", 0, local[0], local[-1] + 1, CQ_ENTRY.size)
            assert [tuple(e) for e in CQ_ENTRY.iter_unpack(index[pos : pos + (end - first) * CQ_ENTRY.size])] == [
                cq.entry(qo) for qo in local
            ]
            assert m.length == max(p + z for p, z, _ in map(cq.entry, local)) - mf.base
            assert m.first_ts <= m.last_ts
        assert tier.status()["uploaded_segments"] == len(files) - 1
    finally:
        close_tiered(store, tier)


def test_the_object_store_down_never_blocks_puts_and_uploads_resume(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    store, tier = open_tiered(tier_config(tmp_path / "d", s3, bucket))
    try:
        s3.stop()
        slowest = 0.0
        for i in range(400):
            t = time.monotonic()
            store.put(Message("T", os.urandom(1000)))
            slowest = max(slowest, time.monotonic() - t)
        assert slowest < 0.5, f"a put took {slowest:.3f}s with the object store down"
        segments, nbytes = tier.backlog()
        assert segments >= 5 and nbytes == segments * store.config.commitlog_segment_size
        time.sleep(1.0)  # several failed attempts, backing off
        assert tier.uploader.failures >= 1 and tier.status()["last_error"]
        assert tier.backlog() == (segments, nbytes)
        s3.restart()
        wait_for(lambda: tier.backlog() == (0, 0), timeout=30)
        files = store.commitlog.files.files
        got = manifests(s3, bucket, store.store_id)
        assert sorted(got) == [mf.base for mf in files[:-1]]
        for mf in files[:-1]:
            assert parts(s3, bucket, store.store_id, got[mf.base])["segment"] == mf.path.read_bytes()
        assert not [k for k in s3.keys(bucket) if "/tmp/" in k]
    finally:
        if not s3.running:
            s3.restart()
        close_tiered(store, tier)


CRASHER = """
import os, signal, sys
from core_broker.message_store import MessageStore
from core_broker.model import Message
from core_broker.tier import TierService
sys.path.insert(0, {tests!r})
from tier_helpers import tier_config, via_temporary_key
from pathlib import Path
cfg = tier_config(Path({data!r}), type("S", (), {{"endpoint": {endpoint!r}}})(), {bucket!r})
store = MessageStore(cfg); store.start()
tier = TierService(store, via_temporary_key(cfg))
# the worst moment: the segment is whole under its temporary key, not yet copied into place
tier.uploader.between_upload_and_commit = lambda: os.kill(os.getpid(), signal.SIGKILL)
for i in range(150):
    store.put(Message("T", bytes([i % 251]) * 1000))
store.tier = tier; tier.start()
import time; time.sleep(60)
"""


def test_a_kill_in_the_middle_of_an_upload_leaves_no_visible_object(tmp_path: Path, s3: S3Server) -> None:
    """SIGKILL of a real process between the temporary upload and the copy into place: the
    tier holds a temporary key only, no segment and no manifest; the next start deletes
    the temporary key and uploads the segment whole."""
    bucket = s3.new_bucket()
    data = tmp_path / "d"
    script = CRASHER.format(tests=str(REPO / "tests"), data=str(data), endpoint=s3.endpoint, bucket=bucket)
    p = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=aws_env(), timeout=60, capture_output=True)
    assert p.returncode == -signal.SIGKILL, p.stderr.decode()[-2000:]
    keys = s3.keys(bucket)
    assert keys and all("/tmp/" in k for k in keys), keys  # nothing but the unfinished upload
    store, tier = open_tiered(tier_config(data, s3, bucket))
    try:
        assert not manifests(s3, bucket, store.store_id)
        wait_for(lambda: tier.backlog() == (0, 0))
        assert not [k for k in s3.keys(bucket) if "/tmp/" in k]
        got = manifests(s3, bucket, store.store_id)
        for mf in store.commitlog.files.files[:-1]:
            assert parts(s3, bucket, store.store_id, got[mf.base])["segment"] == mf.path.read_bytes()
    finally:
        close_tiered(store, tier)


def test_an_upload_failing_before_its_copy_is_retried_and_leaves_no_partial_object(
    tmp_path: Path, s3: S3Server
) -> None:
    bucket = s3.new_bucket()
    cfg = tier_config(tmp_path / "d", s3, bucket)
    store, tier = open_tiered(cfg, via_temporary_key(cfg))
    seen: list[list[str]] = []

    def fail_once() -> None:
        seen.append(s3.keys(bucket))
        if len(seen) == 1:
            from botocore.exceptions import EndpointConnectionError

            raise EndpointConnectionError(endpoint_url=s3.endpoint)

    tier.uploader.between_upload_and_commit = fail_once
    try:
        fill(store, 100)
        wait_for(lambda: tier.backlog() == (0, 0))
        assert all("/tmp/" in k for k in seen[0])  # at the failure only the temporary key existed
        assert tier.uploader.uploaded == len(store.commitlog.files.files) - 1
        assert not [k for k in s3.keys(bucket) if "/tmp/" in k]
    finally:
        close_tiered(store, tier)


def test_tier_knobs_are_settings(tmp_path: Path) -> None:
    from unimq.settings import load_settings

    s = load_settings(overrides={"tier_enabled": True, "tier_bucket": "b", "tier_endpoint": "http://127.0.0.1:1"})
    assert s.store.tier_enabled and s.store.tier_bucket == "b"
    with pytest.raises(ValueError, match="tier_bucket"):
        load_settings(overrides={"tier_enabled": True})
    with pytest.raises(ValueError, match="tier_retention_hours"):
        load_settings(overrides={"tier_retention_hours": 1.0})  # shorter than local retention (72 h)


def test_the_broker_runs_the_tier_when_it_is_on(tmp_path: Path, s3: S3Server) -> None:
    """`tier_enabled` is all it takes: the broker attaches the tier at start, stops it first at stop."""
    import asyncio

    from core_broker.broker_controller import BrokerController
    from core_broker.config import BrokerConfig

    bucket = s3.new_bucket()

    async def main() -> None:
        bc = BrokerController(tier_config(tmp_path / "d", s3, bucket), BrokerConfig())
        await bc.start()
        tier = bc.store.tier
        assert tier is not None
        await asyncio.to_thread(fill, bc.store, 200)
        await asyncio.to_thread(wait_for, lambda: tier.backlog() == (0, 0))
        sealed = [mf.base for mf in bc.store.commitlog.files.files[:-1]]
        stats = bc.store_stats()  # what the metrics read
        assert (stats["tier_backlog_segments"], stats["tier_backlog_bytes"]) == (0, 0)
        assert stats["tier_uploaded_segments"] == len(sealed)
        await bc.stop()
        assert bc.store.tier is None and tier.uploader._thread is None
        assert sorted(manifests(s3, bucket, bc.store.store_id)) == sealed

    asyncio.run(main())


def test_a_segment_over_boto3s_multipart_threshold_is_uploaded_whole(tmp_path: Path, s3: S3Server) -> None:
    """12 MiB segments: boto3 uploads them in parts, and the copy into place must still work on
    every implementation (rclone fails boto3's multipart copy, hence one CopyObject)."""
    bucket = s3.new_bucket()
    store, tier = open_tiered(tier_config(tmp_path / "d", s3, bucket, commitlog_segment_size=12 << 20))
    try:
        fill(store, 14, size=1 << 20)
        assert len(store.commitlog.files.files) == 2
        wait_for(lambda: tier.backlog() == (0, 0), timeout=60)
        mf = store.commitlog.files.files[0]
        m = manifests(s3, bucket, store.store_id)[mf.base]
        data = parts(s3, bucket, store.store_id, m)["segment"]
        assert len(data) == 12 << 20 == m.size and hashlib.sha256(data).hexdigest() == m.sha256
        assert data == mf.path.read_bytes()
    finally:
        close_tiered(store, tier)
