"""The Spark tests' shared session (tests/spark/conftest.py): a test that failed leaves the next
one a new JVM. A timeout that fires while the driver waits for the JVM's answer (pytest-timeout
raises `Failed`, which py4j does not catch) leaves that answer unread on the connection, and
every later call reads the answer to the call before it: one timed-out test failed every Spark
test after it."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

from tests.spark.conftest import Sessions


def test_a_session_left_reading_stale_answers_gives_way_to_a_new_jvm(
    spark: Any, spark_sessions: Sessions
) -> None:
    def timed_out(*_: object) -> None:
        pytest.fail("timed out")  # as pytest-timeout does

    # The signal goes to the main thread, blocked in the JVM's answer: a process-wide alarm
    # may be taken by another thread (py4j's, xdist's), and the job then runs to its end.
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main
    alarm = threading.Timer(1.0, signal.pthread_kill, (main, signal.SIGALRM))
    previous = signal.signal(signal.SIGALRM, timed_out)
    try:
        alarm.start()
        with pytest.raises(pytest.fail.Exception, match="timed out"):
            spark.range(10**12).selectExpr("max(id)").collect()  # runs for minutes
    finally:
        alarm.cancel()
        alarm.join()
        signal.signal(signal.SIGALRM, previous)
    old = spark.sparkContext._gateway  # its connection now holds the job's answer, unread

    spark_sessions.stop(jvm=True)  # what the report of a failed Spark test does

    assert old.proc.poll() is not None, "the old JVM is still running"
    again = spark_sessions.get()
    assert again.range(5).selectExpr("sum(id) AS s").first()["s"] == 10
    assert again.conf.get("spark.sql.session.timeZone") == "UTC"  # configured as the first was


def test_the_session_jvm_runs_with_the_tests_java_options(spark: Any) -> None:
    """The JVMs the tests start take the tests' Java options (`tests.conftest.JAVA_OPTIONS`,
    unless the caller set JDK_JAVA_OPTIONS): the quicker start is not lost on the way."""
    expected = os.environ["JDK_JAVA_OPTIONS"].split()
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert set(expected) <= set(runtime.getInputArguments()), list(runtime.getInputArguments())
