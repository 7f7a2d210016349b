"""The queues' history (table `txtasks_history`): its rows, the numbers of its minutes, and
how the counts of the task tables and its sums become rows and series. The cleaner's stats
sweep writes it (`Sweeps.history_*`), the dashboard reads it (`Dashboard.history_buckets`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

#: The first minute of the minute numbers (`minute_number`).
EPOCH = datetime(1970, 1, 1)


def minute_number(at: datetime) -> int:
    """The minute of a (naive UTC) time as the history numbers it: minutes since 1970."""
    return int((at - EPOCH).total_seconds() // 60)


def minute_at(number: int) -> datetime:
    """The start of minute `number` (`minute_number`)."""
    return EPOCH + timedelta(minutes=number)


@dataclass(frozen=True)
class HistoryRow:
    """The tasks of one queue enqueued and finished in one minute (`minute`: its number,
    `minute_number`); `failed`: failed, discarded and cancelled."""

    minute: int
    queue: str
    enqueued: int = 0
    completed: int = 0
    failed: int = 0
    dead: int = 0


#: The series of the history, in the order of a row's counts.
HISTORY_SERIES = ("enqueued", "completed", "failed", "dead")


def history_rows(
    finished: Iterable[tuple[str, str, str, int]], arrived: Iterable[tuple[str, str, int]]
) -> list[HistoryRow]:
    """Rows of the history from counts per (queue, state, minute label) of finished tasks and
    per (queue, minute label) of enqueued ones (`minute_label`), by minute and queue."""
    counts: dict[tuple[int, str], list[int]] = {}

    def add(queue: str, label: str, series: int, count: int) -> None:
        minute = minute_number(datetime.strptime(label, "%Y-%m-%d %H:%M"))
        counts.setdefault((minute, queue), [0, 0, 0, 0])[series] += int(count)

    for queue, state, label, count in finished:
        add(queue, label, 1 if state == "completed" else 3 if state == "dead" else 2, count)
    for queue, label, count in arrived:
        add(queue, label, 0, count)
    return [HistoryRow(m, q, *counts[(m, q)]) for m, q in sorted(counts)]


def history_series(
    sums: Iterable[Sequence[Any]], *, first: int, last: int, minutes: int
) -> dict[str, dict[str, list[int]]]:
    """Per queue and series (`HISTORY_SERIES`), buckets of `minutes` minutes from minute
    `first` up to `last`, from sums per (queue, bucket's first minute, *counts)."""
    size = -(-(last - first) // minutes)
    found: dict[str, dict[str, list[int]]] = {}
    for queue, bucket, *counts in sums:
        slot = (int(bucket) - first) // minutes
        if 0 <= slot < size:
            series = found.setdefault(queue, {s: [0] * size for s in HISTORY_SERIES})
            for name, count in zip(HISTORY_SERIES, counts, strict=True):
                series[name][slot] += int(count or 0)
    return found
