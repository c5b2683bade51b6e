"""Small JSON state files: atomic replacement, and what reading a missing or broken file gives.

A "crash" mid-write is simulated by what it leaves on disk: the writer's temp file,
half written, next to the real file (the rename never happened).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from core_broker.json_file import read_json, write_json_atomic

pytestmark = pytest.mark.timeout(30)


def test_written_data_reads_back_and_parent_folders_are_made(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "state.json"
    data = {"z": [1, 2, {"x": None}], "a": "ünïcode", "n": 2**40}
    write_json_atomic(path, data)
    assert read_json(path, None) == data
    assert list(path.parent.iterdir()) == [path]  # the temp file was renamed, not left behind


def test_the_file_is_compact_and_key_sorted(tmp_path: Path) -> None:
    """Stable bytes for the same state (diffable, and a rewrite of equal state is identical)."""
    path = tmp_path / "s.json"
    write_json_atomic(path, {"b": 1, "a": {"d": 2, "c": 3}})
    assert path.read_bytes() == b'{"a":{"c":3,"d":2},"b":1}'


def test_a_rewrite_replaces_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write_json_atomic(path, {"long": "x" * 1000})
    write_json_atomic(path, {"short": 1})
    assert read_json(path, None) == {"short": 1}


def test_a_missing_file_gives_the_default(tmp_path: Path) -> None:
    default = {"entries": []}
    assert read_json(tmp_path / "nope.json", default) is default


@pytest.mark.parametrize("content", [b"", b'{"offsets": {"g": 1', b"\xff\xfe not json", b"{'single': 'quotes'}"])
def test_an_unparseable_file_is_reported_with_its_path_not_replaced_by_the_default(
    tmp_path: Path, content: bytes
) -> None:
    """The module's rule: a torn write cannot happen (rename), so a broken file was edited by
    hand; silently starting from the default would lose state (consumer offsets, epochs)."""
    path = tmp_path / "consumer_offsets.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="consumer_offsets.json"):
        read_json(path, {})
    assert path.read_bytes() == content  # left as it was, for the operator


def test_a_writer_that_crashed_before_the_rename_leaves_the_old_state_readable(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    write_json_atomic(path, {"safe": 100})
    # what a writer killed mid-write leaves: its temp file, half written
    (tmp_path / f".checkpoint.{os.getpid()}.999.tmp").write_bytes(b'{"safe":2')
    assert read_json(path, None) == {"safe": 100}
    write_json_atomic(path, {"safe": 200})  # the next writer is not disturbed by the leftover
    assert read_json(path, None) == {"safe": 200}


def test_data_that_cannot_be_encoded_leaves_the_old_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write_json_atomic(path, {"v": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"v": object()})
    assert read_json(path, None) == {"v": 1}
    assert list(tmp_path.iterdir()) == [path]


def test_a_write_failing_on_the_disk_leaves_the_old_file_whole(tmp_path: Path, monkeypatch) -> None:
    """fsync fails (EIO) before the rename: readers keep seeing the previous state, entire."""
    path = tmp_path / "topics.json"
    write_json_atomic(path, {"topics": ["a", "b"]})

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "EIO")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        write_json_atomic(path, {"topics": ["a", "b", "c"] * 1000})
    monkeypatch.undo()
    assert read_json(path, None) == {"topics": ["a", "b"]}


def test_concurrent_writers_never_leave_a_torn_or_foreign_file(tmp_path: Path) -> None:
    """Threads saving the same state each use their own temp name: the result is always one
    writer's complete document."""
    path = tmp_path / "topics.json"
    errors: list[BaseException] = []
    written = {f"w{t}-{i}" for t in range(4) for i in range(25)}

    def writer(t: int) -> None:
        try:
            for i in range(25):
                write_json_atomic(path, {"who": f"w{t}-{i}", "pad": "p" * (t * 300)})
                doc = read_json(path, None)
                assert doc["who"] in written and doc["pad"] == "p" * (int(doc["who"][1]) * 300)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert not errors, errors[0]
    assert json.loads(path.read_bytes())["who"] in written
    assert list(tmp_path.iterdir()) == [path]
