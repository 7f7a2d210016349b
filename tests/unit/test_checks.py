"""Every numeric setting refuses NaN and the infinities at start, naming the setting."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import pytest

from cleaner.daemon import CleanerConfig
from cleaner.settings import SETTABLE, cleaner_services, config_with
from txtasks import App, MemoryDriver, WorkerConfig
from txtasks._checks import check_number
from txtasks.errors import ConfigurationError
from txtasks.periodic import Schedule
from txtasks.retry import Constant, Exponential, Linear

BAD = [float("nan"), float("inf"), float("-inf")]


def new_app(**options: Any) -> App:
    return App(driver=MemoryDriver(), **options)


def numeric_fields(cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    numeric = {int, float, int | None, float | None}
    return [f.name for f in dataclasses.fields(cls) if f.init and hints[f.name] in numeric]


def worker_with(name: str) -> Callable[[Any], object]:
    return lambda value: WorkerConfig(**{name: value})


def task_with(**options: Any) -> None:
    new_app().task(name="t", **options)(lambda payload: None)


def schedule_with(**options: Any) -> None:
    Schedule("s", "t", **{"every": 5.0, **options})


#: setting -> a call that applies a value to it
SETTINGS: dict[str, Callable[[Any], object]] = {
    **{f"WorkerConfig.{name}": worker_with(name) for name in numeric_fields(WorkerConfig)},
    "App max_payload_bytes": lambda v: new_app(max_payload_bytes=v),
    "task max_attempts": lambda v: task_with(max_attempts=v),
    "task priority": lambda v: task_with(priority=v),
    "task timeout": lambda v: task_with(timeout=v),
    "task deadline": lambda v: task_with(deadline=v),
    "task retry seconds": lambda v: task_with(retry=v),
    "Constant.seconds": lambda v: Constant(v),
    "Linear.base": lambda v: Linear(base=v),
    "Linear.step": lambda v: Linear(step=v),
    "Linear.cap": lambda v: Linear(cap=v),
    "Exponential.base": lambda v: Exponential(base=v),
    "Exponential.factor": lambda v: Exponential(factor=v),
    "Exponential.cap": lambda v: Exponential(cap=v),
    "periodic every": lambda v: schedule_with(every=v),
    "periodic misfire_grace": lambda v: schedule_with(misfire_grace=v),
}


def enqueue_with(**options: Any) -> None:
    app = new_app()
    app.task(name="t")(lambda payload: None)
    app.new_task("t", None, **options)


SETTINGS["enqueue delay"] = lambda v: enqueue_with(delay=v)
SETTINGS["enqueue priority"] = lambda v: enqueue_with(priority=v)


@pytest.mark.parametrize("value", BAD, ids=str)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_numeric_settings_refuse_nan_and_infinities(setting: str, value: float) -> None:
    with pytest.raises(ConfigurationError) as info:
        SETTINGS[setting](value)
    assert setting.split()[-1].split(".")[-1] in str(info.value)


def test_every_numeric_worker_setting_is_covered() -> None:
    assert {"lease", "burst_horizon", "heartbeat", "concurrency"} <= set(
        numeric_fields(WorkerConfig)
    )


def sweep_settings() -> list[str]:
    """`sweep.setting` for every number of every sweep's config, retention's `keep` too, and of
    every service the cleaner hosts."""
    config = CleanerConfig()
    paths = []
    for sweep in SETTABLE:
        paths += [f"{sweep}.{name}" for name in numeric_fields(type(getattr(config, sweep)))]
    for service, settings in cleaner_services(config).items():  # txtasks.spark's
        paths += [f"{service}.{name}" for name in numeric_fields(type(settings))]
    keep = type(config.retention.keep)  # type: ignore[union-attr]
    paths += [f"retention.keep.{f.name}" for f in dataclasses.fields(keep)]
    return paths


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400"])
@pytest.mark.parametrize("path", sweep_settings())
def test_cleaner_settings_refuse_nan_and_infinities(path: str, text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        config_with(CleanerConfig(), f"{path}={text}")
    assert path.split(".")[-1] in str(info.value)


def test_a_bad_number_error_names_the_setting_and_the_bounds() -> None:
    with pytest.raises(ConfigurationError, match=r"^lease must be a finite number > 0 .* got nan$"):
        check_number("lease", float("nan"), above=0)
    with pytest.raises(ConfigurationError, match=r"^batch must be an integer >= 1, got 1.5$"):
        check_number("batch", 1.5, minimum=1, maximum=None, integer=True)
    with pytest.raises(ConfigurationError, match="got True"):
        check_number("count", True, integer=True)
    assert check_number("lease", 30, above=0) == 30


def test_worker_with_a_huge_lease_is_refused_before_its_dates_overflow() -> None:
    with pytest.raises(ConfigurationError, match="lease"):
        WorkerConfig(lease=1e300)
