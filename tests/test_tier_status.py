"""`unimq tier status` (issue 17): uploaded, pending, oldest readable offset per queue.

Run as a user would, `python -m unimq tier status`, against a real S3-compatible
server (moto) on 127.0.0.1 and a store's data directory, with no broker running.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core_broker.message_store import MessageStore

from tier_helpers import (  # noqa: F401 (fixtures)
    S3Server, aws_credentials, aws_env, close_tiered, fill, open_tiered, s3, tier_config, wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("aws_credentials")]
REPO = Path(__file__).resolve().parent.parent


def status(data: Path, s3: S3Server, bucket: str, *extra: str) -> subprocess.CompletedProcess:
    sets = [f"store.tier_bucket={bucket}", f"store.tier_endpoint={s3.endpoint}", "store.tier_prefix=t",
            "store.tier_region=us-east-1"]
    cmd = [sys.executable, "-m", "unimq", "tier", "status", "--data-dir", str(data)]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd + list(extra), cwd=REPO, env=aws_env(), capture_output=True, text=True, timeout=60)


def test_tier_status_reports_uploaded_pending_and_oldest_offsets(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    data = tmp_path / "d"
    cfg = tier_config(data, s3, bucket, retention_hours=1.0)
    store, tier = open_tiered(cfg)
    fill(store, 300)
    wait_for(lambda: tier.backlog() == (0, 0))
    uploaded = len(store.commitlog.files.files) - 1
    removed = store.run_retention(now=time.time() + 10 * 3600)
    assert removed == uploaded
    close_tiered(store, tier)
    plain = MessageStore(tier_config(data, s3, bucket, tier_enabled=False))  # the tier off: writes pile up
    plain.start()
    fill(plain, 200)
    pending = len(plain.commitlog.files.files) - 1
    plain.shutdown()

    p = status(data, s3, bucket, "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["uploaded_segments"] == uploaded and r["tier_first_offset"] == 0
    assert r["pending_segments"] == pending >= 2 and r["pending_bytes"] == pending * cfg.commitlog_segment_size
    (q,) = r["queues"]
    assert (q["topic"], q["queue"], q["oldest_readable"], q["oldest_in_tier"]) == ("T", 0, 0, 0)
    assert q["oldest_local"] > 0  # retention moved the local start: the tier is what keeps offset 0

    p = status(data, s3, bucket)
    assert p.returncode == 0 and f"uploaded: {uploaded} segment(s)" in p.stdout and "T 0: 0 (0 / " in p.stdout
    s3.stop()
    p = status(data, s3, bucket)
    assert p.returncode == 1 and "cannot read the tier" in p.stderr
    p = subprocess.run([sys.executable, "-m", "unimq", "tier", "status", "--data-dir", str(data)],
                       cwd=REPO, env=aws_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "tier_bucket" in p.stderr
