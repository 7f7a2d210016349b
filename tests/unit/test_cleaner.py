"""The cleaner daemon on the in-memory driver: configuration, the re-announcer, scheduling,
health and failure handling. Database behaviour is in tests/integration/test_cleaner_sweeps.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

import pytest

from cleaner import (
    Cleaner,
    CleanerConfig,
    Keep,
    Reannouncer,
    ReannouncerConfig,
    RescuerConfig,
    RetentionConfig,
)
from cleaner.cli import config_from
from cleaner.settings import config_with
from tests.unit.health_http import http_get
from txtasks import App
from txtasks.driver import MemoryDriver
from txtasks.driver.memory import MemorySweeps
from txtasks.errors import ConfigurationError
from txtasks.wakeup import WakeupStats

T0 = datetime(2030, 1, 1)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


class Doorbell:
    """A notifier that records wake-ups."""

    def __init__(self) -> None:
        self.stats = WakeupStats()
        self.calls: list[tuple[str, list[int]]] = []

    def notify(self, queue: str, ids: Sequence[int] = ()) -> None:
        self.calls.append((queue, list(ids)))

    async def subscribe(self, queues: Sequence[str], on_wakeup: Callable[[str], None]) -> None:
        return None

    async def unsubscribe(self) -> None:
        return None

    async def close(self) -> None:
        return None


def make_app(notifier: Doorbell | None = None) -> tuple[App, Clock, MemoryDriver]:
    clock, driver = Clock(), MemoryDriver()
    app = App("t", driver=driver, notifier=notifier, clock=clock)
    app.task(name="a", queue="qa")(lambda payload: None)
    app.task(name="b", queue="qb")(lambda payload: None)
    return app, clock, driver


# -- re-announcer -------------------------------------------------------------------------------


async def test_reannouncer_wakes_queues_with_overlooked_tasks_only() -> None:
    doorbell = Doorbell()
    app, clock, driver = make_app(doorbell)
    first = await driver.tasks.task_insert_many([app.new_task("a", n) for n in range(3)])
    clock.now = T0 + timedelta(seconds=4)
    await driver.tasks.task_insert_many([app.new_task("b")])  # ready since 0:04
    sweep = Reannouncer(app, ReannouncerConfig(after=5, batch_size=2))

    clock.now = T0 + timedelta(seconds=4.5)
    assert (await sweep.run_once()).busy is False  # nothing ready for 5 s yet
    clock.now = T0 + timedelta(seconds=6)
    result = await sweep.run_once()

    assert (result.wakeups, result.tasks) == (1, 2)
    assert doorbell.calls == [("qa", first[:2])]  # at most batch_size ids per wake-up


async def test_reannouncer_watches_extra_queues_and_is_idle_without_a_broker() -> None:
    doorbell = Doorbell()
    app, clock, driver = make_app(doorbell)
    [other] = await driver.tasks.task_insert_many([app.new_task("a", queue="elsewhere")])
    clock.now = T0 + timedelta(seconds=60)
    await Reannouncer(app, ReannouncerConfig(queues=("elsewhere",))).run_once()
    assert doorbell.calls == [("elsewhere", [other])]

    polling, clock, driver = make_app(None)
    await driver.tasks.task_insert_many([polling.new_task("a")])
    clock.now = T0 + timedelta(seconds=60)
    assert (await Reannouncer(polling, ReannouncerConfig()).run_once()).busy is False


# -- configuration ------------------------------------------------------------------------------


def test_set_changes_one_setting_by_its_type() -> None:
    config = CleanerConfig()
    config = config_with(config, "rescuer.interval=2.5")
    config = config_with(config, "rescuer.batch_size=7")
    config = config_with(config, "reannouncer.queues=a, b")
    config = config_with(config, "retention.keep.dead=86400")
    config = config_with(config, "retention.keep.completed=none")
    config = config_with(config, "retention.keys_idle=3600")
    assert config.rescuer == RescuerConfig(interval=2.5, batch_size=7)
    assert config.reannouncer is not None and config.reannouncer.queues == ("a", "b")
    assert config.retention is not None
    assert config.retention.keep == Keep(dead=86400.0, completed=None)
    assert config.retention.keys_idle == 3600.0
    assert config_with(config, "retention.keys_idle=none").retention.keys_idle is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("rescuer", "expected SWEEP.SETTING=VALUE"),
        ("nothing.interval=1", "SWEEP one of rescuer, reannouncer"),
        ("rescuer.nonsense=1", "RescuerConfig has no setting 'nonsense'"),
        ("rescuer.interval=soon", "rescuer.interval=soon: expected float"),
        ("rescuer.interval=-1", "RescuerConfig.interval must be > 0"),
        ("rescuer.batch_size=0", "RescuerConfig.batch_size must be an integer > 0"),
        ("rescuer.grace=-1", "RescuerConfig.grace must be >= 0"),
        (
            "archiver.staged_batch_size=0",
            "ArchiverConfig.staged_batch_size must be an integer > 0",
        ),
        ("reannouncer.queues=bad queue", "ReannouncerConfig.queues"),
        ("retention.keep.completed=-5", "retention completed: expected seconds >= 0"),
        ("retention.keys_idle=0", "RetentionConfig.keys_idle must be seconds > 0"),
    ],
)
def test_bad_settings_name_the_setting(assignment: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        config_with(CleanerConfig(), assignment)
    assert message in str(info.value)


def test_only_and_skip_choose_sweeps() -> None:
    config = config_from(None, (), ("rescuer", "periodic"), ("periodic",))
    assert config.rescuer is not None
    assert (config.reannouncer, config.archiver, config.retention, config.periodic) == (None,) * 4
    with pytest.raises(ConfigurationError, match="no sweep left"):
        config_from(None, (), ("rescuer",), ("rescuer",))
    with pytest.raises(ConfigurationError, match="turned off"):
        config_with(config, "periodic.interval=1")


def test_retention_config_rejects_bad_queue_overrides() -> None:
    with pytest.raises(ConfigurationError, match="must be a Keep"):
        RetentionConfig(queues={"q": 5})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError, match=r"RetentionConfig\.queues"):
        RetentionConfig(queues={"bad queue": Keep()})


# -- the daemon ---------------------------------------------------------------------------------


class Failing(MemorySweeps):
    """Sweeps whose expired-lease query fails (the database went away)."""

    async def lease_expired_list(self, *, now: datetime, limit: int) -> list:  # type: ignore[type-arg]
        raise ConnectionError("database is gone")


async def test_a_failing_pass_is_recorded_and_the_daemon_is_not_ready(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = MemoryDriver()
    driver.sweeps = Failing(driver.store)
    app = App("t", driver=driver)
    cleaner = Cleaner(app, CleanerConfig(reannouncer=None))

    with caplog.at_level(logging.INFO, logger="cleaner"):
        results = await cleaner.run_once()

    assert results["rescuer"] is None and results["archiver"] is not None
    state = cleaner.sweeps["rescuer"].state
    assert (state.passes, state.failures, state.last_ok) == (1, 1, False)
    assert "database is gone" in (state.last_error or "")
    assert "sweep=rescuer ok=false" in caplog.text
    health = cleaner.health()
    assert health["ready"] is False and health["sweeps"]["archiver"]["last_ok"] is True


async def test_start_runs_every_sweep_at_once_and_stop_is_idempotent() -> None:
    app, _, _ = make_app()
    cleaner = Cleaner(app, CleanerConfig(health_port=0, health_host="127.0.0.1"))
    await cleaner.start()
    await cleaner.start()  # idempotent
    try:
        # the first passes are scheduled for "now"
        await asyncio.gather(*(s.wait_passes(1) for s in cleaner.sweeps.values()))
        health = cleaner.health()
        assert (health["live"], health["ready"]) == (True, True)
        status, body = await http_get(cleaner.health_server.port, "/readyz")  # type: ignore[union-attr]
        assert status == 200 and json.loads(body)["ready"] is True
        status, _ = await http_get(cleaner.health_server.port, "/nope")  # type: ignore[union-attr]
        assert status == 404
    finally:
        await cleaner.stop()
        await cleaner.stop()
    assert cleaner.health()["live"] is False


async def test_run_returns_after_request_stop() -> None:
    app, _, _ = make_app()
    cleaner = Cleaner(app, CleanerConfig(periodic=None))
    runner = asyncio.create_task(cleaner.run())
    await cleaner.sweeps["rescuer"].wait_passes(1)
    cleaner.request_stop()
    await asyncio.wait_for(runner, 10)
    assert runner.exception() is None


# -- the stats sweep: the queues' history --------------------------------------------------------


async def test_the_stats_sweep_writes_each_minute_once_even_with_two_cleaners() -> None:
    from cleaner.stats import Stats, StatsConfig
    from txtasks.driver.history import minute_number
    from txtasks.testing import run_until_empty

    app, clock, driver = make_app()
    clock.now = T0 + timedelta(seconds=5)
    for n in range(3):
        await app.aenqueue("a", n)
    await run_until_empty(app, queues=["qa"])
    clock.now = T0 + timedelta(seconds=70)
    await app.aenqueue("b", 1)  # in the minute 00:01, not over yet
    # the first pass of a cleaner (with no metrics): the minute 00:00 is over
    config = StatsConfig(history_settle=5)
    first, second = Stats(app, config), Stats(app, config)
    result = await first.run_once()
    assert (result.minutes, result.purged, result.queues) == (1, 0, 0)
    # a second cleaner at the same time, and the first one again: nothing is counted twice
    assert [(await s.run_once()).minutes for s in (second, first)] == [0, 0]
    start = minute_number(T0)
    week = await driver.dashboard.history_buckets(first=start, last=start + 60, minutes=60)
    assert week == {"qa": {"enqueued": [3], "completed": [3], "failed": [0], "dead": [0]}}
    # the next minute once it is over; a week later, both are purged
    clock.now = T0 + timedelta(seconds=130)
    assert (await second.run_once()).minutes == 1
    clock.now = T0 + timedelta(days=7, minutes=5)
    assert (await first.run_once()).purged == 2


def test_every_cleaner_runs_the_stats_sweep() -> None:
    app, _, _ = make_app()
    assert "stats" in Cleaner(app, CleanerConfig()).sweeps
    with pytest.raises(ConfigurationError, match="history_keep"):
        from cleaner.stats import StatsConfig

        StatsConfig(history_keep=0)
