"""Services: background work that a worker or a cleaner hosts, contributed by integrations.

A service is one concern done in passes (River's maintenance services, Oban's plugins): it has
a `name`, the `hosts` that may run it (`"worker"`, `"cleaner"`), an `interval` between passes,
and `run_once(host)`, one full pass that returns what it did (a `ServiceResult`). A host runs
each of its services every `interval` seconds (a worker in `--burst` mode: one pass of each
whenever its queues look empty), logs an outage of a failing service once, and hands it a
`ServiceHost`: the application, the driver, the clock, a logger and `wake(queue)` for queues
that got tasks.

Services come from installed packages, through the entry points of the group `GROUP` (each
names a callable, usually the service class, that returns the service with its defaults), and
from a host's configuration (`WorkerConfig.services`, `CleanerConfig.services`: by name, a
service of one's own, a configured one, or None to turn one off). The hosts import nothing of
the packages that contribute them: `txtasks.spark` contributes its deferred publisher and the
purge of staged rows this way. A service may also report to `txtasks status` (`status()`
returning a `StatusSection`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from txtasks._checks import check_finite_fields
from txtasks.errors import ConfigurationError

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from txtasks.driver import Driver
    from txtasks.options import EnqueueSettings
    from txtasks.task import Task

#: The entry-point group through which installed packages contribute services.
GROUP = "txtasks.services"
#: txtasks' own entry points of `GROUP` (declared in pyproject.toml too, and kept equal to it
#: by a test): known without installed metadata, as when the source tree is on PYTHONPATH.
OWN = {
    "publisher": "txtasks.spark.services:DeferredPublisher",
    "staged_purge": "txtasks.spark.services:StagedPurge",
}
#: The processes that host services.
HOSTS = ("worker", "cleaner")
#: What every service has (see `Service`).
SERVICE_ATTRIBUTES = ("name", "hosts", "activity", "interval", "run_once")
#: The longest interval between passes (seconds): a week.
MAX_INTERVAL = 7 * 86400.0
#: A pass may not take more batches than this (a bound, not a pace: batches run back to back).
MAX_BATCHES = 1000

__all__ = [
    "GROUP",
    "Reporting",
    "Service",
    "ServiceConfig",
    "ServiceHost",
    "ServiceResult",
    "StatusSection",
    "age_text",
    "batches",
    "check_positive_int",
    "discovered",
    "services_for",
    "status_sections",
]


@dataclass(frozen=True)
class ServiceResult:
    """What one pass did. Subclasses add counters; `busy` says whether anything changed."""

    @property
    def busy(self) -> bool:
        return any(bool(v) for v in dataclasses.asdict(self).values())

    def fields(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ServiceConfig:
    """Settings every service (and every cleaner sweep) has; a service is usually a frozen
    dataclass of its settings that derives from this, so that `--set NAME.SETTING=VALUE`
    can change them."""

    #: Seconds between passes.
    interval: float = 60.0

    def __post_init__(self) -> None:
        check_finite_fields(self)  # NaN and infinities out, whatever the field
        if not 0 < self.interval <= MAX_INTERVAL:
            raise ConfigurationError(
                f"{type(self).__name__}.interval must be > 0 and <= {MAX_INTERVAL:.0f} seconds "
                f"(a week), got {self.interval!r}"
            )


class HostApp(Protocol):
    """What a service sees of the application that hosts it (the `App`)."""

    def clock(self) -> datetime: ...

    @property
    def driver(self) -> Driver: ...

    async def aenqueue(
        self, task: Task | str, payload: Any = None, **options: Unpack[EnqueueSettings]
    ) -> int: ...


@dataclass(frozen=True)
class ServiceHost:
    """What a service may use during a pass."""

    #: "worker" or "cleaner".
    kind: str
    app: HostApp
    driver: Driver
    log: logging.Logger
    #: Call with each queue that got tasks: the host sends its wake-up (and a worker serving
    #: the queue claims at once).
    wake: Callable[[str], None]

    @property
    def clock(self) -> Callable[[], datetime]:
        return self.app.clock


class Service(Protocol):
    """Background work in passes; see the module docstring."""

    #: Its name: the key in `services=`, in `--set NAME.SETTING=VALUE`, logs and metrics.
    name: ClassVar[str]
    #: The hosts that may run it.
    hosts: ClassVar[Collection[str]]
    #: What a pass does, for the lines that log an outage ("publishing deferred writes").
    activity: ClassVar[str]

    @property
    def interval(self) -> float:
        """Seconds between passes."""

    async def run_once(self, host: ServiceHost) -> ServiceResult:
        """One full pass (batch after batch until none is left); what it did."""


@dataclass(frozen=True)
class StatusSection:
    """What a service adds to `txtasks status`: a field of `--json`, and a table."""

    #: Its field in the `--json` document, and that field's value.
    key: str
    document: Mapping[str, Any]
    #: Its table in the human output: a title, headers and rows (no rows: no table).
    title: str
    headers: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()


@runtime_checkable
class Reporting(Protocol):
    """A service that reports to `txtasks status`."""

    async def status(self, driver: Driver, now: datetime) -> StatusSection:
        """Its section, read now."""


async def batches(step: Callable[[int], Awaitable[int]], size: int) -> int:
    """Run `step(size)` (it returns how many rows it handled) until a batch comes back short,
    `MAX_BATCHES` at most; the rows handled in all."""
    total = 0
    for _ in range(MAX_BATCHES):
        done = await step(size)
        total += done
        if done < size:
            break
    return total


# -- discovery ---------------------------------------------------------------------------------


@functools.cache
def _entry_points() -> tuple[EntryPoint, ...]:
    """The entry points of `GROUP`: those installed, then txtasks' own not among them (read
    once per process)."""
    installed = {ep.name: ep for ep in entry_points(group=GROUP)}
    own = [EntryPoint(name, value, GROUP) for name, value in OWN.items() if name not in installed]
    return (*installed.values(), *own)


def discovered() -> dict[str, Service]:
    """Every service installed packages contribute, by name, with its defaults."""
    found: dict[str, Service] = {}
    for ep in sorted(_entry_points(), key=lambda ep: ep.name):
        try:
            service = ep.load()()
        except Exception as exc:
            raise ConfigurationError(
                f"service {ep.name!r} (entry point {ep.value!r} of {GROUP}) failed to load: {exc}"
            ) from exc
        _check(ep.name, service, f"entry point {ep.value!r}")
        found[ep.name] = service
    return found


def services_for(kind: str, configured: Mapping[str, Service | None]) -> list[Service]:
    """The services a `kind` host runs: those discovered that it may host, each replaced or
    turned off (None) by `configured`, then the configured ones of its own."""
    found = discovered()
    chosen: dict[str, Service | None] = {
        name: service for name, service in found.items() if kind in service.hosts
    }
    for name, service in configured.items():
        if service is None and name not in found:
            raise ConfigurationError(
                f"services: no service {name!r} to turn off (services: {', '.join(found)})"
            )
        if service is not None:
            _check(name, service, "services=")
            if kind not in service.hosts:
                raise ConfigurationError(
                    f"services: {name!r} runs in a {' or a '.join(service.hosts)}, not in a {kind}"
                )
        chosen[name] = service
    return [service for service in chosen.values() if service is not None]


def _check(name: str, service: Any, where: str) -> None:
    """A ConfigurationError unless `service` looks like a service named `name`."""
    missing = [a for a in SERVICE_ATTRIBUTES if not hasattr(service, a)]
    if missing:
        raise ConfigurationError(
            f"service {name!r} ({where}): {service!r} is not a service (no {', '.join(missing)})"
        )
    if service.name != name:
        raise ConfigurationError(
            f"service {name!r} ({where}): the service is named {service.name!r}"
        )
    unknown = set(service.hosts) - set(HOSTS)
    if unknown:
        raise ConfigurationError(
            f"service {name!r}: unknown host(s) {sorted(unknown)} (hosts: {', '.join(HOSTS)})"
        )


async def status_sections(driver: Driver, now: datetime) -> list[StatusSection]:
    """The sections the discovered services add to `txtasks status`, by service name."""
    sections = []
    for service in discovered().values():
        if isinstance(service, Reporting):
            sections.append(await service.status(driver, now))
    return sections


def age_text(seconds: float) -> str:
    """An age as `txtasks status` shows it: seconds, minutes or hours, one decimal."""
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def check_positive_int(owner: object, setting: str, value: object) -> None:
    """A ConfigurationError naming `Owner.setting` unless `value` is an integer > 0."""
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        raise ConfigurationError(
            f"{type(owner).__name__}.{setting} must be an integer > 0, got {value!r}"
        )
