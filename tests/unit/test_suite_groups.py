"""The suite's own scheduling: the tests that use Spark, and the chaos scenarios, each run in
one pytest-xdist process, one after another, and those groups are handed out first."""

from __future__ import annotations

import pytest

from tests import conftest, pace

TESTS = """
import pytest

@pytest.fixture
def spark(): ...

@pytest.fixture
def chaos(): ...

def test_plain(): ...
def test_kill(chaos): ...
def test_job(spark): ...
def test_other(): ...
def test_flap(chaos): ...
"""


def groups(items: list[pytest.Item]) -> list[tuple[str, str | None]]:
    """Each item's name and xdist group, in the order they would run."""
    named = []
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        named.append((item.name, marker.args[0] if marker else None))
    return named


def test_spark_and_chaos_tests_each_form_one_group_scheduled_first(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(pace.ENV, "1")
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    items = pytester.getitems(TESTS)
    assert groups(items)[1] == ("test_kill", None)  # as written, before the hook

    conftest.pytest_collection_modifyitems(items[0].config, items)

    assert groups(items) == [
        ("test_job", conftest.SPARK_GROUP),
        ("test_kill", conftest.CHAOS_GROUP),
        ("test_flap", conftest.CHAOS_GROUP),
        ("test_plain", None),
        ("test_other", None),
    ]
