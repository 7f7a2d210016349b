"""Keys: what limits per key cost, and whether they hold, in one run per database.

    python -m tests.benchmarks.keys --sqlite [--runs 3] [--output keys.md]

(`TXTASKS_BENCH_POSTGRES_URL` / `TXTASKS_BENCH_MYSQL_URL` name the servers, as for the other
benchmarks.) Every case preloads its tasks, then runs `--processes` worker processes of
`--concurrency` each (`txtasks worker --burst`) until its queue is empty, and reads what happened
from the archive (every completed task keeps `started_at` and `finished_at`) and, for order and
overlaps, from the times the handlers themselves noted:

1. plain: N tasks without a key (the reference);
2. burn: N tasks over N/10 keys, concurrency 1 per key; its ratio to plain is the cost of keys;
3. ordered: 100 keys in order; checks that every key's tasks started in enqueue order, one at a
   time;
4. hot: one key with most of the tasks (concurrency 64) and 1,000 cold keys of 10 each; when
   the last cold task finished against when the hot key finished;
5. rate: 4 keys at 50 starts/s each; the starts per second measured per key;
6. queue rate: a queue at 100 starts/s in all (100 tasks without a key, 3 keys of 100); the
   starts per second measured over the queue.

Throughput is tasks / (last finish - first start), so process start-up is left out. The CPU the
worker processes used, per task, is reported too (start-up and exit included): on a busy machine
it moves less than throughput does.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from tests.benchmarks import keys_apps as apps
from tests.benchmarks.latency import REPO, machine_info, masked, tables_reset, versions
from tests.benchmarks.throughput import run_processes
from txtasks import App, create_engine
from txtasks.schema.tables import archive

LABELS = {"postgresql": "PostgreSQL", "mysql": "MariaDB", "sqlite": "SQLite"}
CHUNK = 5000


@dataclass
class Case:
    queue: str
    label: str
    #: (key or None, tasks of it) in enqueue order; keys interleaved task by task
    layout: list[tuple[str | None, int]]

    @property
    def n(self) -> int:
        return sum(count for _key, count in self.layout)


def cases(n: int, ordered: int, hot: int) -> list[Case]:
    keys = max(1, n // 10)
    return [
        Case("keys-plain", "no key", [(None, n)]),
        Case(
            "keys-burn", f"{keys:,} keys x 10, concurrency 1", [(f"k{i}", 10) for i in range(keys)]
        ),
        Case(
            "keys-ordered",
            f"100 ordered keys x {ordered:,}",
            [(f"o{i}", ordered) for i in range(100)],
        ),
        Case(
            "keys-hot",
            f"hot key x {hot:,} + 1,000 cold keys x 10",
            [("hot", hot), *[(f"c{i}", 10) for i in range(1000)]],
        ),
        Case("keys-rate", "4 keys x 100 at 50/s", [(f"r{i}", 100) for i in range(4)]),
        Case(
            "keys-queue-rate",
            "queue at 100/s: 100 without a key + 3 keys x 100",
            [(None, 100), *[(f"q{i}", 100) for i in range(3)]],
        ),
    ]


async def preload(url: str, case: Case) -> None:
    """The case's tasks, the hot key's first (so that the cold ones arrive behind them)."""
    task = apps.tasks[case.queue]
    rows = []
    if case.queue == "keys-hot":
        rows = [task.new({"n": i}, key=k) for k, count in case.layout for i in range(count)]
    else:
        longest = max(count for _k, count in case.layout)
        for i in range(longest):
            rows += [task.new({"n": i}, key=k) for k, count in case.layout if i < count]
    app = App("keys-preload", database_url=url)
    try:
        for start in range(0, len(rows), CHUNK):
            await app.aenqueue_many(rows[start : start + CHUNK])
    finally:
        await app.aclose()


def archived(url: str, queue: str) -> list[Any]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            query = select(
                archive.c.id, archive.c.partition_key, archive.c.started_at, archive.c.finished_at
            ).where(archive.c.queue == queue, archive.c.state == "completed")
            return list(conn.execute(query))
    finally:
        engine.dispose()


def seconds(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


@dataclass(frozen=True)
class Run:
    """When a task's handler ran, as the handler saw it (seconds since the epoch)."""

    task_id: int
    key: str
    start: float
    end: float


def runs_read(folder: Path) -> list[Run]:
    """What the worker processes' handlers noted (`keys_apps.RUNS_DIR`)."""
    runs = []
    for path in folder.glob("*.runs"):
        for line in path.read_text().splitlines():
            task_id, key, start, end = line.split("\t")
            runs.append(Run(int(task_id), key, float(start), float(end)))
    return runs


def measure(case: Case, rows: list[Any], runs: list[Run]) -> dict[str, Any]:
    """Throughput from the archive; order and overlaps from the handlers' own times (the
    archive's `started_at` is taken before a claim's locks, so a task may look as if it started
    before the one it waited for ended)."""
    if len(rows) != case.n:
        raise RuntimeError(f"{case.queue}: {len(rows)} of {case.n} tasks completed")
    first = min(r.started_at for r in rows)
    last = max(r.finished_at for r in rows)
    result: dict[str, Any] = {"tasks/s": case.n / seconds(first, last)}
    by_key: dict[str | None, list[Any]] = defaultdict(list)
    for r in rows:
        by_key[r.partition_key].append(r)
    ran: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        ran[run.key].append(run)
    if case.queue in ("keys-ordered", "keys-burn") and len(runs) != case.n:
        raise RuntimeError(f"{case.queue}: {len(runs)} handler runs noted for {case.n} tasks")
    if case.queue == "keys-ordered":
        for key, key_runs in ran.items():
            key_runs.sort(key=lambda r: r.task_id)
            for a, b in itertools.pairwise(key_runs):
                if b.start < a.end:
                    raise RuntimeError(
                        f"ordered key {key}: task {b.task_id} started before {a.task_id} ended"
                    )
        result["in order"] = "every key"
    if case.queue == "keys-burn":
        result["overlaps"] = overlaps(ran)
    if case.queue == "keys-hot":
        cold = [r for k, key_rows in by_key.items() if k != "hot" for r in key_rows]
        hot_end = max(r.finished_at for r in by_key["hot"])
        cold_end = max(r.finished_at for r in cold)
        result["cold done at"] = seconds(first, cold_end) / seconds(first, hot_end)
    if case.queue == "keys-queue-rate":
        starts = sorted(r.started_at for r in rows)
        result["starts/s in all"] = (len(starts) - 1) / seconds(starts[0], starts[-1])
    if case.queue == "keys-rate":
        rates = []
        for key_rows in by_key.values():
            starts = sorted(r.started_at for r in key_rows)
            rates.append((len(starts) - 1) / seconds(starts[0], starts[-1]))
        result["starts/s per key"] = statistics.median(rates)
        result["rate max"] = max(rates)
    return result


def overlaps(ran: dict[str, list[Run]]) -> int:
    """Handler runs of one key that overlapped (concurrency 1: must be 0)."""
    found = 0
    for key_runs in ran.values():
        key_runs.sort(key=lambda r: r.start)
        for a, b in itertools.pairwise(key_runs):
            found += b.start < a.end
    return found


async def run_case(url: str, case: Case, args: argparse.Namespace) -> dict[str, Any]:
    tables_reset(url)
    await preload(url, case)
    argv = [
        sys.executable, "-m", "txtasks", "worker", "tests.benchmarks.keys_apps:app",
        "--database-url", url, "--queue", case.queue, "--burst", "--burst-horizon", "1",
        "--concurrency", str(args.concurrency), "--log-level", "warning",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as logs:
        env = {**os.environ, "PYTHONPATH": str(REPO), "TXTASKS_BENCH_RUNS_DIR": logs}
        _ended, cpu = await run_processes([argv] * args.processes, env, Path(logs), args.timeout)
        runs = runs_read(Path(logs))
    result = measure(case, archived(url, case.queue), runs)
    result["worker cpu µs/task"] = cpu / case.n * 1e6  # start-up and exit included
    return result


def report(results: dict[tuple[str, str], list[dict[str, Any]]], args: argparse.Namespace) -> str:
    lines = [
        "| backend | case | runs | tasks/s median (min-max) | vs no key | checks |",
        "|---|---|---:|---:|---:|---|",
    ]
    for (backend, label), runs in results.items():
        rates = [r["tasks/s"] for r in runs]
        plain = results.get((backend, "no key"))
        ratio = ""
        if plain:
            ratio = (
                f"{statistics.median(rates) / statistics.median(r['tasks/s'] for r in plain):.2f}x"
            )
        checks = []
        checks_named = ("in order", "overlaps", "cold done at", "starts/s per key", "rate max")
        for name in (*checks_named, "starts/s in all", "worker cpu µs/task"):
            values = [r[name] for r in runs if name in r]
            if values:
                shown = (
                    values[0] if isinstance(values[0], str) else f"{statistics.median(values):.2f}"
                )
                checks.append(f"{name}: {shown}")
        lines.append(
            f"| {LABELS[backend]} | {label} | {len(runs)} | {statistics.median(rates):,.0f} "
            f"({min(rates):,.0f}-{max(rates):,.0f}) | {ratio} | {'; '.join(checks)} |"
        )
    info = [f"- {line}" for line in machine_info()]
    info += [f"- {name}: {version}" for name, version in versions().items()]
    command = "python -m tests.benchmarks.keys " + " ".join(sys.argv[1:])
    return "\n".join([*lines, "", *info, f"- Command: `{command}`", ""])


async def amain(args: argparse.Namespace) -> str:
    urls = {}
    for backend, env in (
        ("postgresql", "TXTASKS_BENCH_POSTGRES_URL"),
        ("mysql", "TXTASKS_BENCH_MYSQL_URL"),
    ):
        if os.environ.get(env):
            urls[backend] = os.environ[env]
    if args.sqlite is not None:
        urls["sqlite"] = f"sqlite:///{args.sqlite or tempfile.mkdtemp() + '/keys.sqlite3'}"
    if not urls:
        raise SystemExit("no database: TXTASKS_BENCH_*_URL or --sqlite")
    results: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for run in range(args.runs):
        for backend, url in urls.items():
            small = backend != "postgresql"
            n = args.tasks_other if small else args.tasks
            for case in cases(n, args.ordered, args.hot if not small else args.hot // 5):
                if args.only and not any(o in case.queue for o in args.only.split(",")):
                    continue
                began = time.monotonic()
                print(
                    f"[run {run + 1}/{args.runs}] {LABELS[backend]} ({masked(url)}): {case.label}",
                    flush=True,
                )
                result = await run_case(url, case, args)
                print(f"  {result} in {time.monotonic() - began:.0f}s", flush=True)
                results[(backend, case.label)].append(result)
    return report(results, args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.keys",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--sqlite", nargs="?", const="", help="also SQLite (a file)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=100_000, help="plain and burn N, PostgreSQL")
    parser.add_argument("--tasks-other", type=int, default=20_000, help="the same, elsewhere")
    parser.add_argument("--ordered", type=int, default=200, help="tasks per ordered key")
    parser.add_argument("--hot", type=int, default=100_000, help="the hot key's tasks (PostgreSQL)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--only", help="comma-separated substrings of queues, e.g. burn,plain")
    parser.add_argument("--output", help="write the report (markdown) here too")
    args = parser.parse_args(argv)
    text = asyncio.run(amain(args))
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
