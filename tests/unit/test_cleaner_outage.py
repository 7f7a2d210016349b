"""A database outage seen by the cleaner is logged once when it starts and once when it ends."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

import pytest

from cleaner import Cleaner, CleanerConfig
from cleaner.rescuer import RescuerConfig
from tests.waiting import until
from txtasks import App, MemoryDriver
from txtasks.driver.memory import MemoryStore, MemorySweeps


class Outage(MemorySweeps):
    """The expired-lease query fails `down` times (the database is away), then works."""

    def __init__(self, store: MemoryStore, down: int) -> None:
        super().__init__(store)
        self.down = down

    async def lease_expired_list(self, *, now: datetime, limit: int) -> list:  # type: ignore[type-arg]
        if self.down:
            self.down -= 1
            raise ConnectionRefusedError(111, "Connection refused")
        return await super().lease_expired_list(now=now, limit=limit)


async def test_an_outage_is_two_lines_however_many_passes_fail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = MemoryDriver()
    driver.sweeps = Outage(driver.store, down=6)
    app = App("t", driver=driver)
    cleaner = Cleaner(app, CleanerConfig(reannouncer=None))
    with caplog.at_level(logging.INFO, logger="cleaner"):
        for _ in range(8):
            await cleaner.run_once()
    lines = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.getMessage().startswith("sweep=rescuer") and r.levelno >= logging.INFO
    ]
    assert lines[0] == (
        "WARNING",
        "sweep=rescuer ok=false error='ConnectionRefusedError: [Errno 111] Connection refused'",
    )
    assert [line for line in lines if line[0] == "WARNING"] == lines[:1]
    assert ("INFO", "sweep=rescuer ok=true again after 6 failed pass(es)") in lines
    assert cleaner.sweeps["rescuer"].state.failures == 6


class Stalled(MemorySweeps):
    """The expired-lease query hangs until `released` (a stalled connection)."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.released = asyncio.Event()
        self.calls = 0

    async def lease_expired_list(self, *, now: datetime, limit: int) -> list:  # type: ignore[type-arg]
        self.calls += 1
        await self.released.wait()
        return await super().lease_expired_list(now=now, limit=limit)


async def test_turns_skipped_behind_a_stalled_pass_are_not_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = MemoryDriver()
    driver.sweeps = stalled = Stalled(driver.store)
    config = CleanerConfig(
        rescuer=RescuerConfig(interval=0.02), reannouncer=None, archiver=None, retention=None
    )
    cleaner = Cleaner(App("t", driver=driver), config)
    skipped = [0]
    sweep = cleaner.sweeps["rescuer"]
    original = sweep._scheduled

    async def counted() -> None:
        if sweep._lock.locked():
            skipped[0] += 1
        await original()

    sweep._scheduled = counted  # type: ignore[method-assign]
    with caplog.at_level(logging.DEBUG):
        await cleaner.start()
        await until(lambda: skipped[0] >= 10, "ten turns skipped behind the pass", timeout=5)
        stalled.released.set()
        await cleaner.stop()
    assert stalled.calls == 1  # one pass under way at a time
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == []
