"""What the keys benchmark's worker processes run: no-op tasks in one queue per case, each
queue with the key limits of its case (see tests/benchmarks/keys.py).

    python -m txtasks worker tests.benchmarks.keys_apps:app --queues keys-burn --burst ...
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path
from typing import Any

from txtasks import App, KeyLimits, Rate, TaskContext

#: Each case's queue and the limits of its keys (None: tasks without a key).
QUEUES: dict[str, KeyLimits | None] = {
    "keys-plain": None,
    "keys-burn": KeyLimits(concurrency=1),
    "keys-ordered": KeyLimits(ordered=True),
    "keys-hot": KeyLimits(concurrency=64),
    "keys-rate": KeyLimits(rate=Rate(50, per=1)),
    "keys-queue-rate": KeyLimits(),
}
#: Queues with a rate of their own (for all their tasks, with a key or without).
QUEUE_RATES = {"keys-queue-rate": Rate(100, per=1)}
RATE_PER_SECOND = 50

app = App("keys-bench")
for queue, limits in QUEUES.items():
    if limits is not None:
        app.key_limits(queue, limits)
for queue, rate in QUEUE_RATES.items():
    app.queue_rate(queue, rate)


#: Where each worker process writes when its handlers ran (`RUNS_DIR`/<pid>.runs, one line
#: per task: id, key, start, end in seconds): the archive's `started_at` is taken before the
#: claim's locks, so only the handlers can tell whether two tasks of a key ran at once.
RUNS_DIR = os.environ.get("TXTASKS_BENCH_RUNS_DIR")
_runs: list[tuple[int, str | None, float, float]] = []


@atexit.register
def _runs_save() -> None:
    if RUNS_DIR and _runs:
        lines = [f"{i}\t{key}\t{start!r}\t{end!r}\n" for i, key, start, end in _runs]
        Path(RUNS_DIR, f"{os.getpid()}.runs").write_text("".join(lines))


def _noop(payload: Any, ctx: TaskContext) -> None:
    """Nothing but noting when it ran: the benchmark measures the queue."""
    start = time.time()
    _runs.append((ctx.task_id, ctx.key, start, time.time()))


tasks = {queue: app.register(_noop, name=f"bench.{queue}", queue=queue) for queue in QUEUES}
