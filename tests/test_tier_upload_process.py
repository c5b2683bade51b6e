"""The tier's upload process (issue 17): killed, it is restarted and nothing is lost; it dies with the broker.

Uploads run in a child process (``core_broker/tier/upload_process.py``) so that boto3
stays off the broker's GIL. What must hold beyond the upload tests' guarantees: a
child SIGKILLed in the middle of an upload is a failed attempt (restarted, the
segment uploaded again whole, its temporary key swept); and the child never
outlives the broker, whether it stops or is SIGKILLed itself.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest


from tier_helpers import (  # noqa: F401 (fixtures)
    S3Server, aws_credentials, aws_env, close_tiered, fill, manifests, open_tiered, parts, s3, tier_config,
    via_temporary_key, wait_for,
)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("aws_credentials")]
REPO = Path(__file__).resolve().parent.parent


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_an_upload_process_killed_mid_upload_is_restarted_and_nothing_is_lost(tmp_path: Path, s3: S3Server) -> None:
    """SIGKILL of the child while a segment is whole under its temporary key, not yet copied into
    place, three times: each time the broker starts a new child and uploads that segment again;
    at the end every sealed segment is in the tier byte for byte and no temporary key is left."""
    bucket = s3.new_bucket()
    cfg = tier_config(tmp_path / "d", s3, bucket)
    store, tier = open_tiered(cfg, via_temporary_key(cfg))
    killed: list[int] = []

    def kill_child() -> None:
        if len(killed) < 3:
            pid = tier.uploader.process.pid
            assert pid is not None
            killed.append(pid)
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not alive(pid), timeout=10)

    tier.uploader.between_upload_and_commit = kill_child
    try:
        fill(store, 300)  # five 64 KiB segments
        wait_for(lambda: tier.backlog() == (0, 0), timeout=60)
        assert len(killed) == 3 and len(set(killed)) == 3
        assert tier.uploader.process.started == 4
        assert tier.uploader.failed_attempts >= 3
        sealed = store.commitlog.files.files[:-1]
        got = manifests(s3, bucket, store.store_id)
        assert sorted(got) == [mf.base for mf in sealed]
        for mf in sealed:
            data = parts(s3, bucket, store.store_id, got[mf.base])["segment"]
            assert data == mf.path.read_bytes() and hashlib.sha256(data).hexdigest() == got[mf.base].sha256
        assert not [k for k in s3.keys(bucket) if "/tmp/" in k]
        child = tier.uploader.process.pid
        assert child is not None
    finally:
        close_tiered(store, tier)
    assert not alive(child)  # a clean stop takes the child with it


BROKER = """
import sys, time
sys.path.insert(0, {tests!r})
from pathlib import Path
from core_broker.message_store import MessageStore
from core_broker.model import Message
from core_broker.tier import TierService
from tier_helpers import tier_config
cfg = tier_config(Path({data!r}), type("S", (), {{"endpoint": {endpoint!r}}})(), {bucket!r})
store = MessageStore(cfg); store.start()
store.tier = tier = TierService(store); tier.start()
while tier.uploader.process.pid is None:
    store.put(Message("T", b"x" * 1000))
print(tier.uploader.process.pid, flush=True)
while True:  # uploads keep running until the kill
    store.put(Message("T", b"y" * 1000)); time.sleep(0.001)
"""


def test_the_upload_process_dies_with_a_killed_broker(tmp_path: Path, s3: S3Server) -> None:
    bucket = s3.new_bucket()
    script = BROKER.format(tests=str(REPO / "tests"), data=str(tmp_path / "d"), endpoint=s3.endpoint, bucket=bucket)
    broker = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=aws_env(), stdout=subprocess.PIPE)
    try:
        assert broker.stdout is not None
        child = int(broker.stdout.readline())
        assert alive(child)
    finally:
        broker.kill()
        broker.wait(timeout=30)
    wait_for(lambda: not alive(child), timeout=10)  # no orphan


@pytest.mark.parametrize("nice", [7, 0])
def test_the_upload_process_runs_as_background_work(tmp_path: Path, s3: S3Server, nice: int) -> None:
    """``tier_upload_nice``: the child runs that much nicer than the broker, under SCHED_BATCH (a
    wakeup of it does not preempt the put thread), and uploads all the same; 0: as the broker."""
    bucket = s3.new_bucket()
    store, tier = open_tiered(tier_config(tmp_path / "d", s3, bucket, tier_upload_nice=nice))
    try:
        fill(store, 200)
        wait_for(lambda: tier.backlog() == (0, 0), timeout=60)
        assert sorted(manifests(s3, bucket, store.store_id)) == [mf.base for mf in store.commitlog.files.files[:-1]]
        child = tier.uploader.process.pid
        assert child is not None
        assert os.getpriority(os.PRIO_PROCESS, child) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)
        assert os.sched_getscheduler(child) == (os.SCHED_BATCH if nice else os.sched_getscheduler(0))
    finally:
        close_tiered(store, tier)
