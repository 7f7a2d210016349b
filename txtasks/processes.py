"""Heartbeat rows of workers and cleaners: what each runs, where, since when, and when it last
beat, so that the dashboard lists those alive and marks those that stopped beating.

A process writes its row at start and at every beat (one statement by primary key, and a
delete of rows expired long ago), and deletes it when it stops; a killed process leaves its
row, which expires `expires_after` seconds after its last beat and is forgotten an hour later.
A beat that fails (the database is away) is logged at DEBUG and tried again at the next one.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from txtasks.driver.base import Driver
from txtasks.types import ProcessRow

log = logging.getLogger("txtasks.processes")

#: Rows expired this long ago are deleted by the next beat of any process.
FORGET_AFTER = timedelta(hours=1)


class Beacon:
    """The heartbeat row of one process (`kind`: "worker" or "cleaner")."""

    def __init__(
        self,
        driver: Driver,
        clock: Callable[[], datetime],
        *,
        process_id: str,
        kind: str,
        runs: Sequence[str],
        expires_after: float,
    ) -> None:
        self.driver, self.clock = driver, clock
        self.process_id, self.kind, self.runs = process_id, kind, ",".join(runs)
        self.expires_after = timedelta(seconds=expires_after)
        self.started_at: datetime | None = None

    async def beat(self, running: int | None = None) -> bool:
        """Write the row; whether the database took it."""
        now = self.clock()
        if self.started_at is None:
            self.started_at = now
        row = ProcessRow(
            id=self.process_id,
            kind=self.kind,
            host=socket.gethostname()[:255],
            pid=os.getpid(),
            runs=self.runs,
            running=running,
            started_at=self.started_at,
            beat_at=now,
            expires_at=now + self.expires_after,
        )
        try:
            await self.driver.processes.process_beat(row, forget_before=now - FORGET_AFTER)
        except Exception as exc:
            log.debug("%s %s: heartbeat row not written: %s", self.kind, self.process_id, exc)
            return False
        return True

    async def end(self) -> None:
        """Delete the row (a process that stops cleanly is not listed as gone)."""
        try:
            await self.driver.processes.process_end(self.process_id)
        except Exception as exc:
            log.debug("%s %s: heartbeat row not deleted: %s", self.kind, self.process_id, exc)
