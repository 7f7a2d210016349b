"""Periodic schedules: fire-time arithmetic, catch-up rules and declaration errors."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from txtasks import App
from txtasks.errors import ConfigurationError, PayloadError
from txtasks.periodic import MAX_FIRES_PER_SWEEP, CatchUp, Schedule

BASE = datetime(2030, 1, 1)


def t(seconds: float) -> datetime:
    return BASE + timedelta(seconds=seconds)


def every(seconds: float, **options: object) -> Schedule:
    return Schedule("s", "task", every=seconds, **options)  # type: ignore[arg-type]


def test_interval_fire_times_are_multiples_since_the_epoch() -> None:
    schedule = every(10)
    assert schedule.next_after(t(0)) == t(10)  # strictly after
    assert schedule.next_after(t(3.5)) == t(10)
    assert schedule.next_after(t(9.999999)) == t(10)
    assert every(0.2).next_after(t(0.5)) == t(0.6)


def test_cron_fire_times_in_utc_and_in_a_time_zone() -> None:
    utc = Schedule("s", "task", cron="*/5 * * * *")
    assert utc.next_after(datetime(2030, 1, 1, 12, 3, 20)) == datetime(2030, 1, 1, 12, 5)
    assert utc.next_after(datetime(2030, 1, 1, 12, 5)) == datetime(2030, 1, 1, 12, 10)
    paris = Schedule("s", "task", cron="0 9 * * *", timezone="Europe/Paris")
    assert paris.next_after(datetime(2030, 1, 2)) == datetime(2030, 1, 2, 8)  # CET = UTC+1
    assert paris.next_after(datetime(2030, 7, 2)) == datetime(2030, 7, 2, 7)  # CEST = UTC+2


@pytest.mark.parametrize("catch_up", ["latest", "skip", "all"])
def test_every_fire_time_on_time_is_due_whatever_the_catch_up_rule(catch_up: str) -> None:
    # Passes 1.4 s apart on an every-second schedule: two fire times came due since the last.
    schedule = every(1, catch_up=catch_up)
    assert schedule.due(t(2), t(3.8)) == ([t(2), t(3)], t(4))
    # On time is at most misfire_grace late, or what the cleaner's passes cover if longer.
    tight = every(1, catch_up=catch_up, misfire_grace=0)
    assert tight.due(t(2), t(3.8), on_time=5) == ([t(2), t(3)], t(4))
    assert tight.on_time_from(t(10), on_time=5) == t(5)
    assert every(1, misfire_grace=7).on_time_from(t(10), on_time=5) == t(3)


def test_fire_times_missed_follow_the_catch_up_rule() -> None:
    # stored next fire 0:10, now 0:55, on time from 0:40: 10, 20, 30 missed; 40, 50 on time
    def due(catch_up: str) -> tuple[list[datetime], datetime]:
        return every(10, catch_up=catch_up, misfire_grace=15).due(t(10), t(55))

    assert due("all") == ([t(10), t(20), t(30), t(40), t(50)], t(60))
    assert due("latest") == ([t(30), t(40), t(50)], t(60))
    assert due("skip") == ([t(40), t(50)], t(60))
    assert every(10, catch_up="skip", misfire_grace=2).due(t(10), t(55)) == ([], t(60))
    assert every(10, catch_up="skip", misfire_grace=2).due(t(50), t(51)) == ([t(50)], t(60))
    assert every(10).due(t(60), t(55)) == ([], t(60))  # nothing due yet


def test_far_behind_schedules_catch_up_in_bounded_steps() -> None:
    behind = t(10 * MAX_FIRES_PER_SWEEP * 3 + 5)
    fires, following = every(10, catch_up="all").due(t(10), behind)
    assert len(fires) == MAX_FIRES_PER_SWEEP and following == fires[-1] + timedelta(seconds=10)
    assert every(10, catch_up="latest", misfire_grace=0).due(t(10), behind) == (
        [t(10 * MAX_FIRES_PER_SWEEP * 3)],
        t(10 * MAX_FIRES_PER_SWEEP * 3 + 10),
    )
    cron = Schedule("s", "task", cron="* * * * *", misfire_grace=0)  # every minute, 3 days behind
    fires, following = cron.due(datetime(2030, 1, 1), datetime(2030, 1, 4, 0, 0, 30))
    assert (fires, following) == ([datetime(2030, 1, 4)], datetime(2030, 1, 4, 0, 1))
    # More fire times on time than one batch: the first batch, and the next one still due.
    fires, following = every(0.1, catch_up="skip").due(t(0), t(59))
    assert (len(fires), fires[-1], following) == (MAX_FIRES_PER_SWEEP, t(9.9), t(10))


def test_the_spec_changes_when_the_schedule_does() -> None:
    assert every(10).spec == "every 10.0s"
    assert Schedule("s", "task", cron="0 * * * *").spec == "cron 0 * * * * UTC"
    assert every(10).spec != every(20).spec


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of cron= or every="),
        ({"cron": "* * * * *", "every": 5}, "exactly one of cron= or every="),
        ({"every": 0}, "every must be > 0"),
        ({"every": float("nan")}, "every must be > 0"),
        ({"cron": "61 * * * *"}, "cron '61 * * * *'"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "cron"),
        ({"every": 5, "catch_up": "sometimes"}, "catch_up 'sometimes' is not one of"),
        ({"every": 5, "misfire_grace": -1}, "misfire_grace must be a finite number >= 0"),
    ],
)
def test_bad_schedules_name_what_is_wrong(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match="periodic 's'") as info:
        Schedule("s", "task", **options)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_app_periodic_declares_and_validates() -> None:
    app = App("t")
    task = app.task(name="report")(lambda payload: None)
    schedule = app.periodic(task, every=timedelta(minutes=5), payload={"k": 1})
    assert (schedule.name, schedule.every, schedule.catch_up) == ("report", 300.0, CatchUp.LATEST)
    assert app.schedules == {"report": schedule}
    with pytest.raises(ConfigurationError, match="already declared; give it a name="):
        app.periodic("report", cron="0 * * * *")
    app.periodic("report", cron="0 * * * *", name="hourly")
    assert set(app.schedules) == {"report", "hourly"}
    with pytest.raises(PayloadError, match="not JSON"):
        app.periodic(task, every=1, name="bad", payload={1, 2})
    with pytest.raises(ConfigurationError, match="queue"):
        app.periodic(task, every=1, name="badq", queue="no spaces")
    with pytest.raises(LookupError, match="no task named 'missing'"):
        app.periodic("missing", every=1)
    assert set(app.schedules) == {"report", "hourly"}


@pytest.mark.parametrize(
    ("cron", "weekdays"),
    [
        ("0 8 * * 1-5", "Mon Tue Wed Thu Fri"),
        ("0 8 * * mon-fri", "Mon Tue Wed Thu Fri"),
        ("0 8 * * 0", "Sun"),
        ("0 8 * * 7", "Sun"),
        ("0 8 * * 6,0", "Sun Sat"),
        ("0 8 * * */2", "Sun Tue Thu Sat"),
        ("0 8 * * 1-5/2", "Mon Wed Fri"),
    ],
)
def test_cron_weekday_numbers_count_from_sunday_as_in_crontab(cron: str, weekdays: str) -> None:
    schedule = Schedule("s", "task", cron=cron)
    moment, seen = datetime(2030, 1, 5, 12), set()  # a Saturday noon
    for _ in range(7):
        moment = schedule.next_after(moment)
        seen.add(moment.strftime("%a"))
        assert moment.hour == 8
    order = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    assert sorted(seen, key=order.index) == weekdays.split()


def test_schedule_queues_are_app_queues() -> None:
    app = App("t", default_queue="main")
    task = app.task(name="report")(lambda payload: None)
    app.periodic(task, every=60, queue="reports")
    assert app.queues == ["main", "reports"]
