"""Fixtures of the Spark tests: one SparkSession per test process, a module's `unimq up`.

Why one session for the whole process (session scope, provided to every test module by
tests/conftest.py): starting Spark's JVM costs 20-30 s on a loaded 2-core machine, and the
Spark tests are spread over several files (so that ``--dist loadfile`` can put them on
different workers). ``get_spark`` is ``getOrCreate``: a test that stopped the session would
leave a dead one to the next file, so no test stops it; the fixture does at the end.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterator

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_helpers import Http, Server

SPARK_TEST_CONF = {
    "spark.driver.memory": "1g",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A ``local[2]`` session with the `unimq` source registered (skipped without pyspark or Java)."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("pyspark")
    from spark_ingest.session import get_spark, java_available
    from spark_ingest.source import register

    if not java_available():
        pytest.skip("no Java runtime on PATH (make test installs openjdk-17-jre-headless as root): "
                    "Spark cannot start")
    s = get_spark("unimq-tests", master="local[2]", conf=SPARK_TEST_CONF)
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    register(s)  # registration is per session (get_spark did it too; harmless twice)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One `unimq up` for a test module (see spark_helpers.start_server)."""
    from spark_helpers import start_server

    srv = start_server(tmp_path_factory.mktemp("spark-engine"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[Http]:
    """An HTTP client of the module's server."""
    from spark_helpers import Http

    h = Http(server.endpoint)
    yield h
    h.close()
