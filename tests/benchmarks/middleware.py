"""What the middleware machinery costs an attempt: the attempt runner of an earlier commit
(before middleware, results and progress existed) against today's, in the same process.

Each runner decides the outcome of the same claimed row (a no-op async handler) `--attempts`
times per round; rounds alternate between the runners, and the best round of each counts
(the least disturbed by the rest of the machine). Reported: microseconds per attempt, today's
minus the earlier one's, and their ratio; also today's with one middleware registered (with an
empty `before_attempt` and `after_attempt`). A report, not a pass/fail test:

    python -m tests.benchmarks.middleware --base afea714 --attempts 20000 --rounds 15
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
import types
from datetime import timedelta
from typing import Any

from txtasks import App, MemoryDriver
from txtasks.clock import utcnow
from txtasks.middleware import Middleware
from txtasks.worker.config import WorkerStats
from txtasks.worker.outcomes import OutcomeBuffer
from txtasks.worker.runner import Runner


def runner_before(base: str) -> type[Any]:
    """The `Runner` class of txtasks/worker/runner.py at commit `base`."""
    source = subprocess.check_output(["git", "show", f"{base}:txtasks/worker/runner.py"])
    module = types.ModuleType("txtasks_runner_before")
    module.__file__ = f"<{base}:txtasks/worker/runner.py>"
    sys.modules[module.__name__] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module.Runner  # type: ignore[no-any-return]


async def rows_of(app: App, count: int) -> list[Any]:
    """One claimed row of the benchmark task (the same row is decided again and again)."""
    await app.aenqueue("bench.noop", None)
    now = utcnow()
    rows = await app.driver.claims.task_claim_many(
        ["default"], count, now=now, lease_until=now + timedelta(hours=1), worker_id="bench"
    )
    return rows


def make(runner_class: type[Any], app: App) -> Any:
    outcomes = OutcomeBuffer(
        app.driver, app.clock, interval=1, max_batch=10, archive_completed=True
    )
    return runner_class(
        app,
        worker_id="bench",
        concurrency=1,
        stats=WorkerStats(),
        outcomes=outcomes,
        held=set(),
        slot_free=asyncio.Event(),
        stopping=asyncio.Event(),
        metrics=None,
    )


async def per_attempt(runner: Any, row: Any, attempts: int) -> float:
    """Seconds per attempt decided by `runner._attempt` (the handler is a no-op)."""
    key = row.key
    attempt = runner._attempt
    started = time.perf_counter()
    for _ in range(attempts):
        await attempt(row, key)
    return (time.perf_counter() - started) / attempts


async def main(base: str, attempts: int, rounds: int) -> None:
    plain = App("bench", driver=MemoryDriver())
    with_one = App("bench", driver=MemoryDriver(), middleware=[Middleware()])
    for app in (plain, with_one):
        app.task(name="bench.noop")(noop)
    row = (await rows_of(plain, 1))[0]
    before = make(runner_before(base), plain)
    today = make(Runner, plain)
    one = make(Runner, with_one)
    best = {"before": float("inf"), "today": float("inf"), "one middleware": float("inf")}
    for _ in range(rounds):
        for name, runner in (("before", before), ("today", today), ("one middleware", one)):
            best[name] = min(best[name], await per_attempt(runner, row, attempts))
    us = {name: seconds * 1e6 for name, seconds in best.items()}
    print(f"attempts per round: {attempts}, rounds: {rounds}, base: {base}")
    print("| runner | µs per attempt (best round) | vs before |")
    print("|---|---|---|")
    for name, value in us.items():
        delta = value - us["before"]
        print(f"| {name} | {value:.3f} | {delta:+.3f} µs ({value / us['before']:.3f}x) |")


async def noop(payload: Any) -> None:
    return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="afea714", help="the commit to compare with")
    parser.add_argument("--attempts", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=15)
    options = parser.parse_args()
    asyncio.run(main(options.base, options.attempts, options.rounds))
