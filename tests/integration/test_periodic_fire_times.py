"""Periodic schedules fire every fire time exactly once while cleaners run, on every database.

Two cleaners (each its own App and driver) pass at irregular moments of a manual clock, alone
or both at once, as cleaners whose passes are jittered, slow, or race each other do. The fired
tasks are read back from the database: each fire time once, none missing, whatever the
schedule's interval, catch-up rule and misfire grace. Fire times are missed (and the catch-up
rule applies to them) only when no cleaner passed for a while.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from cleaner import Periodic, PeriodicConfig
from tests.integration.conformance import ManualClock, cleaner_app, get
from tests.integration.conftest import another
from txtasks.driver import Driver
from txtasks.periodic import MAX_FIRES_PER_SWEEP, Schedule

START = datetime(2030, 1, 1, 0, 0, 0, 300000)


def cleaner(driver: Driver, clock: ManualClock, interval: float, **schedule: Any) -> Periodic:
    app = cleaner_app(driver, clock)
    app.periodic("conformance.task", name="tick", **schedule)
    return Periodic(app, PeriodicConfig(interval=interval))


async def fired(driver: Driver) -> Counter[datetime]:
    """How many tasks the periodic sweep enqueued per fire time (read from the database)."""
    ids = await driver.sweeps.ready_list("q", due_before=datetime.max, limit=10_000)
    headers = [json.loads((await get(driver, i)).headers or "") for i in ids]
    return Counter(datetime.fromisoformat(h["txtasks-fire-time"]) for h in headers)


def fire_times(schedule: Schedule, after: datetime, until: datetime) -> list[datetime]:
    """Every fire time of `schedule` in (after, until]."""
    times = [schedule.next_after(after)]
    while times[-1] <= until:
        times.append(schedule.next_after(times[-1]))
    return times[:-1]


async def run_passes(
    sweeps: list[Periodic], clock: ManualClock, gaps: tuple[float, float], count: int, seed: int
) -> None:
    """`count` moments `gaps` seconds apart (at random in that range); at each, one of the
    cleaners passes, or all of them at once."""
    rng = random.Random(seed)
    groups = [[sweep] for sweep in sweeps] + ([sweeps] if len(sweeps) > 1 else [])
    for _ in range(count):
        clock.now += timedelta(seconds=rng.uniform(*gaps))
        await asyncio.gather(*(sweep.run_once() for sweep in rng.choice(groups)))


#: (schedule, the cleaners' interval, seconds between passes, passes)
SCENARIOS = [
    pytest.param({"every": 1}, 1.0, (1.05, 1.4), 50, id="every1-passes1.05to1.4s"),
    pytest.param({"every": 1}, 1.0, (0.9, 2.5), 40, id="every1-slow-passes"),
    pytest.param({"every": 0.25}, 1.0, (1.0, 2.0), 30, id="every0.25"),
    pytest.param({"every": 7}, 1.0, (1.0, 1.5), 60, id="every7"),
    pytest.param({"every": 0.01}, 1.0, (1.0, 1.2), 10, id="every0.01-over-a-batch-per-pass"),
    pytest.param({"cron": "* * * * *"}, 30.0, (25.0, 70.0), 30, id="cron-every-minute"),
]


@pytest.mark.parametrize("catch_up", ["latest", "skip", "all"])
@pytest.mark.parametrize(("schedule", "interval", "gaps", "passes"), SCENARIOS)
async def test_each_fire_time_once_while_cleaners_run(
    driver: Driver,
    catch_up: str,
    schedule: dict[str, Any],
    interval: float,
    gaps: tuple[float, float],
    passes: int,
) -> None:
    clock = ManualClock(START)
    other = await another(driver)
    options = {**schedule, "catch_up": catch_up, "misfire_grace": 0}
    try:
        sweeps = [cleaner(d, clock, interval, **options) for d in (driver, other)]
        assert (await sweeps[0].run_once()).registered == 1
        await run_passes(sweeps, clock, gaps, passes, seed=len(gaps) * passes)
    finally:
        if other is not driver:
            await other.close()

    declared = sweeps[0].app.schedules["tick"]
    expected = fire_times(declared, START, clock.now)
    counts = await fired(driver)
    assert sorted(counts.elements()) == expected
    stored = (await driver.sweeps.periodic_list())["tick"]
    assert stored.next_fire_at == declared.next_after(clock.now)


def latest(missed: list[datetime]) -> list[datetime]:
    return missed[-1:]


@pytest.mark.parametrize(
    ("catch_up", "enqueued"),
    [
        pytest.param("latest", latest, id="latest"),
        pytest.param("skip", lambda missed: [], id="skip"),
        pytest.param("all", lambda missed: missed, id="all"),
    ],
)
async def test_catch_up_applies_only_to_times_missed_while_no_cleaner_ran(
    driver: Driver, catch_up: str, enqueued: Callable[[list[datetime]], list[datetime]]
) -> None:
    """Every second; a cleaner passes about every second, then none for 30 s. With
    misfire_grace 3 and an interval of 1 s, fire times up to 5 s late (five intervals) are on
    time: all enqueued. The older ones were missed: the catch-up rule decides."""
    clock = ManualClock(START)
    sweep = cleaner(driver, clock, 1.0, every=1, catch_up=catch_up, misfire_grace=3)
    await sweep.run_once()
    await run_passes([sweep], clock, (1.0, 1.2), 10, seed=1)
    down = clock.now
    clock.now += timedelta(seconds=30)
    await sweep.run_once()

    declared = sweep.app.schedules["tick"]
    horizon = clock.now - timedelta(seconds=5)
    while_up = fire_times(declared, START, down)
    while_down = fire_times(declared, down, clock.now)
    missed = [t for t in while_down if t < horizon]
    on_time = [t for t in while_down if t >= horizon]
    assert (len(missed), len(on_time)) == (25, 5)
    assert sorted((await fired(driver)).elements()) == while_up + enqueued(missed) + on_time


async def test_a_backlog_of_missed_fires_is_caught_up_a_batch_per_pass(driver: Driver) -> None:
    """catch_up="all" after 300 s without a cleaner: 100 fire times per pass (the missed ones
    are a backlog, caught up over passes), then the on-time ones with the last of them."""
    clock = ManualClock(START)
    sweep = cleaner(driver, clock, 1.0, every=1, catch_up="all", misfire_grace=0)
    await sweep.run_once()
    clock.now += timedelta(seconds=300)
    results = [await sweep.run_once() for _ in range(4)]

    assert [r.fired for r in results] == [MAX_FIRES_PER_SWEEP] * 3 + [0]
    declared = sweep.app.schedules["tick"]
    assert sorted((await fired(driver)).elements()) == fire_times(declared, START, clock.now)
