"""The wake-up contract: what a notifier does, the message it carries, and its counters."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from txtasks.types import QUEUE_NAME_RE

#: Most task ids one message carries (they are informative only: workers claim from the table).
MAX_IDS = 100
#: Largest message a subscriber reads; anything bigger is malformed.
MAX_MESSAGE_BYTES = 16 * 1024

WakeupCallback = Callable[[str], None]


@dataclass
class WakeupStats:
    """Counters of one notifier (published and received are per message)."""

    published: int = 0
    coalesced: int = 0
    dropped: int = 0
    received: int = 0
    malformed: int = 0
    #: The worker side: consuming wake-ups now.
    connected: bool = False


class Notifier(Protocol):
    """Publishes wake-ups after commit, and delivers them to workers."""

    stats: WakeupStats

    def notify(self, queue: str, ids: Sequence[int] = ()) -> None:
        """Announce new ready tasks of `queue`. Thread-safe, never blocks, never raises."""

    async def subscribe(self, queues: Sequence[str], on_wakeup: WakeupCallback) -> None:
        """Start calling `on_wakeup(queue)` for wake-ups of these queues; returns at once."""

    async def unsubscribe(self) -> None:
        """Stop consuming (a worker that stops); publishing goes on."""

    async def close(self) -> None:
        """Stop publishing and consuming; pending hints are dropped."""


class NullNotifier:
    """No broker: workers find tasks by polling alone."""

    def __init__(self) -> None:
        self.stats = WakeupStats()

    def notify(self, queue: str, ids: Sequence[int] = ()) -> None:
        return None

    async def subscribe(self, queues: Sequence[str], on_wakeup: WakeupCallback) -> None:
        return None

    async def unsubscribe(self) -> None:
        return None

    async def close(self) -> None:
        return None


def wakeup_encode(queue: str, ids: Sequence[int]) -> bytes:
    """The message body: small JSON naming the queue and (some of) the new task ids."""
    return json.dumps({"queue": queue, "ids": list(ids[:MAX_IDS])}, separators=(",", ":")).encode()


def wakeup_decode(body: bytes) -> tuple[str, list[int]] | None:
    """The queue and ids of a message, or None when it is malformed (never raises)."""
    if len(body) > MAX_MESSAGE_BYTES:
        return None
    try:
        data: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    queue, ids = data.get("queue"), data.get("ids", [])
    if not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue):
        return None
    if not isinstance(ids, list) or len(ids) > MAX_IDS:
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return None
    return queue, ids
