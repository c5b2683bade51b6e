"""Retention with the tier on (issue 17), against a real S3-compatible server (moto) on 127.0.0.1.

What must hold: local retention deletes a segment only once its upload is
confirmed (the object store down, a segment not confirmed, a restart before the
tier's manifests were read back); tier retention removes what is older than
``tier_retention_hours``, manifest first, and never makes a segment upload again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from core_broker.model import Message

from tier_helpers import (  # noqa: F401 (fixtures)
    S3Server, aws_credentials, close_tiered, fill, manifests, open_tiered, s3, tier_config, wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("aws_credentials")]


def test_local_retention_waits_for_the_upload(tmp_path: Path, s3: S3Server) -> None:
    """The object store down: puts go on, the backlog grows, retention keeps every segment;
    back up: uploads resume, and retention then deletes the uploaded segments."""
    bucket = s3.new_bucket()
    store, tier = open_tiered(tier_config(tmp_path / "d", s3, bucket, retention_hours=1.0))
    try:
        s3.stop()
        t0 = time.monotonic()
        slowest = 0.0
        for i in range(400):
            t = time.monotonic()
            store.put(Message("T", os.urandom(1000)))
            slowest = max(slowest, time.monotonic() - t)
        assert slowest < 0.5, f"a put took {slowest:.3f}s with the object store down"
        assert time.monotonic() - t0 < 10
        segments, nbytes = tier.backlog()
        assert segments >= 5 and nbytes == segments * store.config.commitlog_segment_size
        time.sleep(1.0)  # several failed attempts
        assert tier.uploader.failures >= 1 and tier.status()["last_error"]
        far = time.time() + 10 * 3600  # every segment is past local retention...
        first = store.commitlog.min_offset
        assert store.run_retention(now=far) == 0  # ...but none is in the tier
        assert store.commitlog.min_offset == first
        s3.restart()
        wait_for(lambda: tier.backlog() == (0, 0), timeout=30)
        sealed = len(store.commitlog.files.files) - 1
        assert len(manifests(s3, bucket, store.store_id)) == sealed
        assert store.run_retention(now=far) == sealed
        assert len(store.commitlog.files.files) == 1  # the active segment stays
        assert not [k for k in s3.keys(bucket) if "/tmp/" in k]
    finally:
        if not s3.running:
            s3.restart()
        close_tiered(store, tier)


def test_retention_deletes_only_up_to_the_first_segment_not_uploaded(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    store, tier = open_tiered(tier_config(tmp_path / "d", s3, bucket, retention_hours=1.0))
    try:
        fill(store, 300)
        wait_for(lambda: tier.backlog() == (0, 0))
        files = list(store.commitlog.files.files)
        tier.uploader.in_tier.pop(files[2].base)  # as if the third had not been confirmed
        assert store.run_retention(now=time.time() + 10 * 3600) == 2
        assert store.commitlog.min_offset == files[2].base
    finally:
        close_tiered(store, tier)


def test_tier_retention_deletes_expired_segments_manifest_first(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    cfg = tier_config(tmp_path / "d", s3, bucket, retention_hours=1.0, tier_retention_hours=2.0)
    store, tier = open_tiered(cfg)
    try:
        fill(store, 300)
        wait_for(lambda: tier.backlog() == (0, 0))
        n = len(manifests(s3, bucket, store.store_id))
        assert tier.run_expiry() == 0  # nothing is two hours old
        assert tier.run_expiry(now=time.time() + 3 * 3600) == n
        assert s3.keys(bucket) == []
        # expired, yet still confirmed: local retention may drop them, they are not uploaded again
        assert store.run_retention(now=time.time() + 3 * 3600) == n
        time.sleep(0.3)
        assert s3.keys(bucket) == []
    finally:
        close_tiered(store, tier)


def test_the_tier_reads_back_what_it_confirmed_after_a_restart(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    cfg = tier_config(tmp_path / "d", s3, bucket, retention_hours=1.0)
    store, tier = open_tiered(cfg)
    fill(store, 200)
    wait_for(lambda: tier.backlog() == (0, 0))
    uploaded = tier.uploader.uploaded
    close_tiered(store, tier)
    store, tier = open_tiered(cfg)
    try:
        wait_for(lambda: tier.uploader.listed)
        assert tier.uploader.uploaded == 0 and len(tier.uploader.in_tier) == uploaded
        assert store.run_retention(now=time.time() + 10 * 3600) == uploaded
    finally:
        close_tiered(store, tier)
