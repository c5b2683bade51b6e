"""A SparkSession set up for unimq: the right Python for workers, Java check, UTC, source registered.

Why this exists: PySpark starts its Python workers with ``python3`` from PATH
unless told otherwise, and on a machine where unimq lives in a virtualenv that
interpreter has neither pyarrow nor this package, which fails every read with
``No module named 'pyarrow'`` deep in an executor. The jobs, the demo, the
bench and the tests all build their session here so that cannot happen, and
so a missing Java fails with an instruction rather than a py4j stack trace.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any, Mapping


class JavaMissingError(RuntimeError):
    pass


def java_available() -> bool:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return True
    return shutil.which("java") is not None


def prepare_environment(local: bool = True) -> None:
    """Environment variables Spark reads at JVM/worker start (idempotent, never overrides the user's)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "hostname resolves to loopback" dance


def get_spark(app_name: str = "unimq", master: str | None = None, conf: Mapping[str, Any] | None = None,
              ui: bool = False, log_level: str = "WARN") -> Any:
    """A SparkSession (``local[2]`` unless ``master``/``spark.master`` says otherwise) with format ``unimq``."""
    if not java_available():
        raise JavaMissingError(
            "Spark needs a Java 17 (or 21) runtime and no `java` is on PATH: "
            "apt-get install openjdk-17-jre-headless (make test does this when root), or set JAVA_HOME"
        )
    master = master or os.environ.get("SPARK_MASTER") or "local[2]"
    prepare_environment(local=master.startswith("local"))
    from pyspark.sql import SparkSession

    b = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
    )
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    from .source import register

    register(spark)
    return spark
