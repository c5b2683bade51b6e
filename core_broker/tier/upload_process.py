"""The upload process: sealed segments go to the object store from a child process, off the broker's GIL.

Why a process and not a thread: an upload is mostly waiting on a socket, but in
Python every socket call of boto3 ends by taking the GIL back, and beside a busy
put path it waits up to the 5 ms switch interval each time; botocore's own work
(signing, parsing, 12-19 ms of CPU per 1 MiB segment) holds the GIL the puts need.
Measured: puts with uploads on a thread ran at 0.48x-1.39x (0.82x last) of puts
without (bench/RESULTS.md, tier). A child has its own interpreter and GIL: the
broker's upload thread now only copies the segment's queue entries and keys (small,
``segment_index``) and then waits on a pipe with the GIL released.

What crosses the pipe: no segment bytes. The segment is a sealed, immutable file on
local disk, so the child opens it by path, hashes it (the manifest's SHA-256) and
uploads it itself, with the index and keys objects' bytes after it in the same object
when the manifest says ``inline`` (``layout``). The broker sends one job per segment: a JSON line (store id, base,
path, size, the manifest without its digest, the byte lengths of the two sidecars)
followed by the index and keys objects' bytes; the child answers one JSON line,
``{"ok": true, "sha256": ...}`` or ``{"ok": false, "error": ...}``. The order of
writes in the child is the tier's rule (``layout``): segment (whole on arrival, or by
a temporary key and a copy; with its index and keys, or then index, keys), manifest last; so whatever happens to
either process, nothing counts as uploaded before its manifest exists.

Lifetime: the child is started by the broker's upload thread on its first job and
again after it died (a killed child is a failed attempt: the upload thread backs off,
sweeps the temporary keys it may have left, and retries the same segment). It dies
with the broker: ``PR_SET_PDEATHSIG`` (SIGKILL when the thread that started it ends,
i.e. the upload thread or the whole broker), and end of file on its stdin between
jobs or while it waits for the broker. Its stderr is the broker's (its log lines);
its stdout is only the answer pipe.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import IO, Callable

from . import layout
from .object_store import ObjectStore, ObjectStoreSettings

log = logging.getLogger("unimq.tier")

_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding ``core_broker``
_PR_SET_PDEATHSIG = 1
_CHUNK = 1 << 20


class ChildGone(Exception):
    """The upload process died (killed, crashed) or was stopped: the attempt is lost, retry it."""


class UploadFailed(Exception):
    """The upload process answered that the attempt failed (the object store refused or was down)."""


class _Aborted(Exception):
    """The broker said not to go on with the attempt (a test's hook raised)."""


class UploadProcess:
    """The broker's end: starts the child when needed, hands it one segment at a time.

    Used by one thread (the upload thread); :meth:`kill` may be called from another.
    """

    def __init__(self, settings: ObjectStoreSettings, nice: int = 0) -> None:
        self.settings = settings
        self.nice = nice  # the child's niceness (``_lower_priority``)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False
        self._booting = False  # the running child's "ready" is not read yet (only the upload thread reads)
        self.started = 0  # children started since this object was made (restarts: started - 1)

    @property
    def pid(self) -> int | None:
        """The running child's process id (None before the first job or after a stop)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _spawn(self) -> subprocess.Popen[bytes]:
        """The running child, or a new one (booting: its first answer, "ready", not read yet)."""
        with self._lock:
            if self._closed:
                raise ChildGone("the upload process is stopped")
            if self._proc is not None and self._proc.poll() is None:
                return self._proc
            if self._proc is not None:
                _release(self._proc)
            code = f"import sys; sys.path.insert(0, {_ROOT!r}); from core_broker.tier.upload_process import main; main()"
            proc = subprocess.Popen(
                [sys.executable, "-c", code, str(os.getpid()), str(self.nice)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )
            self._proc = proc
            self._booting = True
            self.started += 1
        if self.started > 1:
            log.warning("restarted the tier's upload process (pid %d, start %d)", proc.pid, self.started)
        try:
            _send(proc, json.dumps(asdict(self.settings)).encode() + b"\n")
        except OSError as e:
            proc.kill()
            raise ChildGone(f"the upload process {proc.pid} failed at start: {type(e).__name__}: {e}") from e
        return proc

    def start(self) -> None:
        """Start the child unless it runs, without waiting for it: it boots (imports boto3, makes
        its client: about 1 s of CPU) while the upload thread lists the tier."""
        self._spawn()

    def ready(self) -> subprocess.Popen[bytes]:
        """The child, once it can upload (waits for a booting one's "ready"). One that died
        since :meth:`start` looked is found by its pipe (a failed attempt, retried)."""
        proc = self._proc if self._proc is not None and self._proc.returncode is None else self._spawn()
        if self._booting:
            try:
                _read(proc)
            except (OSError, ValueError) as e:
                proc.kill()
                raise ChildGone(f"the upload process {proc.pid} failed at start: {e}") from e
            self._booting = False
        return proc

    def upload(
        self, store_id: str, path: Path, manifest: layout.Manifest, index: bytes, keys: bytes,
        between: Callable[[], None] | None = None,
    ) -> str:
        """Have the child upload the segment at ``path`` with its index and keys objects, then
        ``manifest`` (its digest filled in); return the segment's SHA-256 once the manifest is in
        the tier. ``between`` (tests) runs here while the child waits between the temporary
        upload and the copy into place. Raises :class:`UploadFailed` or :class:`ChildGone`."""
        proc = self.ready()
        job = {
            "store_id": store_id, "base": manifest.base, "path": str(path), "size": manifest.size,
            "manifest": vars(manifest), "index_length": len(index), "keys_length": len(keys),
            "pause": between is not None,
        }
        hook_error: BaseException | None = None
        try:
            _send(proc, json.dumps(job).encode() + b"\n" + index + keys)
            while True:
                answer = _read(proc)
                if "between" not in answer:
                    break
                assert between is not None
                try:
                    between()
                except Exception as e:  # the attempt fails as the hook says; the child drops it
                    hook_error = e
                _send(proc, b'{"go": %s}\n' % (b"false" if hook_error else b"true"))
        except (OSError, ValueError) as e:  # a broken pipe, a pipe closed by kill(), a garbled answer
            proc.kill()  # whatever state it is in, the next attempt starts a new one
            raise ChildGone(f"the upload process {proc.pid} is gone: {type(e).__name__}: {e}") from e
        if hook_error is not None:
            raise hook_error
        if not answer["ok"]:
            raise UploadFailed(answer["error"])
        return str(answer["sha256"])

    def kill(self) -> None:
        """Stop for good: SIGKILL the child (safe at any moment: manifests are written last) and
        start none again. An upload waiting on it raises :class:`ChildGone`."""
        with self._lock:
            self._closed = True
            proc = self._proc
        if proc is not None:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """After :meth:`kill`, once no thread uses the child any more: close its pipes."""
        self.kill()
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            _release(proc)


def _send(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    proc.stdin.write(data)
    proc.stdin.flush()


def _read(proc: subprocess.Popen[bytes]) -> dict:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks with the GIL released
    if not line:
        raise ChildGone(f"the upload process {proc.pid} exited (status {proc.wait()})")
    return json.loads(line)


def _release(proc: subprocess.Popen[bytes]) -> None:
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
    proc.wait()


# ---------------------------------------------------------------------------- the child


def _die_with(parent: int) -> None:
    """SIGKILL this process when the thread that started it ends (Linux); gone already: exit."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: end of file on stdin still ends it
        pass
    if os.getppid() != parent:
        os._exit(0)


def _lower_priority(nice: int) -> None:
    """Make this process background work: SCHED_BATCH (a wakeup of it, e.g. an S3 answer, does
    not preempt a running thread) and ``nice`` (its share of a core against the broker's put
    thread: weight 110 to 1024 at nice 10). On 2 cores the child's CPU per segment (botocore)
    and the object store's, if local, competed with the put thread as equals; so puts ran at
    0.87x with uploads (bench/RESULTS.md, tier). Lowering is always allowed, raising is not:
    the child cannot undo it, and nothing in it needs to be prompt (the backlog metric shows
    when uploads fall behind)."""
    if nice <= 0:
        return
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (OSError, AttributeError):  # not Linux
        pass
    os.nice(nice)


def _exact(inp: IO[bytes], n: int) -> bytes:
    data = inp.read(n) if n else b""
    if len(data) != n:
        os._exit(0)  # the broker is gone mid-job: nothing more to do
    return data


def _answer(out: IO[bytes], answer: dict) -> None:
    out.write(json.dumps(answer).encode() + b"\n")
    out.flush()


def _upload(objects: ObjectStore, job: dict, index: bytes, keys: bytes, inp: IO[bytes], out: IO[bytes]) -> str:
    sid, base = job["store_id"], job["base"]

    def pause() -> None:  # tests: the broker decides between the temporary upload and the copy
        _answer(out, {"between": True})
        line = inp.readline()
        if not line:
            os._exit(0)  # the broker died here: leave the temporary key as a kill would
        if not json.loads(line)["go"]:
            raise _Aborted("the broker aborted the attempt")

    manifest = layout.Manifest(**job["manifest"])
    key, tmp, between = layout.segment_key(sid, base), layout.tmp_dir(sid), pause if job["pause"] else None
    digest = hashlib.sha256()
    with open(job["path"], "rb", buffering=0) as fh:
        if manifest.inline:  # one object: the segment's bytes, then its index and keys (``layout``)
            size = job["size"]
            body = _read_into(fh, size, len(index) + len(keys))  # one copy of the segment: file to body
            with memoryview(body) as view:
                digest.update(view[:size])
            manifest.sha256 = digest.hexdigest()  # of the segment's bytes; then of the whole object
            body[size:] = index + keys
            digest.update(index)
            digest.update(keys)
            objects.put_complete(key, body, len(body), tmp, digest.digest(), between)
        else:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
            fh.seek(0)
            objects.put_complete(key, fh, job["size"], tmp, digest.digest(), between)
            manifest.sha256 = digest.hexdigest()
    if not manifest.inline:
        objects.put_small(layout.index_key(sid, base), index)
        if keys:
            objects.put_small(layout.keys_key(sid, base), keys)
    objects.put_small(layout.manifest_key(sid, base), manifest.encode())
    return manifest.sha256


def _read_into(fh: IO[bytes], size: int, spare: int) -> bytearray:
    """The first ``size`` bytes of the file, read straight into a bytearray ``spare`` bytes longer
    (the object's body: ``ObjectStore.put_complete`` sends a bytearray in one write)."""
    body = bytearray(size + spare)
    with memoryview(body) as view:
        got = 0
        while got < size:
            n = fh.readinto(view[got:size])
            if not n:
                raise OSError(f"{fh.name}: {size} bytes expected, {got} read")
            got += n
    return body


def main() -> None:
    """The child: ``python -c ... PARENT_PID NICE``; settings on the first line of stdin, then jobs."""
    _die_with(int(sys.argv[1]))
    _lower_priority(int(sys.argv[2]))  # before the imports of boto3 (about 1 s of CPU)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the broker's terminal is the broker's to act on
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print must not corrupt the answer pipe
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s upload process: %(message)s")
    inp = sys.stdin.buffer
    first = inp.readline()
    if not first:
        return
    objects = ObjectStore(**json.loads(first))
    _answer(out, {"ready": True})
    while True:
        line = inp.readline()
        if not line:
            return  # the broker closed the pipe or died
        job = json.loads(line)
        index = _exact(inp, job["index_length"])
        keys = _exact(inp, job["keys_length"])
        try:
            answer = {"ok": True, "sha256": _upload(objects, job, index, keys, inp, out)}
        except _Aborted as e:
            answer = {"ok": False, "error": str(e)}
        except objects.errors as e:
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        except Exception as e:  # a bug: say so, keep serving
            log.exception("upload of segment %d failed", job["base"])
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        _answer(out, answer)
