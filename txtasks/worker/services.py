"""The services a worker hosts (see `txtasks.services`): each in a loop of its own, one pass
every `interval` seconds (jittered by +-10%); in burst mode, one pass of each whenever the
queues look empty. A failing service is logged once per outage, as the worker's own loops."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from txtasks.faults import Outage
from txtasks.services import Service, ServiceHost
from txtasks.worker.outcomes import event_wait


class HostedServices:
    """Runs a worker's services until `stopping` is set."""

    def __init__(
        self, services: Sequence[Service], host: ServiceHost, stopping: asyncio.Event
    ) -> None:
        self.services = list(services)
        self.host = host
        self._stopping = stopping
        self._outages = {s.name: Outage(host.log, s.activity) for s in self.services}

    def start(self) -> list[asyncio.Task[None]]:
        """A loop per service (named `txtasks-<service>`)."""
        return [
            asyncio.create_task(self._loop(service), name=f"txtasks-{service.name}")
            for service in self.services
        ]

    async def pass_all(self) -> bool:
        """One pass of every service; whether any did something (tasks may have become
        claimable)."""
        busy = False
        for service in self.services:
            busy = await self._pass(service) or busy
        return busy

    async def _loop(self, service: Service) -> None:
        while not self._stopping.is_set():
            await self._pass(service)
            await event_wait(self._stopping, service.interval * random.uniform(0.9, 1.1))

    async def _pass(self, service: Service) -> bool:
        """A pass of `service`: whether it did something. An error is logged once per
        outage and counts as nothing done."""
        outage = self._outages[service.name]
        try:
            result = await service.run_once(self.host)
        except Exception as exc:
            outage.failed(exc)
            return False
        outage.ok()
        return result.busy


__all__ = ["HostedServices"]
