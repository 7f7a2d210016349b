"""A local[2] Spark session for the Spark tests (one per test session: starting one is slow;
a new one after a test failed).

Without PySpark (`pip install -e ".[dev]"` brings it) the tests are skipped locally and fail
in CI. Spark needs Java 17 or newer on the PATH.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true")


class Sessions:
    """The Spark session the tests share, started when first needed and started again after
    a test failed: a test that failed (a timeout above all) may have left the driver's
    connection to the JVM with an answer it never read, and then every later call would read
    the answer to the call before it. The next test gets a new JVM, not that connection."""

    def __init__(self, warehouse: Path) -> None:
        self.warehouse = warehouse
        self.session: Any = None

    def get(self) -> Any:
        if self.session is None:
            self.session = self.start()
        return self.session

    def start(self) -> Any:
        from pyspark.sql import SparkSession

        session = (
            SparkSession.builder.master("local[2,2]")  # two cores; a failed task is retried once
            .appName("txtasks-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.sql.warehouse.dir", str(self.warehouse))
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.python.worker.reuse", "true")
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        from txtasks.spark import register

        register(session)
        return session

    def stop(self, *, jvm: bool = False) -> None:
        """Stop the session; with `jvm`, end its JVM too (the next session starts a new one)."""
        session, self.session = self.session, None
        if session is None:
            return
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        if not jvm:
            with contextlib.suppress(Exception):
                session.stop()
            return
        # No stop() through a connection that may read stale answers: the JVM just goes.
        gateway = SparkContext._gateway
        SparkContext._gateway = SparkContext._jvm = SparkContext._active_spark_context = None
        SparkSession._instantiatedSession = SparkSession._activeSession = None
        if gateway is None:
            return
        proc = getattr(gateway, "proc", None)
        if proc is not None:  # first: a shutdown sent to a JVM still running the job of a
            proc.kill()  # test that timed out may wait for that job's answer (minutes)
            proc.wait()
            if proc.stdin is not None:  # the pipe whose end tells the JVM to exit
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        with contextlib.suppress(Exception):  # the driver's side: its sockets, callback server
            gateway.shutdown()


@pytest.fixture(scope="session")
def spark_sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sessions]:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail("PySpark is not installed (pip install -e '.[dev]')")
        pytest.skip("PySpark is not installed")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this interpreter
    root = str(Path(__file__).resolve().parents[2])  # executors import tests.spark helpers
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    sessions = Sessions(tmp_path_factory.mktemp("spark-warehouse"))
    yield sessions
    sessions.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A Spark test that failed in any phase: its session's JVM goes, the next test starts one."""
    report = yield
    if report.failed and "spark" in getattr(item, "fixturenames", ()):
        sessions = item.funcargs.get("spark_sessions") if hasattr(item, "funcargs") else None
        if isinstance(sessions, Sessions):
            sessions.stop(jvm=True)
    return report


@pytest.fixture
def spark(spark_sessions: Sessions) -> Any:
    """The shared local[2] Spark session (a new one after a test failed)."""
    return spark_sessions.get()
