"""The test suites' polling helper: returns the predicate's value, fails naming what it awaited."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from tests import pace
from tests.waiting import NotWithin, until, until_sync


@pytest.fixture(autouse=True)
def reference_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests name exact bounds: the reference machine's pace."""
    monkeypatch.setenv(pace.ENV, "1")


async def test_until_returns_the_first_truthy_value_of_a_plain_or_async_predicate() -> None:
    values = iter([0, None, "", 7])
    assert await until(lambda: next(values), "a value") == 7

    async def ready() -> str:
        await asyncio.sleep(0)
        return "yes"

    assert await until(ready, "an async value") == "yes"


async def test_until_fails_naming_what_it_awaited_and_lets_a_predicates_error_through() -> None:
    with pytest.raises(NotWithin, match=r"^not within 0\.05s: the moon$"):
        await until(lambda: False, "the moon", timeout=0.05)

    def broken() -> bool:
        raise ValueError("process exited")

    with pytest.raises(ValueError, match="process exited"):
        await until(broken, "anything")


def test_until_sync_polls_then_fails_naming_what_it_awaited() -> None:
    calls: list[int] = []
    assert until_sync(lambda: calls.append(1) or len(calls) >= 3, "three calls") is True
    assert len(calls) == 3
    with pytest.raises(NotWithin, match=r"^not within 0\.05s: the sun$") as failed:
        until_sync(lambda: 0, "the sun", timeout=0.05, interval=0.01)
    assert isinstance(failed.value, AssertionError)


def test_a_slow_machine_stretches_the_bound_and_the_failure_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(pace.ENV, "3")
    t = time.monotonic()
    with pytest.raises(NotWithin, match=r"^not within 0\.15s \(0\.05s at pace 3\): the stars$"):
        until_sync(lambda: 0, "the stars", timeout=0.05, interval=0.01)
    assert time.monotonic() - t >= 0.15


def test_the_pace_is_measured_once_never_below_the_floor_and_a_bad_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(pace.ENV)
    measured = pace.pace()
    assert pace.FLOOR <= measured <= pace.MAX_PACE
    assert pace.pace() == measured == float(os.environ[pace.ENV])  # handed on, not re-measured
    assert pace.seconds(2) == 2 * measured
    for bad in ("fast", "0", "-1"):
        monkeypatch.setenv(pace.ENV, bad)
        with pytest.raises(ValueError, match=f"TXTASKS_TEST_PACE='{bad}': expected a number"):
            pace.pace()


STRETCHED_CONFTEST = """
from tests.conftest import stretch_timeouts


def pytest_collection_modifyitems(config, items):
    stretch_timeouts(config, items)
"""

SLOW_TESTS = """
import time

import pytest


@pytest.mark.timeout(1)
def test_marked():
    time.sleep(1.5)


def test_configured():  # the ini's timeout
    time.sleep(1.5)
"""


@pytest.mark.parametrize(("given", "outcomes"), [("1", {"failed": 2}), ("2", {"passed": 2})])
def test_each_tests_timeout_stretches_with_the_pace(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, given: str, outcomes: dict[str, int]
) -> None:
    monkeypatch.setenv(pace.ENV, given)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    pytester.makeconftest(STRETCHED_CONFTEST)
    pytester.makepyfile(test_slow=SLOW_TESTS)
    pytester.makeini("[pytest]\ntimeout = 1\n")
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(**outcomes)


def test_processes_a_test_starts_get_the_runs_pace_and_no_other_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A test's worker or CLI process is told the pace: one that measured its own would spend
    seconds of CPU counting (on a machine already busy) and stretch its bounds differently."""
    from tests.acceptance.apps import cli_env

    monkeypatch.setenv(pace.ENV, "3")
    monkeypatch.setenv("TXTASKS_BROKER_URL", "amqp://elsewhere/")
    for env in (pace.child_environ(), cli_env("sqlite:///x.db")):
        assert env[pace.ENV] == "3" and "TXTASKS_BROKER_URL" not in env
    assert cli_env("sqlite:///x.db")["TXTASKS_DATABASE_URL"] == "sqlite:///x.db"
