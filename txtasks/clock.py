"""Time as txtasks stores it: naive datetimes in UTC, microsecond precision."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """The current time as a naive UTC datetime (the form every column uses)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def as_utc(value: datetime) -> datetime:
    """Normalise an aware datetime to naive UTC; a naive one is taken to be UTC already."""
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def seconds(value: float | timedelta) -> float:
    """Accept seconds or a timedelta."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)
