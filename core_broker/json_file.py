"""Small JSON state files written atomically (temp file, fsync, rename).

Used for topic configuration, consumer offsets and the checkpoint: state that
is tiny, changes rarely compared with messages, and must never be seen half
written after a crash.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # a temp name per writer thread: two threads saving the same state must not share it
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, raw)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_json(path: Path, default: Any) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return default
    except ValueError:
        # A torn write is impossible with the rename protocol; an edited-by-hand file
        # that no longer parses is reported rather than silently replaced.
        raise ValueError(f"state file {path} is not valid JSON") from None
