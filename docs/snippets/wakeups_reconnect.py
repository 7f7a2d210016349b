"""Retrying an absent broker on a schedule of your own (by default: 0.1 s doubling, up to 3 s)."""

import os
import tempfile

from txtasks import App, Exponential
from txtasks.wakeup.amqp import AmqpNotifier

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/reconnect.sqlite3"
)
BROKER_URL = os.environ.get("TXTASKS_BROKER_URL") or "amqp://guest:guest@localhost/"

by_default = AmqpNotifier(BROKER_URL).reconnect
print("by default:", by_default)  # Exponential(base=0.1, factor=2.0, cap=3.0, jitter=True)

# Gentler on the broker, slower to resume: from 0.5 s, never more than 10 s between attempts.
notifier = AmqpNotifier(BROKER_URL, reconnect=Exponential(base=0.5, cap=10.0))
app = App(database_url=DATABASE_URL, notifier=notifier)  # nothing connects until it is used

waits = [notifier.reconnect.delay(failures) for failures in range(1, 20)]
assert all(0 <= wait <= 10.0 for wait in waits)
print(f"at most {max(waits):.1f} s between attempts")
