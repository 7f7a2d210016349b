"""One plan, both forms: an operation written once as a generator of driver calls, run by a
sync caller (each call's `_sync` method) or an async one (the coroutine method).

The plan yields `Call(name, ...)` and receives what the driver returned; its return value is
the operation's. So `App.cancel_many` and `App.acancel_many` are the same code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

R = TypeVar("R")
S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Call:
    """A driver call: the coroutine method `name`, or its sync form `name + "_sync"`."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def call(name: str, *args: Any, **kwargs: Any) -> Call:
    return Call(name, args, kwargs)


DriverPlan = Generator[Call, Any, R]


def drive_sync(plan: Generator[S, Any, R], perform: Callable[[S], Any]) -> R:
    """Run a plan: each step it yields is performed, and what that returns sent back."""
    try:
        step = next(plan)
        while True:
            step = plan.send(perform(step))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def drive_async(plan: Generator[S, Any, R], perform: Callable[[S], Awaitable[Any]]) -> R:
    """`drive_sync` with steps performed by a coroutine."""
    try:
        step = next(plan)
        while True:
            step = plan.send(await perform(step))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def run_sync(driver: Any, plan: DriverPlan[R]) -> R:
    """Run `plan` with the sync methods of `driver` (a driver role)."""
    return drive_sync(plan, lambda c: getattr(driver, f"{c.name}_sync")(*c.args, **c.kwargs))


async def run_async(driver: Any, plan: DriverPlan[R]) -> R:
    """Run `plan` with the coroutine methods of `driver` (a driver role)."""
    return await drive_async(plan, lambda c: getattr(driver, c.name)(*c.args, **c.kwargs))
