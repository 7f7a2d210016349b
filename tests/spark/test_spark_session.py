"""The Spark tests' shared session (tests/spark/conftest.py): a test that failed leaves the next
one a new JVM. A timeout that fires while the driver waits for the JVM's answer leaves that
answer unread on the connection, and every later call would read the answer to the call before
it: one timed-out test failed every Spark test after it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import pace

#: A run of two tests on the shared session (the suite's own fixture): the first times out
#: inside a long Spark job, the second asks for a sum.
CONFTEST = 'pytest_plugins = ["tests.spark.conftest"]\n'
TESTS = """
import pytest


@pytest.mark.timeout(3, func_only=True)
def test_times_out_inside_a_spark_job(spark):
    spark.range(10**12).selectExpr("max(id)").collect()


def test_the_next_one_gets_its_answers(spark):
    assert spark.range(5).selectExpr("sum(id) AS s").first()["s"] == 10
"""

#: Seconds the run of the two gets (it starts two JVMs), at the pace (tests/pace.py).
INNER_TIMEOUT = 240


@pytest.mark.xdist_group("spark")  # with the other Spark tests: one JVM starting at a time
@pytest.mark.timeout(INNER_TIMEOUT + 30)
def test_a_test_that_timed_out_in_a_spark_job_leaves_the_next_one_a_working_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_two=TESTS)
    pytester.makeini("[pytest]\ntimeout = 300\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "-v", timeout=pace.seconds(INNER_TIMEOUT)
    )
    result.stdout.fnmatch_lines(
        [
            "*test_times_out_inside_a_spark_job FAILED*",
            "*test_the_next_one_gets_its_answers PASSED*",
        ]
    )
    result.assert_outcomes(passed=1, failed=1)
