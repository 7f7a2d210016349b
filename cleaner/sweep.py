"""What every sweep shares: a config with an interval, `run_once()`, and scheduling.

A sweep is one maintenance concern. `run_once()` does one full pass (batch after batch until a
batch comes back short) and returns what it did; `start(scheduler)` runs it every `interval`
seconds on an APScheduler scheduler, `stop()` takes it off. Both are idempotent. A pass that
fails is logged and counted; the next one runs on schedule.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from txtasks.errors import ConfigurationError
from txtasks.faults import describe
from txtasks.services import MAX_BATCHES, MAX_INTERVAL, ServiceConfig, ServiceResult, batches

if TYPE_CHECKING:
    from apscheduler.job import Job
    from apscheduler.schedulers.base import BaseScheduler

    from txtasks.app import App
    from txtasks.driver import Driver
    from txtasks.metrics import Metrics

log = logging.getLogger("cleaner")

__all__ = [  # MAX_BATCHES and MAX_INTERVAL: txtasks.services' bounds, which sweeps share
    "MAX_BATCHES",
    "MAX_INTERVAL",
    "BatchedConfig",
    "Sweep",
    "SweepConfig",
    "SweepResult",
    "SweepState",
    "logfmt",
]


@dataclass(frozen=True)
class SweepConfig(ServiceConfig):
    """Settings every sweep has: `interval`, seconds between passes (checked as a service's)."""


@dataclass(frozen=True)
class BatchedConfig(SweepConfig):
    """Settings of a sweep that works in batches of rows."""

    #: Rows one statement handles at most.
    batch_size: int = 1000

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (isinstance(self.batch_size, int) and self.batch_size > 0):
            raise ConfigurationError(f"{type(self).__name__}.batch_size must be an integer > 0")


@dataclass(frozen=True)
class SweepResult(ServiceResult):
    """What one pass did. Subclasses add counters; `busy` says whether anything changed."""


@dataclass
class SweepState:
    """The record of a sweep's passes, for health checks and logs."""

    passes: int = 0
    failures: int = 0
    #: Passes failed in a row: an outage is logged at its first failed pass and at its end.
    failing: int = 0
    last_started: float | None = None  # time.monotonic()
    last_finished: float | None = None
    last_ok: bool | None = None
    last_error: str | None = None
    last_result: dict[str, Any] | None = None


class Paced(Protocol):
    """A sweep's config: a sweep config, or a service (txtasks.services)."""

    @property
    def interval(self) -> float: ...


C = TypeVar("C", bound=Paced)
R = TypeVar("R", bound=ServiceResult)


class Sweep(abc.ABC, Generic[C, R]):
    """One maintenance concern of the cleaner."""

    name: str

    def __init__(self, app: App, config: C, *, metrics: Metrics | None = None) -> None:
        self.app = app
        self.config = config
        #: Where pass results are counted (txtasks.metrics), or None.
        self.metrics = metrics
        self.state = SweepState()
        self._job: Job | None = None
        self._lock = asyncio.Lock()
        self._passed = asyncio.Condition()

    @property
    def driver(self) -> Driver:
        return self.app.driver

    @abc.abstractmethod
    async def run_once(self) -> R:
        """One full pass; returns what it did."""

    async def batches(self, step: Callable[[int], Awaitable[int]], size: int) -> int:
        """Run `step(size)` (it returns how many rows it handled) until a batch comes back
        short; the rows handled in all."""
        return await batches(step, size)

    # -- scheduling ---------------------------------------------------------------------------

    def start(self, scheduler: BaseScheduler) -> None:
        """Run a pass now and then every `interval` seconds (jittered by up to 10%)."""
        if self._job is not None:
            return
        self._job = scheduler.add_job(
            self._scheduled,
            "interval",
            seconds=self.config.interval,
            jitter=self.config.interval * 0.1,
            id=f"txtasks-{self.name}",
            next_run_time=datetime.now(timezone.utc),
            max_instances=2,  # the second returns at once: see _scheduled
            coalesce=True,
            misfire_grace_time=None,
        )

    async def _scheduled(self) -> None:
        """A pass, unless one is still under way (a slow or stalled database): then this turn
        is skipped quietly, instead of the scheduler warning about it at every interval."""
        if self._lock.locked():
            log.debug("sweep=%s skipped a turn: the last pass is still under way", self.name)
            return
        await self.tick()

    def stop(self) -> None:
        """Schedule no more passes (a pass under way finishes; see `idle()`)."""
        if self._job is None:
            return
        job, self._job = self._job, None
        with contextlib.suppress(LookupError):  # the scheduler was shut down already
            job.remove()

    async def idle(self) -> None:
        """Wait until no pass is under way."""
        async with self._lock:
            return

    async def wait_passes(self, count: int = 1) -> None:
        """Wait until at least `count` passes have finished (ok or not)."""
        async with self._passed:
            await self._passed.wait_for(lambda: self.state.passes >= count)

    async def tick(self) -> R | None:
        """A scheduled pass: logged, recorded, never raising."""
        try:
            return await self._tick()
        finally:
            async with self._passed:
                self._passed.notify_all()

    async def _tick(self) -> R | None:
        async with self._lock:
            state = self.state
            state.last_started = time.monotonic()
            try:
                result = await self.run_once()
            except Exception as exc:
                state.failures += 1
                state.failing += 1
                state.last_ok, state.last_error = False, f"{type(exc).__name__}: {describe(exc)}"
                level = logging.WARNING if state.failing == 1 else logging.DEBUG
                log.log(level, "sweep=%s ok=false error=%r", self.name, state.last_error)
                if self.metrics is not None:
                    self.metrics.sweep_passed(self.name, False, None)
                return None
            finally:
                state.passes += 1
                state.last_finished = time.monotonic()
            if state.failing:
                log.info(
                    "sweep=%s ok=true again after %d failed pass(es)", self.name, state.failing
                )
            state.last_ok, state.last_error, state.failing = True, None, 0
            state.last_result = result.fields()
            if self.metrics is not None:
                changes = state.last_result if result.busy else None
                self.metrics.sweep_passed(self.name, True, changes)
            took = (state.last_finished - state.last_started) * 1000
            level = logging.INFO if result.busy else logging.DEBUG
            log.log(
                level,
                "sweep=%s ok=true %s duration_ms=%.1f",
                self.name,
                logfmt(result.fields()),
                took,
                extra={"sweep": self.name, "result": result.fields()},
            )
            return result


def logfmt(fields: dict[str, Any]) -> str:
    """key=value pairs; nested mappings flattened as key.sub=value."""
    parts: list[str] = []
    for key, value in fields.items():
        if isinstance(value, dict):
            parts.extend(f"{key}.{k}={v}" for k, v in sorted(value.items()))
            if not value:
                parts.append(f"{key}=0")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)
