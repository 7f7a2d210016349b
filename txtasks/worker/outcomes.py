"""The outcome buffer: attempts finish one by one, outcomes are written in batches."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from txtasks.clock import Clock
from txtasks.driver import Driver, WriteResult
from txtasks.policy import clean_text, error_text
from txtasks.types import Outcome, OutcomeKind, TaskKey

log = logging.getLogger("txtasks.worker")

MAX_BACKOFF = 5.0


async def event_wait(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait for an event at most `timeout` seconds; True if it is set.

    Unlike `asyncio.wait_for`, a cancellation arriving as the event fires is never lost.
    """
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
    return event.is_set()


class OutcomeBuffer:
    """Buffers outcomes and flushes them in one driver call every `interval` seconds.

    A failed flush (database down) keeps the outcomes and tries again with backoff; the writes
    are fenced, so an outcome whose lease was lost meanwhile is dropped safely by the database.
    """

    def __init__(
        self,
        driver: Driver,
        clock: Clock,
        *,
        interval: float,
        max_batch: int,
        archive_completed: bool,
        worker_id: str | None = None,
        on_written: Callable[[list[Outcome], tuple[TaskKey, ...]], None] | None = None,
    ) -> None:
        self.driver = driver
        self.clock = clock
        self.interval = interval
        self.max_batch = max_batch
        self.archive_completed = archive_completed
        self.worker_id = worker_id
        self.on_written = on_written
        self._pending: list[Outcome] = []
        self._ready = asyncio.Event()
        self._full = asyncio.Event()
        self.lock = asyncio.Lock()
        self._closing = False

    def __len__(self) -> int:
        return len(self._pending)

    def keys(self) -> list[TaskKey]:
        """Attempts whose outcome is not written yet: their leases must still be extended."""
        return [o.key for o in self._pending]

    def add(self, outcome: Outcome) -> None:
        self._pending.append(outcome)
        self._ready.set()
        if len(self._pending) >= self.max_batch:
            self._full.set()

    async def run(self) -> None:
        """Flush until `stop()`; a flush under way is never interrupted half-written."""
        backoff = 0.0
        while not self._closing:
            await self._ready.wait()
            if self._closing:
                break
            if not self._full.is_set():
                await event_wait(self._full, self.interval)
            try:
                await self.flush()
                backoff = 0.0
            except Exception as exc:
                backoff = min(MAX_BACKOFF, max(0.05, backoff * 2))
                log.warning("outcome flush failed, retrying in %.2fs: %s", backoff, exc)
                await asyncio.sleep(backoff)

    def stop(self) -> None:
        """End `run()` after the flush under way, if any; `drain()` writes the rest."""
        self._closing = True
        self._ready.set()
        self._full.set()

    async def flush(self) -> None:
        """Write everything buffered now, batch by batch; raise if the database fails."""
        async with self.lock:  # one writer: a batch is removed only once it is written
            await self._flush_locked()

    async def _flush_locked(self) -> None:
        while self._pending:
            batch = self._pending[: self.max_batch]
            try:
                result = await self._write(batch)
            except Exception:
                if len(batch) == 1:
                    raise
                result = await self._write_each(batch)  # find the one the database refuses
            del self._pending[: len(batch)]
            if result.stale:
                log.warning(
                    "%d outcome(s) fenced off: the lease was lost and the task re-claimed: %s",
                    len(result.stale),
                    ", ".join(f"{k.id}#{k.attempt}" for k in result.stale[:10]),
                )
            if self.on_written is not None:
                self.on_written(batch, result.stale)
        self._ready.clear()
        self._full.clear()

    async def _write(self, batch: list[Outcome]) -> WriteResult:
        return await self.driver.outcome_write_many(
            batch,
            now=self.clock(),
            archive_completed=self.archive_completed,
            worker_id=self.worker_id,
        )

    async def _write_each(self, batch: list[Outcome]) -> WriteResult:
        """Write one by one. An outcome the database refuses (not the database being away:
        then its replacement fails too, and this raises) is dead-lettered in its place."""
        applied, stale = 0, list[TaskKey]()
        for outcome in batch:
            try:
                result = await self._write([outcome])
            except Exception as exc:
                reason = clean_text(f"its outcome could not be stored: {error_text(exc)}")
                log.error("task %d: %s", outcome.key.id, reason)
                result = await self._write([Outcome(outcome.key, OutcomeKind.DEAD, error=reason)])
            applied += result.applied
            stale.extend(result.stale)
        return WriteResult(applied, tuple(stale))

    async def drain(self, *, attempts: int = 20, give_up: Callable[[], bool] | None = None) -> bool:
        """Flush at shutdown, retrying a while if the database is away. True when empty.

        `give_up()` turning true (a second stop signal) ends the retries early.
        """
        delay = 0.05
        for attempt in range(attempts):
            try:
                await self.flush()
                return True
            except Exception as exc:
                if attempt + 1 == attempts or (give_up is not None and give_up()):
                    log.error("%d outcome(s) not written: %s", len(self._pending), exc)
                    break
                log.warning("final outcome flush failed (%s); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(MAX_BACKOFF, delay * 2)
        return not self._pending
