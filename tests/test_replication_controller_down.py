"""With the controller down, a replicated group's master keeps serving reads and writes (issue 16).

The controller is needed only to change masters: its process is stopped (SIGKILL), and for
longer than the election lease the master keeps acknowledging puts (two members still
acknowledge: the replica keeps copying) and serving reads; when the controller comes back
nothing has changed hands.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.test_replication import Group, http, post, read_all
from unimq.local_cluster import start_proc


@pytest.mark.timeout(180)
def test_master_keeps_serving_while_the_controller_is_down(tmp_path: Path) -> None:
    g = Group(tmp_path)
    try:
        st = asyncio.run(g.wait_state(lambda s: s.master_id is not None and len(s.in_sync) == 3, "all in sync"))
        for i in range(20):
            assert post(g, "calm", f"before {i}".encode()) == 200
        ctl_args = g.controller.args
        g.controller.kill9()
        t_end = time.monotonic() + 6.0  # beyond the 2 s lease and several member heartbeats
        n = 0
        while time.monotonic() < t_end:
            status, err = http("POST", f"{g.http}/v1/topics/calm/messages", f"during {n}".encode())
            assert status == 200, (status, err)
            n += 1
        got = read_all(g, "calm")
        assert len(got) == 20 + n and f"during {n - 1}".encode() in got
        g.controller = start_proc("controller", ctl_args)
        back = asyncio.run(g.wait_state(lambda s: s.master_id is not None, "the controller back", 30))
        assert (back.master_id, back.master_epoch) == (st.master_id, st.master_epoch)
        assert post(g, "calm", b"after") == 200
    finally:
        g.stop()
