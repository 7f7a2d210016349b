"""The cleaner's sweeps and daemon, for applications: import them from here.

`from txtasks.cleaner import Cleaner, CleanerConfig, Periodic` names the same classes as the
sidecar's own package, `cleaner/` (whose top-level name other projects use too; it stays for
`python -m cleaner` and the code that already imports it). The core of txtasks never imports
this module: only an application that runs or configures a cleaner pays for it.
"""

from __future__ import annotations

from cleaner import (
    Archiver,
    ArchiverConfig,
    ArchiveResult,
    Cleaner,
    CleanerConfig,
    Keep,
    Periodic,
    PeriodicConfig,
    PeriodicResult,
    Reannouncer,
    ReannouncerConfig,
    ReannounceResult,
    Rescuer,
    RescuerConfig,
    RescueResult,
    Retention,
    RetentionConfig,
    RetentionResult,
    ServiceSweep,
    Sweep,
    SweepConfig,
    SweepResult,
)

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
