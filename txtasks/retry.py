"""Retry strategies: how long to wait before attempt n+1 after attempt n failed."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from txtasks._checks import check_number
from txtasks.errors import ConfigurationError


@runtime_checkable
class RetryStrategy(Protocol):
    """Returns the delay in seconds before the next attempt, given the attempt that failed (1-based)."""

    def delay(self, attempt: int) -> float: ...


def _non_negative(name: str, value: float) -> None:
    check_number(f"retry strategy: {name}", value, minimum=0)


@dataclass(frozen=True)
class Constant:
    """The same delay after every failure."""

    seconds: float = 1.0

    def __post_init__(self) -> None:
        _non_negative("seconds", self.seconds)

    def delay(self, attempt: int) -> float:
        return self.seconds


@dataclass(frozen=True)
class Linear:
    """`base + step * (attempt - 1)` seconds, capped at `cap`."""

    base: float = 1.0
    step: float = 1.0
    cap: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("base", "step", "cap"):
            _non_negative(name, getattr(self, name))

    def delay(self, attempt: int) -> float:
        return min(self.cap, self.base + self.step * max(0, attempt - 1))


@dataclass(frozen=True)
class Exponential:
    """`base * factor ** (attempt - 1)` capped at `cap`; with full jitter, a uniform draw below it."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: bool = True

    def __post_init__(self) -> None:
        for name in ("base", "cap"):
            _non_negative(name, getattr(self, name))
        check_number("retry strategy: factor", self.factor, minimum=1, maximum=None)

    def delay(self, attempt: int) -> float:
        exponent = min(max(0, attempt - 1), 64)
        ceiling = min(self.cap, self.base * self.factor**exponent)
        return random.uniform(0, ceiling) if self.jitter else ceiling


@dataclass(frozen=True)
class Custom:
    """Any callable `attempt -> seconds`."""

    function: Callable[[int], float]

    def delay(self, attempt: int) -> float:
        seconds = float(self.function(attempt))
        _non_negative("custom delay", seconds)
        return seconds


def as_strategy(value: RetryStrategy | Callable[[int], float] | float | None) -> RetryStrategy:
    """Accept a strategy, a plain callable, a number of seconds, or None (the default)."""
    if value is None:
        return Exponential()
    if isinstance(value, RetryStrategy):
        return value
    if isinstance(value, int | float):
        return Constant(float(value))
    if callable(value):
        return Custom(value)
    raise ConfigurationError(f"retry: expected a RetryStrategy, callable or seconds, got {value!r}")
