"""The txtasks cleaner: the sidecar that keeps tasks moving when processes die or messages
are lost. Run it with `txtasks cleaner APP` or `python -m cleaner APP`.

Sweeps, each one class with a config of named defaults and a testable `run_once()`:
`Rescuer` (expired leases), `Reannouncer` (lost wake-ups), `Archiver` (finished rows in the
hot table), `Retention` (old archive rows), `Periodic` (cron and interval schedules) and
`Publisher` (rows of Spark writes committed in deferred mode).
"""

from cleaner.archiver import Archiver, ArchiverConfig, ArchiveResult
from cleaner.daemon import Cleaner, CleanerConfig
from cleaner.firer import Periodic, PeriodicConfig, PeriodicResult
from cleaner.publisher import Publisher, PublisherConfig, PublishResult
from cleaner.reannouncer import Reannouncer, ReannouncerConfig, ReannounceResult
from cleaner.rescuer import Rescuer, RescuerConfig, RescueResult
from cleaner.retention import Keep, Retention, RetentionConfig, RetentionResult
from cleaner.sweep import Sweep, SweepConfig, SweepResult

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
    "PublishResult",
    "Publisher",
    "PublisherConfig",
    "ReannounceResult",
    "Reannouncer",
    "ReannouncerConfig",
    "RescueResult",
    "Rescuer",
    "RescuerConfig",
    "Retention",
    "RetentionConfig",
    "RetentionResult",
    "Sweep",
    "SweepConfig",
    "SweepResult",
]
