"""A local[2] Spark session for the Spark tests (one per test session: starting one is slow).

Without PySpark (`pip install -e ".[dev]"` brings it) the tests are skipped locally and fail
in CI. Spark needs Java 17 or newer on the PATH.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true")


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        if IN_CI:
            pytest.fail("PySpark is not installed (pip install -e '.[dev]')")
        pytest.skip("PySpark is not installed")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this interpreter
    root = str(Path(__file__).resolve().parents[2])  # executors import tests.spark helpers
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = (
        SparkSession.builder.master("local[2,2]")  # two cores; a failed task is retried once
        .appName("txtasks-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    from txtasks.spark import register

    register(session)
    yield session
    session.stop()
