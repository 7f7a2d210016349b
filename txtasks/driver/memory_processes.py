"""The in-memory driver's heartbeat rows of workers and cleaners (the `Processes` role)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from txtasks.driver.memory_store import MemoryStore
from txtasks.types import ProcessRow


class MemoryProcesses:
    """Heartbeat rows in the store."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    async def process_beat(self, process: ProcessRow, *, forget_before: datetime) -> None:
        with self.store.lock:
            started = self.store.beats.get(process.id)
            if started is not None:  # the row keeps when it was made
                process = replace(process, started_at=started.started_at)
            self.store.beats[process.id] = process
            for row in list(self.store.beats.values()):
                if row.expires_at < forget_before:
                    del self.store.beats[row.id]

    async def process_end(self, process_id: str) -> None:
        with self.store.lock:
            self.store.beats.pop(process_id, None)

    async def process_list(self) -> list[ProcessRow]:
        with self.store.lock:
            return sorted(self.store.beats.values(), key=lambda r: (r.kind, r.id))
