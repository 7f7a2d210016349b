"""Services (txtasks.services) hosted by the cleaner: each one a sweep like the others, named
after its service, scheduled, logged (`sweep=NAME ok=true ...`), counted and health-checked the
same way. The cleaner runs every service installed packages contribute for cleaners (with
their defaults), as `CleanerConfig.services` replaces or turns them off."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from cleaner.sweep import Sweep
from txtasks.services import Service, ServiceHost, ServiceResult

if TYPE_CHECKING:
    from txtasks.app import App
    from txtasks.metrics import Metrics

log = logging.getLogger("cleaner")


class ServiceSweep(Sweep[Service, ServiceResult]):
    """A service run as a sweep: `config` is the service (its settings and its pass)."""

    def __init__(self, app: App, service: Service, *, metrics: Metrics | None = None) -> None:
        super().__init__(app, service, metrics=metrics)
        self.name = service.name
        self.host = ServiceHost("cleaner", app, app.driver, log, wake=app.notify)

    async def run_once(self) -> ServiceResult:
        return await self.config.run_once(self.host)
