"""What the keys benchmark's worker processes run: no-op tasks in one queue per case, each
queue with the key limits of its case (see tests/benchmarks/keys.py).

    python -m txtasks worker tests.benchmarks.keys_apps:app --queues keys-burn --burst ...
"""

from __future__ import annotations

from typing import Any

from txtasks import App, KeyLimits, Rate

#: Each case's queue and the limits of its keys (None: tasks without a key).
QUEUES: dict[str, KeyLimits | None] = {
    "keys-plain": None,
    "keys-burn": KeyLimits(concurrency=1),
    "keys-ordered": KeyLimits(ordered=True),
    "keys-hot": KeyLimits(concurrency=64),
    "keys-rate": KeyLimits(rate=Rate(50, per=1)),
}
RATE_PER_SECOND = 50

app = App("keys-bench")
for queue, limits in QUEUES.items():
    if limits is not None:
        app.key_limits(queue, limits)


def _noop(payload: Any) -> None:
    """Nothing: the benchmark measures the queue."""


tasks = {queue: app.register(_noop, name=f"bench.{queue}", queue=queue) for queue in QUEUES}
