"""The upload worker: every sealed, checkpointed segment goes to the tier, oldest first.

Why a thread of its own, and why it never touches the write path: the object
store may be down, slow or far away, and none of that may stop a put. The worker
only reads segment files the writer is done with (sealed: a later segment exists,
and the checkpoint covers the whole segment, so its queue entries are on disk
too), and keeps the list of confirmed uploads that local retention asks before it
deletes a segment. A failed upload is retried with exponential back-off (with
jitter, capped at ``tier_retry_max_s``); meanwhile the backlog grows and is what
:meth:`Uploader.backlog` reports. After a restart the confirmed set is read back
from the tier's manifests (until that listing succeeds, nothing counts as
uploaded and retention waits), and temporary keys a crash left are deleted.

The thread decides and keeps the books; the bytes go up from a child process
(``upload_process``: boto3 on a thread fought the put path for the GIL). Per
segment the thread copies its queue entries and keys (``segment_index``,
``key_index``) and hands them with the file's path to the child, which uploads
segment, index, keys, then the manifest. A child that dies is a failed attempt:
back off, delete the temporary keys it may have left, start a new one, retry.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Callable

from ..json_file import read_json
from ..mapped_file import MappedFile
from . import key_index, layout
from .object_store import ObjectStore
from .segment_index import build_index
from .upload_process import ChildGone, UploadFailed, UploadProcess

if TYPE_CHECKING:
    from ..message_store import MessageStore

log = logging.getLogger("unimq.tier")

RETRY_BASE_S = 0.2


class Uploader:
    """Uploads sealed segments on one worker thread; knows which are confirmed."""

    def __init__(
        self,
        store: "MessageStore",
        objects: ObjectStore,
        scan_interval_s: float,
        retry_max_s: float,
        idle: Callable[[], None] | None = None,
        upload_nice: int = 0,
    ) -> None:
        self.store = store
        self.objects = objects
        self.scan_interval_s = scan_interval_s
        self.retry_max_s = retry_max_s
        self.idle = idle  # called on the worker when there is nothing to upload (tier retention)
        self._lock = threading.Lock()
        # Segment base -> manifest of every segment in the tier: the confirmed uploads (and,
        # for the reader, where each queue's offsets are).
        self.in_tier: dict[int, layout.Manifest] = {}
        self.version = 0  # grows whenever in_tier changes (readers cache what they derive from it)
        # Segments tier retention removed: still confirmed (never uploaded again), no longer readable.
        self.expired: set[int] = set()
        self.listed = False  # the tier's manifests were read since start
        self._listed = threading.Event()
        self.uploaded = 0  # segments uploaded by this process
        self.failures = 0  # consecutive failed attempts
        self.failed_attempts = 0  # failed attempts since start (the metric; ``failures`` resets)
        self.last_error = ""
        # Tests: called between the temporary upload of a segment and its copy into place.
        self.between_upload_and_commit: Callable[[], None] | None = None
        self.upload_nice = upload_nice  # the upload process's niceness (``tier_upload_nice``)
        self.process = UploadProcess(objects.settings, upload_nice)
        # what a failed attempt raises: the store down or refusing, or the upload process gone
        self._retry_on: tuple[type[BaseException], ...] = (ChildGone, UploadFailed, *objects.errors)
        self._sweep = False  # a child died mid-upload: its temporary keys go before the next attempt
        self._process_ready = threading.Event()  # the upload process answered once since start
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._stop.clear()
        self.process = UploadProcess(self.objects.settings, self.upload_nice)
        self._process_ready.clear()
        self._thread = threading.Thread(target=self._run, name="unimq-tier-upload", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._listed.set()  # reads waiting for the listing answer now, with what is known
        self._wake.set()
        self.process.kill()  # an upload in flight ends now (safe: its manifest is not written)
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.process.close()

    def kick(self) -> None:
        """Look for work now rather than at the next scan (tests, and after a roll)."""
        self._wake.set()

    # ------------------------------------------------------------------ what retention and metrics read

    def manifests(self) -> list[layout.Manifest]:
        """The segments readable in the tier, oldest first."""
        with self._lock:
            return [self.in_tier[b] for b in sorted(self.in_tier)]

    def confirmed(self, base: int) -> bool:
        with self._lock:
            return base in self.in_tier or base in self.expired

    def forget(self, base: int) -> None:
        """Tier retention deleted the segment's manifest: confirmed still, readable no more."""
        with self._lock:
            self.in_tier.pop(base, None)
            self.expired.add(base)
            self.version += 1

    def sealed(self) -> list[MappedFile]:
        """Segments the writer is done with and a checkpoint covers, not confirmed yet.

        The checkpoint file is read only when some segment waits: each scan of an idle
        uploader would otherwise open and read it, and every blocking call there hands
        the GIL back and forth with the put thread."""
        waiting = self._waiting()
        if not waiting:
            return waiting
        safe = int(read_json(self.store.checkpoint_path, {}).get("safe", 0))
        return [mf for mf in waiting if mf.end <= safe]

    def backlog(self) -> tuple[int, int]:
        """(segments, bytes) sealed on local disk and not yet confirmed in the tier."""
        waiting = self._waiting()
        return len(waiting), sum(mf.size for mf in waiting)

    def _waiting(self) -> list[MappedFile]:
        """Local segments before the active one not confirmed in the tier (a look-up per local
        segment, not a copy of every manifest's base: the tier may hold many more)."""
        files = list(self.store.commitlog.files.files)[:-1]
        with self._lock:
            return [mf for mf in files if mf.base not in self.in_tier and mf.base not in self.expired]

    # ------------------------------------------------------------------ the worker

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.process.start()  # boots while the tier is listed
                if not self.listed:
                    self.list_tier()
                elif self._sweep:
                    self.sweep_tmp()
                self.process.ready()
                self._process_ready.set()
                todo = self.sealed()
                if todo:
                    self.upload(todo[0])
                self.failures, self.last_error = 0, ""
                if len(todo) > 1:
                    continue
                if not todo and self.idle is not None:
                    self.idle()
                wait = self.scan_interval_s
            except self._retry_on as e:
                self._sweep = self._sweep or isinstance(e, ChildGone)
                if self._stop.is_set():
                    break
                self.failures += 1
                self.failed_attempts += 1
                self.last_error = f"{type(e).__name__}: {e}"
                wait = min(self.retry_max_s, RETRY_BASE_S * 2 ** min(self.failures - 1, 30))
                wait *= random.uniform(0.5, 1.0)
                log.warning("tier upload failed (attempt %d, retrying in %.1fs): %s", self.failures, wait, self.last_error)
            except Exception:  # a bug, not the network: keep the broker serving and retry later
                self.failures += 1
                self.failed_attempts += 1
                log.exception("tier upload round failed")
                wait = self.retry_max_s
            self._wake.wait(wait)
            self._wake.clear()

    def list_tier(self) -> None:
        """Read the confirmed set back from the tier; delete what a crash left in ``tmp/``.

        Every manifest is read (one GET each, a few hundred bytes): the reader and tier
        retention need their queue ranges and timestamps without a network call.
        """
        sid = self.store.store_id
        found = {}
        for name in self.objects.names(layout.manifest_dir(sid)):
            base = layout.base_of(name)
            if base is not None:
                found[base] = layout.Manifest.decode(self.objects.get(name))
        self.sweep_tmp()
        with self._lock:
            for b, m in found.items():
                self.in_tier.setdefault(b, m)
            self.version += 1
        self.listed = True
        self._listed.set()

    def sweep_tmp(self) -> None:
        """Delete the temporary keys of uploads a crash (of the broker or the upload process) cut."""
        stale = list(self.objects.names(layout.tmp_dir(self.store.store_id) + "/"))
        if stale:
            self.objects.delete(stale)
            log.info("deleted %d unfinished upload(s) a crash or a killed upload process left", len(stale))
        self._sweep = False

    def wait_process(self, timeout: float) -> bool:
        """Wait until the upload process has started and can upload, at most ``timeout`` seconds
        (tests and benchmarks that must see uploads soon after a start)."""
        return self._process_ready.wait(timeout)

    def wait_listed(self, timeout: float) -> bool:
        """Wait (a read worker) until the tier's manifests were read since start, at most ``timeout``
        seconds: a read below the local log right after a start must not take the tier for empty."""
        return self._listed.wait(timeout)

    def upload(self, mf: MappedFile) -> layout.Manifest:
        """Segment with its queue index and keys (or then those), then manifest (in the upload
        process): the manifest's arrival confirms the upload."""
        t0 = time.monotonic()
        ix = build_index(self.store, mf)
        keys = key_index.encode(self.store.index.entries_between(mf.base, mf.base + ix.length))
        manifest = layout.Manifest(
            base=mf.base, length=ix.length, size=ix.size, sha256="", index_length=len(ix.data),
            first_ts=ix.first_ts, last_ts=ix.last_ts, queues=ix.queues, keys_length=len(keys),
            inline=self.objects.in_one_put(ix.size + len(ix.data) + len(keys)),  # two requests, not four
        )
        manifest.sha256 = self.process.upload(
            self.store.store_id, mf.path, manifest, ix.data, keys, self.between_upload_and_commit
        )
        with self._lock:
            self.in_tier[mf.base] = manifest
            self.version += 1
        self.uploaded += 1
        log.info("uploaded commitlog segment %d to the tier (%d bytes in %.2fs)", mf.base, ix.size, time.monotonic() - t0)
        return manifest
