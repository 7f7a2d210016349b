"""Wake-ups: a hint sent after commit so an idle worker claims at once instead of at its next poll.

The row is the truth; a wake-up only saves latency. Losing one delays a task, never loses it.
"""

from txtasks.wakeup.base import (
    Notifier,
    NullNotifier,
    WakeupStats,
    notifier_for_url,
    wakeup_decode,
    wakeup_encode,
)
from txtasks.wakeup.commit import wakeup_after_commit

__all__ = [
    "Notifier",
    "NullNotifier",
    "WakeupStats",
    "notifier_for_url",
    "wakeup_after_commit",
    "wakeup_decode",
    "wakeup_encode",
]
