"""Keys: the limits of tasks that share a key, and the rules every driver claims them by.

A task may carry a key (`key="customer:42"`). Tasks of one key in one queue share its limits:

- **concurrency N**: at most N of them processing at once, across every worker and process. A
  slot is held exactly while a task is processing, so a crashed worker's slot comes back when
  the rescuer takes its task back, once.
- **ordered**: they start one at a time in enqueue order (id order); a task that fails and is
  retried keeps its place, and the next waits until it completes or is dead-lettered.
- **rate**: at most `count` starts per `per` seconds, evenly spaced (one start every
  `per / count` seconds, plus `burst - 1` starts of credit).

Fairness: the keys with work are served round-robin, in the order they became ready. A claim
of L tasks gives every key it serves its next task before any key its second one, so one key
with a million waiting tasks takes one place per round beside a thousand keys with one each.

This module is pure: the SQL drivers and the in-memory driver decide with the same functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from txtasks._checks import check_number
from txtasks.errors import ConfigurationError

#: Hints consumed per claim (a hint says a key may have work: an enqueue, a finished attempt).
HINTS_PER_CLAIM = 1000


@dataclass(frozen=True)
class Rate:
    """At most `count` starts per `per` seconds, evenly spaced; `burst` starts may go at once
    after a quiet spell (1: never two closer than `per / count`)."""

    count: int
    per: float = 1.0
    burst: int = 1

    def __post_init__(self) -> None:
        check_number("rate: count", self.count, minimum=1, integer=True)
        check_number("rate: per", self.per, above=0)
        check_number("rate: burst", self.burst, minimum=1, integer=True)

    @property
    def interval(self) -> timedelta:
        """The time between two starts."""
        return timedelta(seconds=self.per / self.count)

    @classmethod
    def parse(cls, text: str) -> Rate:
        """`10/s`, `10/1s`, `100/60s`, `5/m`, `1/2.5s`: starts per period."""
        units = {"s": 1.0, "m": 60.0, "h": 3600.0}
        try:
            count, period = text.strip().split("/")
            unit = period[-1]
            amount = float(period[:-1]) if period[:-1] else 1.0
            return cls(int(count), amount * units[unit])
        except (ValueError, KeyError, IndexError):
            raise ConfigurationError(
                f"rate: {text!r} is not COUNT/PERIOD, such as 10/s, 100/60s or 5/m"
            ) from None


@dataclass(frozen=True)
class KeyLimits:
    """The limits of one key (or the default of every key of a queue)."""

    concurrency: int | None = None
    ordered: bool = False
    rate: Rate | None = None

    def __post_init__(self) -> None:
        if self.concurrency is not None:
            check_number("key limits: concurrency", self.concurrency, minimum=1, integer=True)
        if not isinstance(self.ordered, bool):
            raise ConfigurationError(
                f"key limits: ordered must be True or False, got {self.ordered!r}"
            )
        if self.rate is not None and not isinstance(self.rate, Rate):
            raise ConfigurationError(f"key limits: rate must be a Rate, got {self.rate!r}")

    @property
    def slots(self) -> int | None:
        """How many may process at once: 1 when ordered, else the concurrency (None: no limit)."""
        return 1 if self.ordered else self.concurrency

    @property
    def limited(self) -> bool:
        return self.slots is not None or self.rate is not None


NO_LIMITS = KeyLimits()


@dataclass(frozen=True)
class KeyOverride:
    """Limits stored in the database for one key (`txtasks keys set`), over the declared ones;
    a field left None keeps the declared value. `queue` None: the key in every queue."""

    key: str
    queue: str | None = None
    concurrency: int | None = None
    ordered: bool | None = None
    rate: Rate | None = None

    def over(self, limits: KeyLimits) -> KeyLimits:
        return replace(
            limits,
            concurrency=limits.concurrency if self.concurrency is None else self.concurrency,
            ordered=limits.ordered if self.ordered is None else self.ordered,
            rate=limits.rate if self.rate is None else self.rate,
        )


def limits_for(
    queue: str,
    key: str,
    declared: Mapping[str, KeyLimits],
    overrides: Mapping[tuple[str | None, str], KeyOverride],
) -> KeyLimits:
    """The limits a key has: the queue's declared ones, under the override for every queue,
    under the override for this queue."""
    limits = declared.get(queue, NO_LIMITS)
    for scope in (None, queue):
        override = overrides.get((scope, key))
        if override is not None:
            limits = override.over(limits)
    return limits


def rate_allowance(rate: Rate | None, next_start_at: datetime | None, now: datetime) -> int:
    """Starts the rate allows now (a large number without a rate)."""
    if rate is None:
        return 1 << 30
    if next_start_at is None:
        return rate.burst
    credit_from = now - rate.interval * (rate.burst - 1)
    if next_start_at > now:
        return 0
    earliest = max(next_start_at, credit_from)
    return min(rate.burst, int((now - earliest) / rate.interval) + 1)


def rate_after(
    rate: Rate | None, next_start_at: datetime | None, now: datetime, started: int
) -> datetime | None:
    """The key's next start time once `started` more tasks started now."""
    if rate is None:
        return None
    credit_from = now - rate.interval * (rate.burst - 1)
    base = credit_from if next_start_at is None else max(next_start_at, credit_from)
    return base + rate.interval * started if started else next_start_at


def round_robin(wants: Sequence[int], limit: int) -> list[int]:
    """How many each key gets of `limit` places: one each per round, in order, while a key
    wants more (the fairness rule)."""
    if sum(wants) <= limit:  # room for all: every key gets what it wants
        return list(wants)
    given = [0] * len(wants)
    left = limit
    while left > 0:
        progressed = False
        for i, want in enumerate(wants):
            if left == 0:
                break
            if given[i] < want:
                given[i] += 1
                left -= 1
                progressed = True
        if not progressed:
            break
    return given


def fetch_cap(wants: Sequence[int], limit: int) -> int:
    """How many candidates to read per key so that the round robin can fill `limit`."""
    wanting = sum(1 for w in wants if w > 0)
    return math.ceil(limit / wanting) if wanting else 0


#: `settle`'s answer for a key whose due tasks ran out: armed again at its next due time.
NEXT_DUE = "next-due"


@dataclass(slots=True)
class KeySlot:
    """One key a claim holds (its row locked): its limits, what runs, its rate's next start."""

    queue: str
    key: str
    limits: KeyLimits
    running: int
    next_start_at: datetime | None

    def want(self, now: datetime) -> int:
        """How many may start now: free slots, within the rate."""
        slots = self.limits.slots
        free = (1 << 30) if slots is None else max(0, slots - self.running)
        return min(free, rate_allowance(self.limits.rate, self.next_start_at, now))

    def settle(
        self, now: datetime, *, asked: int, found: int, took: int
    ) -> tuple[datetime | str | None, datetime | None]:
        """After a claim took `took` of the `found` due tasks, having `asked` for some and read
        one more (so `found > asked` says more are due): when to look at this key again (now:
        back of the round; a time: when its rate allows; NEXT_DUE: when its next task is due;
        None: when a task of it finishes or is enqueued) and the rate's next start."""
        next_start = rate_after(self.limits.rate, self.next_start_at, now, took)
        slots = self.limits.slots
        if slots is not None and self.running + took >= slots:
            return None, next_start
        if asked == 0:  # its rate allows no start yet
            return next_start, next_start
        if found <= asked and took == found:  # every due task started
            return NEXT_DUE, next_start
        if next_start is not None and next_start > now:
            return next_start, next_start
        return now, next_start
