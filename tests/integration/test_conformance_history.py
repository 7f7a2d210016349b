"""Conformance suite: the queues' history (the stats sweep's counts per minute, written once
per minute and queue, summed into buckets for the dashboard) gives the same answers in memory
and on every database, for the seeded tasks of the dashboard's suite."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from tests.integration.conformance import at
from tests.integration.test_conformance_dashboard import Seeded, seeded  # noqa: F401
from txtasks.driver import Driver
from txtasks.driver.history import HistoryRow, minute_number


def minute(hhmm: str) -> int:
    """The number of a minute of the seeded day (2030-01-02)."""
    return minute_number(datetime.fromisoformat(f"2030-01-02 {hhmm}"))


#: The seeded tasks from 02:00 up to 03:09: queue a enqueued five at 03:04; queue b five at
#: 03:02, then one completed, one dead, one failed; queue c's dead letters (03:09) are after.
COUNTED = [
    HistoryRow(minute("03:02"), "b", enqueued=5),
    HistoryRow(minute("03:04"), "a", enqueued=5),
    HistoryRow(minute("03:05"), "b", completed=1),
    HistoryRow(minute("03:06"), "b", dead=1),
    HistoryRow(minute("03:07"), "b", failed=1),
]


async def test_minutes_counted_as_the_last_hour_counts_them(
    driver: Driver,
    seeded: Seeded,  # noqa: F811
) -> None:
    since, until = datetime(2030, 1, 2, 2, 0), datetime(2030, 1, 2, 3, 9)
    assert at(0).minute == 4  # the seeded times: T0 is 03:04:05
    assert await driver.sweeps.history_count(since=since, until=until) == COUNTED
    later = await driver.sweeps.history_count(since=until, until=datetime(2030, 1, 2, 3, 10))
    assert later == [HistoryRow(minute("03:09"), "c", dead=2)]


async def test_a_minute_is_written_once(driver: Driver) -> None:
    assert await driver.sweeps.history_last() is None
    await driver.sweeps.history_write(COUNTED)
    # another cleaner writes the same minutes (and one more) with other counts: the rows
    # written first stay, the new one is added
    again = [dataclasses.replace(r, enqueued=r.enqueued + 100) for r in COUNTED]
    extra = HistoryRow(minute("03:09"), "c", dead=2)
    await driver.sweeps.history_write([*again, extra])
    assert await driver.sweeps.history_last() == minute("03:09")
    buckets = await driver.dashboard.history_buckets(
        first=minute("03:00"), last=minute("03:15"), minutes=5
    )
    zero = [0, 0, 0]
    assert buckets == {
        "a": {"enqueued": [5, 0, 0], "completed": zero, "failed": zero, "dead": zero},
        "b": {
            "enqueued": [5, 0, 0],
            "completed": [0, 1, 0],
            "failed": [0, 1, 0],
            "dead": [0, 1, 0],
        },
        "c": {"enqueued": zero, "completed": zero, "failed": zero, "dead": [0, 2, 0]},
    }
    # a range that starts later leaves the earlier minutes out
    assert set(
        await driver.dashboard.history_buckets(
            first=minute("03:05"), last=minute("03:10"), minutes=5
        )
    ) == {"b", "c"}
    assert await driver.sweeps.history_purge(before=minute("03:05")) == 2
    assert await driver.sweeps.history_purge(before=minute("03:05")) == 0
    assert await driver.sweeps.history_last() == minute("03:09")
