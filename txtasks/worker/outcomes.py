"""The outcome buffer: attempts finish one by one, outcomes are written in batches."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

from txtasks.clock import Clock
from txtasks.driver import Driver, WriteResult
from txtasks.faults import Outage, backoff_next, describe, refused_value
from txtasks.policy import clean_text
from txtasks.types import Outcome, OutcomeKind, TaskKey

log = logging.getLogger("txtasks.worker")

MAX_BACKOFF = 5.0
#: Seconds a stopping worker keeps retrying to write its last outcomes while the database is away.
DRAIN_SECONDS = 10.0


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

    A failed flush keeps the outcomes and tries again with backoff, for as long as it takes: a
    lost connection, a timeout or a deadlock is never an outcome. Only a value the database
    refuses (`refused_value`) dead-letters that one task, with the reason. The writes are
    fenced, so an outcome whose lease was lost meanwhile is dropped safely by the database.
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
        #: Attempts whose write failed without an answer: it may have been stored all the same.
        self._in_doubt: set[TaskKey] = set()
        self._ready = asyncio.Event()
        self._full = asyncio.Event()
        self.lock = asyncio.Lock()
        self._closing = False
        self.outage = Outage(log, "writing outcomes")
        #: When the flush under way started (`time.monotonic()`), None between flushes.
        self.flushing_since: float | None = None

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

    def written_elsewhere(self, outcome: Outcome) -> None:
        """An outcome the handler's own transaction wrote: counted as if flushed here."""
        if self.on_written is not None:
            self.on_written([outcome], ())

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
                backoff = backoff_next(backoff, 0.05, MAX_BACKOFF)
                self.outage.failed(exc, retry_in=backoff)
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))

    def stop(self) -> None:
        """End `run()` after the flush under way, if any; `drain()` writes the rest."""
        self._closing = True
        self._ready.set()
        self._full.set()

    async def flush(self) -> None:
        """Write everything buffered now, batch by batch; raise if the database fails."""
        async with self.lock:  # one writer: a batch is removed only once it is written
            self.flushing_since = time.monotonic()
            try:
                await self._flush_locked()
            finally:
                self.flushing_since = None
        self.outage.ok()

    async def _flush_locked(self) -> None:
        while self._pending:
            batch = self._pending[: self.max_batch]
            try:
                result = await self._write(batch)
            except Exception as exc:
                if len(batch) == 1 or not refused_value(exc):
                    raise
                await self._write_each(batch)  # find the one the database refuses
                continue
            self._written(batch, result)
        self._ready.clear()
        self._full.clear()

    async def _write(self, batch: list[Outcome]) -> WriteResult:
        """One driver call; an error other than a refused value leaves the batch in doubt."""
        try:
            return await self.driver.claims.outcome_write_many(
                batch,
                now=self.clock(),
                archive_completed=self.archive_completed,
                worker_id=self.worker_id,
            )
        except Exception as exc:
            if not refused_value(exc):
                self._in_doubt.update(o.key for o in batch)
            raise

    def _written(self, batch: list[Outcome], result: WriteResult) -> None:
        """The batch is stored (or fenced off): it leaves the front of the buffer."""
        del self._pending[: len(batch)]
        if result.stale:
            self._report_stale(result.stale)
        if self._in_doubt:
            self._in_doubt.difference_update(o.key for o in batch)
        if self.on_written is not None:
            self.on_written(batch, result.stale)

    def _report_stale(self, stale: tuple[TaskKey, ...]) -> None:
        doubt = [k for k in stale if k in self._in_doubt]
        fenced = [k for k in stale if k not in self._in_doubt]
        if doubt:
            log.info(
                "%d outcome(s) were no longer held when written again: the earlier write, "
                "whose answer was lost, had stored them, or the lease ran out meanwhile: %s",
                len(doubt),
                keys_text(doubt),
            )
        if fenced:
            log.warning(
                "%d outcome(s) fenced off: the lease was lost and the task re-claimed: %s",
                len(fenced),
                keys_text(fenced),
            )

    async def _write_each(self, batch: list[Outcome]) -> None:
        """Write one by one, each leaving the buffer once stored. An outcome whose value the
        database refuses is dead-lettered in its place, with the reason; any other error
        (the database being away) raises and keeps the rest buffered."""
        for outcome in batch:
            try:
                result = await self._write([outcome])
            except Exception as exc:
                if not refused_value(exc):
                    raise
                reason = clean_text(f"its outcome could not be stored: {describe(exc)}")
                log.error("task %d: %s", outcome.key.id, reason)
                dead = Outcome(outcome.key, OutcomeKind.DEAD, error=reason)
                result = await self._write([dead])
            self._written([outcome], result)

    async def drain(
        self, *, within: float = DRAIN_SECONDS, give_up: Callable[[], bool] | None = None
    ) -> bool:
        """Flush at shutdown, retrying for `within` seconds if the database is away (each try
        is bounded by the driver's command timeout). True when empty.

        `give_up()` turning true (a second stop signal) ends the retries early.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        delay = 0.05
        while True:
            try:
                await self.flush()
                return True
            except Exception as exc:
                left = deadline - loop.time()
                if left <= 0 or (give_up is not None and give_up()):
                    log.error(
                        "%d outcome(s) not written, their tasks will be rescued when their "
                        "leases expire: %s",
                        len(self._pending),
                        describe(exc),
                    )
                    return False
                self.outage.failed(exc, retry_in=delay)
                await asyncio.sleep(min(delay, left))
                delay = min(MAX_BACKOFF, delay * 2)


def keys_text(keys: list[TaskKey], most: int = 10) -> str:
    """Up to `most` attempts as id#attempt."""
    more = f" and {len(keys) - most} more" if len(keys) > most else ""
    return ", ".join(f"{k.id}#{k.attempt}" for k in keys[:most]) + more
