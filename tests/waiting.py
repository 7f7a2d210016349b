"""Waiting for observable state, with a bound: the one polling helper of the test suites.

`until` (async: the event loop runs meanwhile) and `until_sync` (blocking) call a predicate
every `interval` seconds until it returns something truthy, and return that. Past `timeout`
seconds, stretched by this run's pace (tests/pace.py: a slow machine waits longer), they
raise `NotWithin` (an AssertionError) naming what was awaited. A predicate may
raise to stop waiting early (e.g. when a process it watches exits); `until` also awaits a
predicate that returns an awaitable.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tests import pace

T = TypeVar("T")

#: Seconds a test waits for an event it expects, unless it says otherwise.
TIMEOUT = 10.0


class NotWithin(AssertionError):
    """What a test waited for did not happen within its timeout."""

    def __init__(self, what: str, timeout: float, pace: float = 1.0) -> None:
        waited = f"{timeout * pace:g}s" + (f" ({timeout:g}s at pace {pace:g})" if pace != 1 else "")
        super().__init__(f"not within {waited}: {what}")
        self.what, self.timeout, self.pace = what, timeout, pace


async def until(
    predicate: Callable[[], T | Awaitable[T]],
    what: str,
    *,
    timeout: float = TIMEOUT,
    interval: float = 0.01,
) -> T:
    """Poll `predicate` on the running loop until it is truthy; return its value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + pace.seconds(timeout)
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if loop.time() > deadline:
            raise NotWithin(what, timeout, pace.pace())
        await asyncio.sleep(interval)


def until_sync(
    predicate: Callable[[], T],
    what: str,
    *,
    timeout: float = TIMEOUT,
    interval: float = 0.02,
) -> T:
    """Poll `predicate` (blocking this thread) until it is truthy; return its value."""
    deadline = time.monotonic() + pace.seconds(timeout)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise NotWithin(what, timeout, pace.pace())
        time.sleep(interval)
