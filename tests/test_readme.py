"""Every command the README shows works as written (issue 14: the README cannot drift again).

How: unimq is started the documented way, `make run`, with every door on a free port (port 0
through `UNIMQ_ARGS`) and a temporary `DATA_DIR`; then every ```sh block of the README runs as
one fresh `bash -euo pipefail` from the repository's root with a PATH that has no virtualenv
on it (a newcomer's second terminal), and every ```python block runs with `.venv/bin/python`.
The only edits made to a block are the ports: a default port (8080, 1883, ...) becomes the
port the door announced. `make demo` and `make spark-demo` take their ports (and a shorter
demo) from `DEMO_ARGS` / `SPARK_ARGS`, the Makefile's documented knobs.

Blocks that are not run: ```console / ```text / ```toml (output and configuration shown, not
commands), and a block right after a line `<!-- readme-test: skip: REASON -->` (for example
the set-up block itself: this test is what `make test` runs, and `make run` is the fixture).
Lines of a run block that start a server of their own (`make run`, `unimq up`) are replaced by
the fixture's server: running a second one on the same ports is what the README tells a user
not to do.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from conftest import REPO_ROOT, TEST_STORE_SIZES

README = REPO_ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent
LISTEN = re.compile(r"^unimq: (?P<door>\S+) listening on \[?(?P<host>[^\]\s]+?)\]?:(?P<port>\d+)")
# The default port of each door, as the README writes it, and the door name its start-up line uses.
DEFAULT_PORTS = {"8080": "http", "8081": "grpc", "1883": "mqtt", "8083": "mqttws", "5672": "amqp", "9876": "nameserver"}
SKIP_MARK = re.compile(r"<!--\s*readme-test:\s*skip:\s*(?P<why>.+?)\s*-->")
SERVER_LINE = re.compile(r"^\s*(make run\b|(\.venv/bin/)?unimq up\b)")
BLOCK_TIMEOUT_S = 360


@dataclass(frozen=True)
class Block:
    lang: str
    line: int  # 1-based line of the opening fence
    text: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"README.md:{self.line}:{self.lang}"


def readme_blocks() -> list[Block]:
    """The fenced blocks of the README, each with the skip reason written before it (if any)."""
    blocks: list[Block] = []
    lines = README.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        mark = SKIP_MARK.search(prev)
        blocks.append(Block(lang, start + 1, "\n".join(lines[start + 1 : j]) + "\n", mark.group("why") if mark else None))
        i = j + 1
    return blocks


RUN_BLOCKS = [b for b in readme_blocks() if b.lang in ("sh", "python") and b.skip is None]


def test_every_runnable_block_is_sh_or_python_or_says_why_not() -> None:
    """A block in an unknown language would silently escape this test; name its kind."""
    known = {"sh", "python", "console", "text", "toml", "json", ""}
    odd = [b.id for b in readme_blocks() if b.lang not in known]
    assert not odd, f"README blocks of a kind this test does not know: {odd}"
    unlabelled = [b.id for b in readme_blocks() if b.lang == ""]
    assert not unlabelled, f"label these README blocks (sh, python, console, text, toml): {unlabelled}"


@dataclass
class Running:
    proc: subprocess.Popen[str]
    ports: dict[str, int]
    data_dir: Path


def _fresh_env() -> dict[str, str]:
    """A newcomer's shell: the machine's PATH without any virtualenv on it."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != VENV_BIN.resolve()]
    env["PATH"] = os.pathsep.join(path)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="module")
def make_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """`make run` with every door on port 0, as the README's first block tells a user to run it."""
    data_dir = tmp_path_factory.mktemp("readme-data")
    args = ["--http-port 0", "--grpc-port 0", "--mqtt-port 0", "--amqp-port 0", "--namesrv-port 0"]
    args += [f"--set={k}={v}" for k, v in TEST_STORE_SIZES.items()]
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "run", f"DATA_DIR={data_dir}", f"UNIMQ_ARGS={' '.join(args)}"],
        cwd=REPO_ROOT, env=_fresh_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    ports: dict[str, int] = {}
    seen: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line.rstrip())
            m = LISTEN.match(line)
            if m:
                ports[m.group("door")] = int(m.group("port"))
            if line.startswith("unimq: ready"):
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(180):
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("`make run` did not print 'unimq: ready' in 180 s:\n" + "\n".join(seen[-40:]))
    try:
        yield Running(proc, ports, data_dir)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _with_ports(text: str, ports: dict[str, int]) -> str:
    """Point a block at the fixture's doors: each default port number becomes the announced one."""

    def swap(m: re.Match[str]) -> str:
        door = DEFAULT_PORTS[m.group(0)]
        return str(ports[door]) if door in ports else m.group(0)

    return re.sub(r"(?<![\d.])(" + "|".join(DEFAULT_PORTS) + r")(?!\d)", swap, text)


def _sh_script(text: str) -> str:
    out = []
    for line in text.splitlines():
        out.append(": fixture runs this server already" if SERVER_LINE.match(line) else line)
    return "\n".join(out) + "\n"


def _run(cmd: list[str], env: dict[str, str], cwd: Path, out_path: Path) -> subprocess.CompletedProcess[str]:
    """Run one block in its own session; whatever it left in the background is killed after it.

    Output goes to a file, not a pipe: a block may leave a process in the background (a
    subscriber started with `&`) that would hold a pipe open after the block itself ended.
    """
    with out_path.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            rc = proc.wait(timeout=BLOCK_TIMEOUT_S)
            note = ""
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            note = f"\n[timed out after {BLOCK_TIMEOUT_S} s]"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    return subprocess.CompletedProcess(cmd, rc, out_path.read_text() + note)


@pytest.mark.timeout(BLOCK_TIMEOUT_S + 200)
@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[b.id for b in RUN_BLOCKS])
def test_readme_block_runs_as_written(block: Block, make_run: Running, tmp_path: Path) -> None:
    env = _fresh_env()
    p = make_run.ports
    env["DEMO_ARGS"] = f"--seconds 3 --http-port {p['http']} --mqtt-port {p['mqtt']} --amqp-port {p['amqp']}"
    env["SPARK_ARGS"] = f"--endpoint http://127.0.0.1:{p['http']} --topics factory,events,orders --available-now"
    text = _with_ports(block.text, make_run.ports)
    if block.lang == "sh":
        # A scratch copy of any file a block reads by a relative name would hide a missing file;
        # blocks run from the repository's root, exactly where a user pastes them.
        res = _run(["bash", "-euo", "pipefail", "-c", _sh_script(text)], env, REPO_ROOT, tmp_path / "out.txt")
    else:
        script = tmp_path / "block.py"
        script.write_text(text)
        res = _run([str(REPO_ROOT / ".venv/bin/python"), str(script)], env, REPO_ROOT, tmp_path / "out.txt")
    assert make_run.proc.poll() is None, f"unimq exited while {block.id} ran:\n{res.stdout[-3000:]}"
    assert res.returncode == 0, f"{block.id} failed (exit {res.returncode}):\n{text}\n--- output ---\n{res.stdout[-4000:]}"
