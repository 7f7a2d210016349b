"""The one check of numeric settings: a real, finite number within its bounds.

Every duration, interval and count a user sets goes through `check_number`, so NaN and the
infinities (which compare false with everything and so slip past `x < 0`) are refused at start
with an error naming the setting, instead of failing later in a loop.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from txtasks.errors import ConfigurationError
from txtasks.types import QUEUE_NAME_RE

#: The longest duration any setting may hold, in seconds (100 years): longer ones would
#: overflow the dates computed from them.
MAX_SECONDS = 100 * 366 * 86400.0


def check_number(
    setting: str,
    value: Any,
    *,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = MAX_SECONDS,
    integer: bool = False,
) -> Any:
    """`value` if it is a finite real number (an integer when `integer`), >= `minimum`,
    > `above` and <= `maximum`; else a ConfigurationError naming `setting`."""
    number = _as_float(value, numbers.Integral if integer else numbers.Real)
    valid = (
        math.isfinite(number)
        and (minimum is None or number >= minimum)
        and (above is None or number > above)
        and (maximum is None or number <= maximum)
    )
    if not valid:
        raise ConfigurationError(
            f"{setting} must be {_wanted(integer, minimum, above, maximum)}, got {value!r}"
        )
    return value


def check_finite_fields(config: Any) -> None:
    """Every number among the fields of the dataclass `config` is finite (its own checks see
    to the bounds)."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            check_number(f"{type(config).__name__}.{field.name}", value, maximum=None)


def _as_float(value: Any, kind: Any) -> float:
    """The value as a float; NaN when it is not a number of `kind` (bool is not one)."""
    if not isinstance(value, kind) or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except OverflowError:  # an integer too large for a float
        return math.inf


def _wanted(integer: bool, minimum: float | None, above: float | None, top: float | None) -> str:
    bounds = [f">= {minimum:g}" if minimum is not None else ""]
    bounds.append(f"> {above:g}" if above is not None else "")
    bounds.append(f"<= {top:.10g}" if top is not None else "")
    text = " and ".join(b for b in bounds if b)
    return f"{'an integer' if integer else 'a finite number'}{' ' + text if text else ''}"


def check_key(
    key: object, *, setting: str = "enqueue: key", most_bytes: int = 255, why: str = ""
) -> str:
    """A key (or a dedup key) is 1-`most_bytes` bytes of UTF-8 without NUL; `why` ends the
    error's first part when the bound needs saying why."""
    if not (
        isinstance(key, str)
        and 0 < len(key.encode("utf-8", "surrogatepass")) <= most_bytes
        and "\x00" not in key
    ):
        raise ConfigurationError(
            f"{setting} must be 1-{most_bytes} bytes of UTF-8 without NUL{why}, got {key!r}"
        )
    return key


def check_name(value: object, *, kind: str, setting: str) -> str:
    """Names of queues, topics and groups: 1-128 of A-Z a-z 0-9 _ . : -."""
    if not isinstance(value, str) or not QUEUE_NAME_RE.match(value):
        raise ConfigurationError(
            f"{setting}: {value!r} is not a valid {kind} name (1-128 of A-Z a-z 0-9 _ . : -)"
        )
    return value


def check_queue_name(queue: str, *, setting: str = "queue") -> str:
    return check_name(queue, kind="queue", setting=setting)
