"""The cleaner daemon: runs every enabled sweep on an APScheduler scheduler.

Several cleaners may run against one database at once (one per worker pod, say). No leader is
elected: every write a sweep makes is fenced by the row's own state, so concurrent passes
cannot double-rescue (the outcome write matches only a still-expired attempt), double-fire (the
periodic UPDATE matches only the fire time it read) or double-delete. The cost of N cleaners is
N times the read queries, which are small and indexed; the gain is that nothing stops while a
leader is lost and re-elected.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timezone
from typing import TYPE_CHECKING, Any

from cleaner.archiver import Archiver, ArchiverConfig
from cleaner.firer import Periodic, PeriodicConfig
from cleaner.health import HealthServer
from cleaner.reannouncer import Reannouncer, ReannouncerConfig
from cleaner.rescuer import Rescuer, RescuerConfig
from cleaner.retention import Retention, RetentionConfig
from cleaner.services import ServiceSweep
from cleaner.stats import Stats, StatsConfig
from cleaner.sweep import Sweep
from txtasks.app import App
from txtasks.errors import ConfigurationError
from txtasks.faults import open_when_reachable
from txtasks.processes import Beacon
from txtasks.services import Service, ServiceResult, discovered, services_for
from txtasks.worker.worker import default_worker_id

if TYPE_CHECKING:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    from txtasks.metrics import Metrics

log = logging.getLogger("cleaner")

#: Seconds between two heartbeats of the cleaner's row (txtasks.processes); the row expires
#: after three missed ones.
BEAT_INTERVAL = 10.0
#: A sweep counts as stalled when it has not finished a pass for this many intervals.
STALL_INTERVALS = 3
#: ... and for at least this many seconds (short intervals get slack for a slow database).
STALL_MIN_SECONDS = 60.0


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: `CleanerConfig.publisher` when not given (the setting is deprecated).
UNSET: Any = _Unset()


@dataclass(frozen=True)
class CleanerConfig:
    """Which sweeps and services run, and their settings. A sweep set to None is off."""

    rescuer: RescuerConfig | None = field(default_factory=RescuerConfig)
    reannouncer: ReannouncerConfig | None = field(default_factory=ReannouncerConfig)
    archiver: ArchiverConfig | None = field(default_factory=ArchiverConfig)
    retention: RetentionConfig | None = field(default_factory=RetentionConfig)
    periodic: PeriodicConfig | None = field(default_factory=PeriodicConfig)
    #: Deprecated: `services={"publisher": ...}`.
    publisher: Service | None = field(default=UNSET, repr=False)
    #: The queues' history (the dashboard's day and week), and queue gauges for the metrics
    #: when the cleaner serves them.
    stats: StatsConfig | None = field(default_factory=StatsConfig)
    #: Serve /livez and /readyz on this port (0: any free port); None: no HTTP endpoint.
    health_port: int | None = None
    #: Address the health endpoint listens on.
    health_host: str = "0.0.0.0"
    #: The services it hosts (txtasks.services), by name, over those installed packages
    #: contribute for cleaners (txtasks.spark's "publisher" and "staged_purge"): a service of
    #: its own or a configured one, or None to turn one off.
    services: Mapping[str, Service | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.publisher is not UNSET:
            warnings.warn(
                "CleanerConfig.publisher is deprecated: the deferred publisher is a service; "
                "configure it with CleanerConfig(services={'publisher': "
                "DeferredPublisher(...)}) (txtasks.spark), or None to turn it off",
                DeprecationWarning,
                stacklevel=3,
            )
            self._services_set({"publisher": self.publisher, **self.services})
            object.__setattr__(self, "publisher", UNSET)
        if self.archiver is not None and self.archiver.staged_settings():
            self._staged_settings_hand_over(self.archiver)

    def _staged_settings_hand_over(self, archiver: ArchiverConfig) -> None:
        """The deprecated `archiver.staged_*` settings, as those of the service staged_purge
        (the archiver warned about them)."""
        purge = self.services.get("staged_purge", discovered().get("staged_purge"))
        if purge is not None:
            moved = _replaced(purge, archiver.staged_settings())
            self._services_set({**self.services, "staged_purge": moved})
        kept = dataclasses.replace(archiver, staged_batch_size=None, staged_after=None)
        object.__setattr__(self, "archiver", kept)

    def _services_set(self, services: Mapping[str, Service | None]) -> None:
        object.__setattr__(self, "services", services)


def _replaced(settings: Any, changes: Mapping[str, Any]) -> Any:
    """The dataclass `settings` (a sweep config, a service) with `changes`."""
    return dataclasses.replace(settings, **changes)


SWEEPS: dict[str, type[Sweep[Any, Any]]] = {
    "rescuer": Rescuer,
    "reannouncer": Reannouncer,
    "archiver": Archiver,
    "retention": Retention,
    "periodic": Periodic,
}


class Cleaner:
    """Keeps an application's tasks moving: `await cleaner.run()` until `cleaner.stop()`."""

    def __init__(
        self, app: App, config: CleanerConfig | None = None, *, metrics: Metrics | None = None
    ) -> None:
        self.app = app
        self.config = config or CleanerConfig()
        self.metrics = metrics
        self.sweeps: dict[str, Sweep[Any, Any]] = {
            name: cls(app, getattr(self.config, name), metrics=metrics)
            for name, cls in SWEEPS.items()
            if getattr(self.config, name) is not None
        }
        if self.config.stats is not None:
            self.sweeps["stats"] = Stats(app, self.config.stats, metrics=metrics)
        for service in services_for("cleaner", self.config.services):
            if service.name in self.sweeps:
                raise ConfigurationError(f"services: {service.name!r} is the name of a sweep")
            self.sweeps[service.name] = ServiceSweep(app, service, metrics=metrics)
        self._scheduler: AsyncIOScheduler | None = None
        self.health_server: HealthServer | None = None
        if self.config.health_port is not None:
            self.health_server = HealthServer(
                self.health, self.config.health_host, self.config.health_port
            )
        self._stopping = asyncio.Event()
        self._started_at: float | None = None
        #: Its heartbeat row: its sweeps, where it runs, since when.
        self._beacon = Beacon(
            app.driver,
            app.clock,
            process_id=f"cleaner:{default_worker_id()}",
            kind="cleaner",
            runs=list(self.sweeps),
            expires_after=3 * BEAT_INTERVAL,
        )
        #: Waiting at start for the database to answer.
        self._connecting = False

    async def start(self) -> None:
        """Open the database and schedule every sweep (the first passes run at once). While
        the database cannot be reached, wait for it (live, not ready) until it answers or the
        cleaner is stopped."""
        if self._scheduler is not None or self._connecting:
            return
        if self.health_server is not None:
            await self.health_server.start()
        self._connecting = True
        try:
            if not await open_when_reachable(self.app.driver, log, self._stopping):
                return
        finally:
            self._connecting = False
        from apscheduler.schedulers.asyncio import AsyncIOScheduler  # only to run, not for --help

        self._scheduler = AsyncIOScheduler(timezone=timezone.utc)
        self._scheduler.start()
        self._started_at = time.monotonic()
        for sweep in self.sweeps.values():
            sweep.start(self._scheduler)
        await self._beacon.beat()
        self._scheduler.add_job(
            self._beacon.beat, "interval", seconds=BEAT_INTERVAL, id="heartbeat", max_instances=1
        )
        log.info("cleaner started: %s", ", ".join(self.sweeps) or "no sweeps")

    async def stop(self) -> None:
        """Schedule no more passes and wait for those under way."""
        self._stopping.set()
        if self._scheduler is None:
            if self.health_server is not None:
                await self.health_server.stop()
            return
        scheduler, self._scheduler = self._scheduler, None
        for sweep in self.sweeps.values():
            sweep.stop()
        await asyncio.gather(*(sweep.idle() for sweep in self.sweeps.values()))
        scheduler.shutdown(wait=False)
        await self._beacon.end()
        if self.health_server is not None:
            await self.health_server.stop()
        log.info("cleaner stopped")

    def request_stop(self) -> None:
        """Ask `run()` to return (safe from a signal handler)."""
        self._stopping.set()

    async def run(self) -> None:
        """Start, run until `request_stop()` or `stop()`, then stop."""
        await self.start()
        try:
            await self._stopping.wait()
        finally:
            await self.stop()

    async def run_once(self) -> dict[str, ServiceResult | None]:
        """One pass of every enabled sweep, in order; a failed pass gives None."""
        await self.app.driver.open()
        return {name: await sweep.tick() for name, sweep in self.sweeps.items()}

    # -- health -------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """`live`: every sweep finished a pass recently (ok or not): the daemon is not stuck.
        `ready`: live, and every sweep's last pass succeeded (the database is reachable)."""
        if self._connecting:  # waiting for the database: a restart would not bring it
            return {"live": True, "ready": False, "connecting": True, "sweeps": {}}
        now = time.monotonic()
        sweeps = {}
        live = self._scheduler is not None and self._scheduler.running
        ready = live
        for name, sweep in self.sweeps.items():
            state = sweep.state
            allowed = max(STALL_INTERVALS * sweep.config.interval, STALL_MIN_SECONDS)
            since = state.last_finished if state.last_finished is not None else self._started_at
            stalled = since is None or now - since > allowed
            live = live and not stalled
            ready = ready and not stalled and state.last_ok is True
            sweeps[name] = {
                "passes": state.passes,
                "failures": state.failures,
                "last_ok": state.last_ok,
                "last_error": state.last_error,
                "seconds_since_pass": None
                if state.last_finished is None
                else round(now - state.last_finished, 3),
                "last_result": state.last_result,
            }
        return {"live": live, "ready": ready, "sweeps": sweeps}
