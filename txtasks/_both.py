"""One plan, both forms: an operation written once as a generator of driver calls, run by a
sync caller (each call's `_sync` method) or an async one (the coroutine method).

The plan yields `Call(name, ...)` and receives what the driver returned; its return value is
the operation's. So `App.cancel_many` and `App.acancel_many` are the same code.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Call:
    """A driver call: the coroutine method `name`, or its sync form `name + "_sync"`."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def call(name: str, *args: Any, **kwargs: Any) -> Call:
    return Call(name, args, kwargs)


DriverPlan = Generator[Call, Any, R]


def run_sync(driver: Any, plan: DriverPlan[R]) -> R:
    """Run `plan` with the driver's sync methods."""
    try:
        step = next(plan)
        while True:
            step = plan.send(getattr(driver, f"{step.name}_sync")(*step.args, **step.kwargs))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def run_async(driver: Any, plan: DriverPlan[R]) -> R:
    """Run `plan` with the driver's coroutine methods."""
    try:
        step = next(plan)
        while True:
            step = plan.send(await getattr(driver, step.name)(*step.args, **step.kwargs))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
