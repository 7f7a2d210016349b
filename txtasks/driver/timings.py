"""The dashboard's timings per task: the times of the tasks finished lately
(`Dashboard.finished_times`) and the percentiles of their waits and run times."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

#: The last finished tasks of each of these states whose times `Dashboard.finished_times` reads.
TIMED_STATES = ("completed", "failed", "dead")


@dataclass(frozen=True)
class FinishedTimes:
    """When a finished task's last attempt was due, started and finished."""

    task_name: str
    state: str
    run_at: datetime
    started_at: datetime | None
    finished_at: datetime


@dataclass(frozen=True)
class TaskTimings:
    """Of one task's finished runs: how many (and how many failed or dead), and the 50th and
    95th percentiles of how long their last attempt waited once due and ran, in seconds (None:
    no run had the times)."""

    task_name: str
    runs: int
    failed: int
    wait_p50: float | None
    wait_p95: float | None
    run_p50: float | None
    run_p95: float | None


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile of `values` (None: no value)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * fraction // 1))
    return ordered[int(rank) - 1]


def task_timings(rows: Iterable[FinishedTimes]) -> list[TaskTimings]:
    """Per task name (sorted), the percentiles of its runs' waits and run times."""
    by_name: dict[str, list[FinishedTimes]] = {}
    for row in rows:
        by_name.setdefault(row.task_name, []).append(row)
    found = []
    for name in sorted(by_name):
        runs = by_name[name]
        started = [r for r in runs if r.started_at is not None]
        waits = [max(0.0, (r.started_at - r.run_at).total_seconds()) for r in started]  # type: ignore[operator]
        ran = [max(0.0, (r.finished_at - r.started_at).total_seconds()) for r in started]  # type: ignore[operator]
        failed = sum(1 for r in runs if r.state != "completed")
        found.append(
            TaskTimings(
                name,
                len(runs),
                failed,
                percentile(waits, 0.5),
                percentile(waits, 0.95),
                percentile(ran, 0.5),
                percentile(ran, 0.95),
            )
        )
    return found
