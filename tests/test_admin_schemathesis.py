"""Schemathesis against the admin API's own OpenAPI document (/v1/admin/openapi.json): no
generated request gets a 500 (bad input never crashes the console's API)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from http_helpers import start_server
from test_http_schemathesis import _schemathesis

pytestmark = pytest.mark.timeout(240)


def test_schemathesis_finds_no_server_error_in_the_admin_api(unimq_server, tmp_path: Path) -> None:
    st = _schemathesis()
    if st is None:
        pytest.skip("schemathesis is not installed (the 'test' extra)")
    server = start_server(unimq_server, tmp_path, config="\n[broker]\nmax_long_poll_ms = 1000\n")
    doc = server.url("http", "/v1/admin/openapi.json")
    import httpx

    assert httpx.get(doc).json()["servers"] == [{"url": "/v1/admin"}]  # generated requests go under the mount
    report = tmp_path / "st-report"
    # one worker: with two, schemathesis 4.32's threads hit CPython 3.11's "AST constructor
    # recursion depth mismatch" SystemError (a runtime error of the tool, every case passing)
    result = subprocess.run(
        [st, "run", doc, "--checks", "not_a_server_error", "--max-examples", "12",
         "--phases", "coverage,fuzzing,stateful", "--seed", "20261125", "--request-timeout", "20", "--workers", "1",
         "--no-shrink", "--report-dir", str(report)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=220,
    )
    tail = "\n".join(result.stdout.splitlines()[-60:])
    assert result.returncode == 0, f"schemathesis failed:\n{tail}\n{result.stderr[-2000:]}"
    assert "Traceback" not in server.stderr(), server.stderr()[-4000:]
    assert server.stop() == 0
