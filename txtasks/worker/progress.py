"""Storing handlers' progress reports: coalesced, at most one write per `interval`.

A handler may call `ctx.progress()` thousands of times a second; only each attempt's latest
report matters. Reports wait in a dict (one entry per attempt: bounded by the worker's
attempts in flight); the writer stores what is there in one statement, then rests `interval`
seconds before the next write. So a report is stored within `interval` of being made, and the
database sees at most one progress write per `interval` per worker, however many reports. The
statement is the heartbeat's (`lease_extend_many`): fenced on each attempt and its worker, it
stores nothing for an attempt that is no longer this worker's. A row it leaves out (another
transaction held it: a claim passing by, the handler's own transaction) keeps its report for
the next write while its attempt runs here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from datetime import timedelta

from txtasks.clock import Clock
from txtasks.driver import Driver
from txtasks.faults import Outage
from txtasks.types import TaskKey
from txtasks.worker.outcomes import event_wait

log = logging.getLogger("txtasks.worker")


class ProgressWriter:
    """Holds the latest report of each attempt and writes them together, spaced."""

    def __init__(
        self,
        driver: Driver,
        clock: Clock,
        *,
        interval: float,
        lease: float,
        worker_id: str,
        held: Collection[TaskKey] | None = None,
        rest: Callable[[asyncio.Event], Awaitable[bool]] | None = None,
    ) -> None:
        self.driver = driver
        self.clock = clock
        self.interval = interval
        self.lease = lease
        self.worker_id = worker_id
        #: The attempts running here (a report left out is kept while its attempt is in it).
        self.held = held
        #: The latest report of each attempt not stored yet (JSON text).
        self.pending: dict[TaskKey, str] = {}
        #: Progress writes made (each one statement, for every report pending).
        self.writes = 0
        self._reported = asyncio.Event()
        #: How the writer rests between two writes (a test hook): True when stopped.
        self._rest = rest or (lambda stop: event_wait(stop, self.interval))
        self._outage = Outage(log, "storing progress")

    def report(self, key: TaskKey, text: str) -> None:
        """Keep `text` as the attempt's latest report (an earlier one not stored is replaced)."""
        self.pending[key] = text
        self._reported.set()

    async def write(self) -> None:
        """Store every pending report in one statement; on failure keep them for the next
        write (unless a newer report replaced them meanwhile)."""
        if not self.pending:
            return
        reports, self.pending = self.pending, {}
        self.writes += 1
        until = self.clock() + timedelta(seconds=self.lease)
        left_out: set[TaskKey] = set()
        try:
            await self.driver.claims.lease_extend_many(
                list(reports),
                lease_until=until,
                worker_id=self.worker_id,
                progress=reports,
                left_out=left_out,
            )
            self._outage.ok()
        except Exception as exc:
            left_out = set(reports)
            self._outage.failed(exc)
        held = self.held
        for key in left_out:
            if held is None or key in held:
                self.pending.setdefault(key, reports[key])
                self._reported.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Write whenever reports are pending, resting `interval` after each write; when
        `stop` is set, write what is left once and end."""
        while True:
            if not await self._until_reported(stop):
                self._reported.clear()
                await self.write()
            if stop.is_set() or await self._rest(stop):
                await self.write()
                return

    async def _until_reported(self, stop: asyncio.Event) -> bool:
        """Wait for a report (or `stop`); True when stopped."""
        if self._reported.is_set():
            return stop.is_set()
        waiters = {asyncio.ensure_future(self._reported.wait()), asyncio.ensure_future(stop.wait())}
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        return stop.is_set()
