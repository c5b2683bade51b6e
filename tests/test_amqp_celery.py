"""A Celery app whose broker URL is ``amqp://`` pointed at unimq runs its tasks.

Celery (through kombu and py-amqp, a client nobody here wrote) declares its
exchanges and queues, publishes task messages with headers, and a real
worker, started as a subprocess, consumes and acks them; results travel back
over AMQP too (the ``rpc://`` result backend: reply queues, correlation ids).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


def test_celery_tasks_run_through_unimq(unimq_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "unimq.toml"
    cfg.write_text("[store]\ncommitlog_segment_size = 67108864\n"
                   "disk_refuse_free_ratio = 0.0\ndisk_min_free_ratio = 0.0\n")
    server = unimq_server("--config", str(cfg))
    url = f"amqp://guest:guest@127.0.0.1:{server.ports['amqp']}//"
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "tasks.py").write_text(textwrap.dedent(f"""
        from celery import Celery

        app = Celery("tasks", broker={url!r}, backend="rpc://")
        app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True,
                        worker_hijack_root_logger=False)

        @app.task
        def add(x, y):
            return x + y

        @app.task
        def shout(s):
            return s.upper()
    """))
    env = dict(os.environ, PYTHONPATH=str(app_dir))
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool=solo", "--concurrency=1",
         "--loglevel=WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=app_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        client = subprocess.run(
            [sys.executable, "-c", textwrap.dedent("""
                from tasks import add, shout
                results = [add.delay(i, i) for i in range(10)] + [shout.delay("unimq")]
                print([r.get(timeout=60) for r in results])
            """)],
            cwd=app_dir, env=env, capture_output=True, text=True, timeout=90,
        )
        assert client.returncode == 0, client.stderr
        assert client.stdout.strip().splitlines()[-1] == str([2 * i for i in range(10)] + ["UNIMQ"])
    finally:
        worker.terminate()
        try:
            out, _ = worker.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            out, _ = worker.communicate(timeout=10)
    assert "Traceback" not in server.stderr(), server.stderr()
