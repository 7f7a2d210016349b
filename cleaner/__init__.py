"""The txtasks cleaner: the sidecar that keeps tasks moving when processes die or messages
are lost. Run it with `txtasks cleaner APP` or `python -m cleaner APP`.

Sweeps, each one class with a config of named defaults and a testable `run_once()`:
`Rescuer` (expired leases), `Reannouncer` (lost wake-ups), `Archiver` (finished rows in the
hot table), `Retention` (old archive rows) and `Periodic` (cron and interval schedules). It
also hosts the services installed packages contribute (txtasks.services), each as a
`ServiceSweep`: txtasks.spark's publisher of deferred writes and purge of staged rows.
"""

from __future__ import annotations

import typing
import warnings
from typing import Any

from cleaner.archiver import Archiver, ArchiverConfig, ArchiveResult
from cleaner.daemon import Cleaner, CleanerConfig
from cleaner.firer import Periodic, PeriodicConfig, PeriodicResult
from cleaner.reannouncer import Reannouncer, ReannouncerConfig, ReannounceResult
from cleaner.rescuer import Rescuer, RescuerConfig, RescueResult
from cleaner.retention import Keep, Retention, RetentionConfig, RetentionResult
from cleaner.services import ServiceSweep
from cleaner.sweep import Sweep, SweepConfig, SweepResult
from txtasks.services import discovered

__all__ = [
    "ArchiveResult",
    "Archiver",
    "ArchiverConfig",
    "Cleaner",
    "CleanerConfig",
    "Keep",
    "Periodic",
    "PeriodicConfig",
    "PeriodicResult",
    "ReannounceResult",
    "Reannouncer",
    "ReannouncerConfig",
    "RescueResult",
    "Rescuer",
    "RescuerConfig",
    "Retention",
    "RetentionConfig",
    "RetentionResult",
    "ServiceSweep",
    "Sweep",
    "SweepConfig",
    "SweepResult",
]

#: Names of the former publisher sweep -> what they are now, and where to find it.
DEPRECATED = {
    "Publisher": "ServiceSweep, which hosts a service: ServiceSweep(app, DeferredPublisher())",
    "PublisherConfig": "txtasks.spark.DeferredPublisher, the service's settings",
    "PublishResult": "txtasks.spark.PublishResult",
}


def __getattr__(name: str) -> Any:
    if name not in DEPRECATED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"cleaner.{name} is deprecated: the deferred publisher is a service (docs/spark.md); "
        f"use {DEPRECATED[name]}",
        DeprecationWarning,
        stacklevel=2,
    )
    if name == "Publisher":
        return ServiceSweep
    publisher = type(discovered()["publisher"])  # loads the service's package (txtasks.spark)
    if name == "PublisherConfig":
        return publisher
    return typing.get_type_hints(publisher.run_once)["return"]
