"""How one task, or one publish, is enqueued: `EnqueueOptions`, checked in one place.

Every enqueue call takes the same options (`EnqueueSettings`, as keyword arguments):
`app.enqueue`, `task.enqueue_tx`, `app.new_task`, `app.topics.publish` and the rest. They become one
`EnqueueOptions` value, whose checks name the option that is wrong; the rows are built from it
(`txtasks.task.new_row`, `txtasks.publishes.new_publish`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypedDict

from txtasks._checks import check_key, check_number
from txtasks.clock import as_utc, seconds
from txtasks.errors import ConfigurationError

__all__ = ["MAX_DEDUP_BYTES", "NO_OPTIONS", "EnqueueOptions", "EnqueueSettings"]

#: The dedup key column's width, in bytes of UTF-8.
MAX_DEDUP_BYTES = 255
#: Why a publish's dedup key is shorter than the column.
DELIVERY_DEDUP_WHY = " (each group's delivery adds its group's name)"


class EnqueueSettings(TypedDict, total=False):
    """The keyword options of every enqueue and publish call, each optional."""

    #: Seconds (or a timedelta) from now until the task is due; not with `run_at`.
    delay: float | timedelta | None
    #: When the task is due (naive: UTC); not with `delay`.
    run_at: datetime | None
    #: Higher runs first (default: the task's, or the subscription's).
    priority: int | None
    #: At most one live task per dedup key (a publish: per group and key).
    dedup_key: str | None
    #: str -> str, stored with the task (the handler reads `ctx.headers`).
    headers: dict[str, str] | None
    #: Another queue than the task's (not for a publish: each group has its queue).
    queue: str | None
    #: The key whose limits the task shares (default: the task's key function's).
    key: str | None


class EnqueueOptions(NamedTuple):
    """The options of one enqueue, unchecked until `due` and `checked` run (what
    `EnqueueSettings` names, as a value; a tuple: cheap to make once per task)."""

    delay: float | timedelta | None = None
    run_at: datetime | None = None
    priority: int | None = None
    dedup_key: str | None = None
    headers: dict[str, str] | None = None
    queue: str | None = None
    key: str | None = None

    @classmethod
    def of(cls, where: str, settings: Mapping[str, Any]) -> EnqueueOptions:
        """The options of keyword arguments; an unknown one is an error naming it."""
        if not settings:
            return NO_OPTIONS  # the common case, a bulk enqueue's: nothing to build or check
        try:
            return cls(**settings)
        except TypeError:  # an unknown keyword: say which, and the known ones
            unknown = sorted(settings.keys() - _KNOWN)
            known = ", ".join(sorted(_KNOWN))
            raise ConfigurationError(
                f"{where}: unknown option(s) {unknown}; known: {known}"
            ) from None

    def due(self, where: str, now: datetime, *, dedup_bytes: int = MAX_DEDUP_BYTES) -> datetime:
        """When the task is due (now, now + delay, or run_at), once every option is valid
        (`checked`)."""
        self.checked(where, dedup_bytes=dedup_bytes)
        if self.delay is not None:
            if self.run_at is not None:
                raise ConfigurationError(f"{where}: give delay or run_at, not both")
            wait = check_number(f"{where}: delay", seconds(self.delay), minimum=0)
            return now + timedelta(seconds=wait)
        if self.run_at is not None:
            return as_utc(self.run_at)
        return now

    def checked(self, where: str, *, dedup_bytes: int = MAX_DEDUP_BYTES) -> EnqueueOptions:
        """Itself, once its priority, dedup key (up to `dedup_bytes` bytes) and key are valid."""
        if self.dedup_key is not None:
            check_key(
                self.dedup_key,
                setting=f"{where}: dedup_key",
                most_bytes=dedup_bytes,
                why="" if dedup_bytes == MAX_DEDUP_BYTES else DELIVERY_DEDUP_WHY,
            )
        if self.priority is not None and type(self.priority) is not int:
            check_number(f"{where}: priority", self.priority, maximum=None, integer=True)
        if self.key is not None:
            check_key(self.key, setting=f"{where}: key")
        return self


#: No option given: due now, the task's own settings (`EnqueueOptions.of` of no keywords).
NO_OPTIONS = EnqueueOptions()
_KNOWN = EnqueueSettings.__optional_keys__
