"""The rules every driver claims keys by (txtasks.keys), without a database."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from txtasks import ConfigurationError, KeyLimits, KeyOverride, Rate
from txtasks._checks import check_key
from txtasks.keys import (
    NEXT_DUE,
    KeySlot,
    fetch_cap,
    limits_for,
    rate_after,
    rate_allowance,
    round_robin,
)

T0 = datetime(2030, 1, 1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_turns_give_every_key_its_next_task_before_any_key_a_second() -> None:
    assert round_robin([100, 1, 1, 0, 3], 6) == [2, 1, 1, 0, 2]
    assert round_robin([1, 1], 10) == [1, 1]
    assert fetch_cap([100, 1, 0], 10) == 5 and fetch_cap([0, 0], 10) == 0


def test_a_rate_spaces_starts_and_a_burst_gives_credit() -> None:
    rate = Rate(10, per=1)  # one start every 0.1 s
    assert rate_allowance(rate, None, T0) == 1
    after = rate_after(rate, None, T0, 1)
    assert after == at(0.1) and rate_allowance(rate, after, at(0.05)) == 0
    burst = Rate(10, per=1, burst=3)
    assert rate_allowance(burst, None, T0) == 3
    assert rate_allowance(burst, at(0.1), at(0.1)) == 1  # no credit yet
    assert rate_allowance(burst, at(0.1), at(1)) == 3  # a quiet spell: the whole burst


def test_a_late_start_pushes_the_schedule_unless_a_burst_absorbs_it() -> None:
    strict = Rate(10, per=1)
    assert rate_after(strict, at(0.1), at(0.13), 1) == at(0.23)  # 30 ms late: kept
    loose = Rate(10, per=1, burst=2)
    assert rate_after(loose, at(0.1), at(0.13), 1) == at(0.2)  # on schedule again


def test_a_key_is_looked_at_again_when_it_may_start_something() -> None:
    def slot(limits: KeyLimits, running: int = 0) -> KeySlot:
        return KeySlot("q", "k", limits, running, None)

    full = slot(KeyLimits(concurrency=2), running=1)
    assert full.want(T0) == 1
    assert full.settle(T0, asked=1, found=2, took=1) == (None, None)  # full: wait for a hint
    free = slot(KeyLimits())
    assert free.settle(T0, asked=3, found=4, took=3) == (T0, None)  # more due: back of the round
    assert free.settle(T0, asked=3, found=2, took=2) == (NEXT_DUE, None)  # all started
    rated = slot(KeyLimits(rate=Rate(1, per=10)))
    assert rated.settle(T0, asked=1, found=2, took=1) == (at(10), at(10))
    ordered = slot(KeyLimits(ordered=True, concurrency=5))
    assert ordered.limits.slots == 1


def test_limits_set_at_run_time_win_by_scope() -> None:
    declared = {"q": KeyLimits(concurrency=3)}
    overrides = {
        (None, "k"): KeyOverride("k", concurrency=1, rate=Rate(5)),
        ("q", "k"): KeyOverride("k", "q", concurrency=2),
    }
    limits = limits_for("q", "k", declared, overrides)
    assert (limits.concurrency, limits.rate) == (2, Rate(5))
    assert limits_for("other", "k", declared, overrides).concurrency == 1
    assert limits_for("q", "x", declared, overrides).concurrency == 3


@pytest.mark.parametrize(
    ("text", "rate"), [("10/s", Rate(10, 1)), ("100/60s", Rate(100, 60)), ("5/m", Rate(5, 60))]
)
def test_rates_parse(text: str, rate: Rate) -> None:
    assert Rate.parse(text) == rate


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Rate.parse("fast"), "COUNT/PERIOD"),
        (lambda: Rate(0), "rate: count"),
        (lambda: KeyLimits(concurrency=0), "concurrency"),
        (lambda: KeyLimits(ordered="yes"), "ordered"),  # type: ignore[arg-type]
        (lambda: check_key(""), "1-255 bytes"),
        (lambda: check_key("a\x00b"), "without NUL"),
    ],
)
def test_bad_limits_name_what_is_wrong(make: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        make()  # type: ignore[operator]
