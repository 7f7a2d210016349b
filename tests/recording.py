"""A notifier for tests that records the wake-ups it is asked to send, and sends none."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from txtasks.wakeup.base import WakeupStats


class Recording:
    """A notifier that records the wake-ups it is asked to send."""

    def __init__(self) -> None:
        self.stats = WakeupStats()
        self.calls: list[tuple[str, list[int]]] = []

    def notify(self, queue: str, ids: Sequence[int] = (), *, cancel: bool = False) -> None:
        self.calls.append((queue, list(ids)))

    async def subscribe(self, queues: Sequence[str], on_wakeup: Any) -> None:
        return None

    async def unsubscribe(self) -> None:
        return None

    async def close(self) -> None:
        return None
