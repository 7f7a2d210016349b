"""The Spark tests' shared session (tests/spark/conftest.py): after a test failed, its JVM goes
and the next test gets a new one that works, so one timeout cannot fail every later test."""

from __future__ import annotations

from typing import Any

from tests.spark.conftest import Sessions


def jvm_pid(session: Any) -> int:
    return int(session.sparkContext._jvm.ProcessHandle.current().pid())


def test_a_session_whose_jvm_was_ended_gives_way_to_a_new_jvm_that_runs_queries(
    spark: Any, spark_sessions: Sessions
) -> None:
    before = jvm_pid(spark)
    gateway = spark.sparkContext._gateway
    spark_sessions.stop(jvm=True)  # what a failed test's report does

    assert gateway.proc.poll() is not None, "the old JVM is still running"
    again = spark_sessions.get()
    assert again is not spark
    assert jvm_pid(again) != before
    assert again.range(5).selectExpr("sum(id) AS s").first()["s"] == 10
    assert again.conf.get("spark.sql.session.timeZone") == "UTC"  # configured as the first
