"""Fifty workers through PgBouncer in transaction pooling mode: 20,000 tasks, none lost, none run
twice.

Fifty `txtasks worker` processes and a `txtasks cleaner`, each with `--db-connections 3`,
reach PostgreSQL through the PgBouncer of tests/services.sh (`?pooler=transaction`, 20 server
connections for the database) and are woken through RabbitMQ. The test enqueues 20,000 tasks
through PgBouncer too, in transactions of 500, while they run; one task in ten writes a row in
its transactional completion. Then, from the database: every task archived as completed at its
first attempt (no task claimed twice), one run row per task that writes one, none live. The
kernel's count of each process's connections to PgBouncer stays within the budget, and
PgBouncer never opened more than its pool. No timing is asserted:
`python -m tests.benchmarks.pgbouncer` measures (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from tests import pace
from tests.benchmarks.pgbouncer import Crowd

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.postgresql,
    pytest.mark.rabbitmq,
    pytest.mark.timeout(300),
]

WORKERS = 50
TASKS = 20_000
BATCH = 500
#: One task in this many writes a row in its own transaction.
TX_EVERY = 10
BUDGET = 3
#: PgBouncer's default_pool_size in tests/services.sh.
SERVER_POOL = 20


async def enqueue(crowd: Crowd) -> None:
    """TASKS tasks in transactions of BATCH through PgBouncer, one in TX_EVERY writing."""
    writing = TASKS // TX_EVERY
    await crowd.enqueue_bulk(writing, BATCH, tx=True)
    await crowd.enqueue_bulk(TASKS - writing, BATCH, tx=False)


def test_fifty_workers_behind_pgbouncer_run_every_task_once(
    postgres_url: str, pgbouncer_url: str, amqp_url: str, tmp_path: Path
) -> None:
    crowd = Crowd(
        pgbouncer_url, postgres_url, amqp_url, tmp_path, workers=WORKERS, connections=BUDGET
    )
    timings: dict[str, float] = {}
    try:
        crowd.prepare()
        t = time.monotonic()
        crowd.start()
        crowd.wait_serving(timeout=pace.seconds(150))
        timings["start"] = time.monotonic() - t
        t = time.monotonic()
        asyncio.run(enqueue(crowd))
        crowd.wait_finished(TASKS, timeout=pace.seconds(150))
        timings["run"] = time.monotonic() - t
        t = time.monotonic()
        codes = crowd.stop()
        timings["stop"] = time.monotonic() - t
        verdict = crowd.verdict(TASKS)
        logs = [path.read_text(errors="replace") for path in crowd.logs]
    finally:
        crowd.close()
    held = max(crowd.sampled.per_process.values(), default=0)
    print(f"\n{WORKERS} workers behind PgBouncer: {timings}; at most {held} connections per")
    print(f"process, {crowd.sampled.server} server connections")

    assert verdict.problems(runs_expected=TASKS // TX_EVERY) == []
    assert (verdict.completed, verdict.lost, verdict.twice, verdict.live) == (TASKS, 0, 0, 0)
    assert codes == [0] * (WORKERS + 1), [log[-2000:] for log in logs if "Traceback" in log]
    assert len(crowd.sampled.per_process) == WORKERS + 1
    assert max(crowd.sampled.per_process.values()) <= BUDGET, crowd.sampled
    assert crowd.sampled.server <= SERVER_POOL
    # the wake-ups came through RabbitMQ (workers' stats as they stopped)
    wakeups = sum(int(n) for log in logs for n in re.findall(r"\bwakeups=(\d+)", log))
    assert wakeups > 0
    assert not [log for log in logs if "Traceback" in log or " ERROR " in log]
