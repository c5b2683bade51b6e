"""SIGKILL while the tier uploads, again and again (issue 17): nothing partial is ever readable.

A real writer process (tests/tier_writer.py) puts messages with the tier on while
small segments roll and upload; the test kills it with SIGKILL at random moments,
and after every kill checks the bucket the way a reader would see it: every
manifest names complete objects (size and SHA-256 of the segment as on disk, the
index's length), nothing else is reachable. At the end the store is opened again,
the backlog drains, local retention deletes everything it may, and every
acknowledged message is read back, through the tier, byte for byte.
"""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core_broker.model import GetStatus

from tier_helpers import (  # noqa: F401 (fixtures)
    S3Server, aws_credentials, aws_env, close_tiered, manifests, open_tiered, parts, s3, wait_for,
)
from tier_writer import TOPIC, body, config

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("aws_credentials")]
REPO = Path(__file__).resolve().parent.parent
ROUNDS = 4  # each round a fresh writer process killed at a random moment (6 before: a third more time)


def check_bucket(s3: S3Server, bucket: str, store_id: str) -> int:
    """Every manifest's objects are whole; returns how many segments the tier holds."""
    got = manifests(s3, bucket, store_id)
    for base, m in got.items():
        got_parts = parts(s3, bucket, store_id, m)  # each part as long as the manifest says
        assert hashlib.sha256(got_parts["segment"]).hexdigest() == m.sha256, base
    return len(got)


def test_repeated_kills_during_uploads_leave_only_whole_segments(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    data = tmp_path / "d"
    rng = random.Random(17)
    acked: set[int] = set()
    seq = 0
    in_tier = 0
    for _ in range(ROUNDS):
        p = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "tier_writer.py"), str(data), s3.endpoint, bucket, str(seq)],
            cwd=REPO, env=aws_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        try:
            assert p.stdout is not None
            assert p.stdout.readline() == b"READY\n", p.stderr.read() if p.stderr else b""
            time.sleep(rng.uniform(0.3, 1.2))
        finally:
            p.kill()  # SIGKILL
            out, _ = p.communicate(timeout=30)
        lines = out.split(b"\n")
        for line in lines[:-1]:  # the last piece may be a line cut by the kill
            if line.startswith(b"ACK "):
                acked.add(int(line[4:]))
        seq = max(acked) + 1 if acked else seq
        store_id = (data / "store_id").read_text().strip()
        n = check_bucket(s3, bucket, store_id)
        assert n >= in_tier  # confirmed uploads never go away
        in_tier = n
    assert len(acked) > 500 and in_tier > 0
    store, tier = open_tiered(config(data, s3.endpoint, bucket))
    try:
        wait_for(lambda: tier.backlog() == (0, 0), timeout=60)
        assert not [k for k in s3.keys(bucket) if "/tmp/" in k]
        check_bucket(s3, bucket, store.store_id)
        store.run_retention(now=time.time() + 10 * 3600)
        assert len(store.commitlog.files.files) == 1
        seen: dict[int, bytes] = {}
        for qid in (0, 1):
            off = 0
            while True:
                r = store.get(TOPIC, qid, off, 64)
                if r.status == GetStatus.OFFSET_MOVED:
                    r = tier.reader.get(TOPIC, qid, off, 64) or r
                if r.status not in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
                    break
                for m in r.messages:  # a put done but not acknowledged before a kill is written again
                    s = int(m.keys[0][1:])
                    assert s % 2 == qid
                    seen[s] = bytes(m.body)
                off = r.next_offset
        assert acked <= seen.keys()  # every acknowledged message, and unacknowledged ones may be there too
        for s, b in seen.items():
            assert b == body(s)
    finally:
        close_tiered(store, tier)
