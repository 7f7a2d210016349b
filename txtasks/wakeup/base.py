"""The wake-up contract: what a notifier does, the message it carries, and its counters."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from txtasks.types import QUEUE_NAME_RE

#: Most task ids one message carries. A worker may claim the tasks named by primary key, always
#: from the table (a message naming a task that is not ready claims nothing).
MAX_IDS = 100
#: Largest message a subscriber reads; anything bigger is malformed.
MAX_MESSAGE_BYTES = 16 * 1024

#: The `kind` of a cancel wake-up: a cancel asks a running task of the queue to stop.
CANCEL = "cancel"
#: The routing key prefix of cancel wake-ups (no queue name holds a "/"): every worker of the
#: queue gets them, where an ordinary wake-up wakes one worker.
CANCEL_ROUTE = "cancel/"


class WakeupCallback(Protocol):
    """What a notifier calls for each wake-up: `cancel=True` for a cancel wake-up (a running
    task of `queue` was asked to stop: look for cancels); else new ready tasks (claim now),
    `ids` those the message named (at most `MAX_IDS`; none when it named none)."""

    def __call__(self, queue: str, *, cancel: bool = False, ids: Sequence[int] = ()) -> None: ...


@dataclass(frozen=True, slots=True)
class Wakeup:
    """A decoded wake-up message."""

    queue: str
    ids: list[int]
    #: A cancel wake-up (`"kind": "cancel"`); messages without a kind are ordinary ones.
    cancel: bool = False


@dataclass
class WakeupStats:
    """Counters of one notifier (published and received are per message)."""

    published: int = 0
    coalesced: int = 0
    dropped: int = 0
    received: int = 0
    #: Of `received`, the cancel wake-ups.
    cancels_received: int = 0
    malformed: int = 0
    #: The worker side: consuming wake-ups now.
    connected: bool = False
    #: The worker side: taking the shared queues' wake-ups now (not while its worker has no
    #: free slot: the broker gives them to other workers meanwhile).
    taking: bool = False


class Notifier(Protocol):
    """Publishes wake-ups after commit, and delivers them to workers."""

    stats: WakeupStats

    def notify(self, queue: str, ids: Sequence[int] = (), *, cancel: bool = False) -> None:
        """Announce new ready tasks of `queue` (one of its workers claims), or with
        `cancel=True` that running tasks `ids` of it were asked to stop (every worker of the
        queue looks for cancels). Thread-safe, never blocks, never raises."""

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

    def notify(self, queue: str, ids: Sequence[int] = (), *, cancel: bool = False) -> None:
        return None

    async def subscribe(self, queues: Sequence[str], on_wakeup: WakeupCallback) -> None:
        return None

    async def unsubscribe(self) -> None:
        return None

    async def close(self) -> None:
        return None


def wakeup_encode(queue: str, ids: Sequence[int], *, cancel: bool = False) -> bytes:
    """The message body: small JSON naming the queue and (some of) the task ids, and for a
    cancel wake-up `"kind": "cancel"` (a message without a kind is an ordinary wake-up)."""
    data: dict[str, Any] = {"queue": queue, "ids": list(ids[:MAX_IDS])}
    if cancel:
        data["kind"] = CANCEL
    return json.dumps(data, separators=(",", ":")).encode()


def wakeup_read(body: bytes) -> Wakeup | None:
    """The wake-up a message carries, or None when it is malformed (never raises). A kind
    other than "cancel" reads as an ordinary wake-up: waking a worker is always harmless."""
    if len(body) > MAX_MESSAGE_BYTES:
        return None
    try:
        data: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    queue, ids, kind = data.get("queue"), data.get("ids", []), data.get("kind")
    if not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue):
        return None
    if not isinstance(ids, list) or len(ids) > MAX_IDS:
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return None
    if kind is not None and not isinstance(kind, str):
        return None
    return Wakeup(queue, ids, cancel=kind == CANCEL)


def wakeup_decode(body: bytes) -> tuple[str, list[int]] | None:
    """The queue and ids of a message, or None when it is malformed (never raises)."""
    wakeup = wakeup_read(body)
    return None if wakeup is None else (wakeup.queue, wakeup.ids)


def cancel_route(queue: str) -> str:
    """The routing key of `queue`'s cancel wake-ups."""
    return CANCEL_ROUTE + queue
