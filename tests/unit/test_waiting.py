"""The test suites' polling helper: returns the predicate's value, fails naming what it awaited."""

from __future__ import annotations

import asyncio

import pytest

from tests.waiting import NotWithin, until, until_sync


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
