"""An in-memory driver for unit tests: the same contract as the SQL drivers, no database.

`MemoryDriver` is a `MemoryStore` (every table as a dict, under one lock) and one object per
role of the contract, each working on that store: `MemoryTasks`, `MemoryClaims`,
`MemoryTopics`, `MemoryControl`, `MemoryAdmin`, `MemorySweeps`, `MemoryProcesses`,
`MemoryDashboard`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from txtasks.driver.base import Capabilities, moved_to_role
from txtasks.driver.memory_admin import MemoryAdmin
from txtasks.driver.memory_claims import MemoryClaims
from txtasks.driver.memory_control import MemoryControl
from txtasks.driver.memory_dashboard import MemoryDashboard
from txtasks.driver.memory_processes import MemoryProcesses
from txtasks.driver.memory_store import MemoryStore
from txtasks.driver.memory_sweeps import MemorySweeps
from txtasks.driver.memory_tasks import MemoryTasks
from txtasks.driver.memory_topics import MemoryTopics


class MemoryDriver:
    """Tasks in a dict, guarded by a lock; claims are atomic like SKIP LOCKED on one host.

    A test may put a role of its own in place, built on the same store (a fault injected into
    the claims: `driver.claims = FlakyClaims(driver.store)`)."""

    capabilities: ClassVar[Capabilities] = Capabilities("memory", shared=False, transactions=False)

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.tasks: MemoryTasks = MemoryTasks(self.store)
        self.claims: MemoryClaims = MemoryClaims(self.store)
        self.topics: MemoryTopics = MemoryTopics(self.store)
        self.control: MemoryControl = MemoryControl(self.store)
        self.admin: MemoryAdmin = MemoryAdmin(self.store)
        self.sweeps: MemorySweeps = MemorySweeps(self.store)
        self.processes: MemoryProcesses = MemoryProcesses(self.store)
        self.dashboard: MemoryDashboard = MemoryDashboard(self.store)

    if not TYPE_CHECKING:  # for type checkers, the old names are gone

        def __getattr__(self, name: str) -> Any:
            """A contract method by its name from before the roles: see `moved_to_role`."""
            return moved_to_role(self, name)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def migrate(self) -> list[int]:
        return []

    async def ping(self) -> None:
        """Always reachable: it lives in this process."""


__all__ = [
    "MemoryAdmin",
    "MemoryClaims",
    "MemoryControl",
    "MemoryDashboard",
    "MemoryDriver",
    "MemoryProcesses",
    "MemoryStore",
    "MemorySweeps",
    "MemoryTasks",
    "MemoryTopics",
]
