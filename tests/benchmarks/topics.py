"""Topics: what a publish to N groups costs against enqueueing the same N tasks directly, and
the burn-down of 3 groups, in one run per database.

    python -m tests.benchmarks.topics --sqlite [--runs 3] [--output topics.md]

(`TXTASKS_BENCH_POSTGRES_URL` / `TXTASKS_BENCH_MYSQL_URL` name the servers, as for the other
benchmarks; their txtasks tables are dropped.) For 1, 3 and 10 groups subscribed to one topic:

1. single: `--single` transactions of one publish each (`app.topics.publish_tx` on a sync
   `Connection`), against as many transactions each enqueueing the same tasks directly (one
   task per group, `app.enqueue_many_tx`);
2. bulk: `--bulk` publishes in transactions of `--batch` (`app.topics.publish_many_tx`), against the
   same tasks enqueued in bulk (`app.enqueue_many_tx` of batch x groups rows).

Each case first runs one batch in a rolled-back transaction on its engine, so that building
and compiling the statements (once per engine in an application) is not timed.

Rates are publishes (events) per second of wall time in one process; the tasks written are
events x groups. Then the burn-down: `--burn` publishes to 3 groups run by `--processes` worker
processes (`txtasks worker --burst`, no-op handlers), against the same tasks enqueued directly;
tasks per second = tasks / (last finish - first start) from the archive.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from tests.benchmarks import topics_apps as apps
from tests.benchmarks.latency import REPO, machine_info, masked, tables_reset, versions
from tests.benchmarks.throughput import run_processes
from txtasks import App, create_engine
from txtasks.schema.tables import archive

LABELS = {"postgresql": "PostgreSQL", "mysql": "MariaDB", "sqlite": "SQLite"}
GROUP_COUNTS = (1, 3, 10)


async def subscribed(url: str, groups: int) -> App:
    """A fresh schema with the first `groups` groups subscribed; an App on it."""
    tables_reset(url)
    app = App("topics-bench", database_url=url)
    subs = [s for s in apps.app.subscriptions if int(s.group[1:]) < groups]
    await app.driver.topics.subscription_set_many(subs, now=app.clock())
    return app


def direct_rows(app: App, groups: int, n: int) -> list[Any]:
    """The tasks a publish gives `groups` groups, built as direct enqueues."""
    return [app.new_task(apps.tasks[g], {"n": n}) for g in range(groups)]


def warm_up(engine: Any, app: App, groups: int, batch: int, *, topic: bool) -> None:
    """Build and compile the statements of a batch in a rolled-back transaction: an
    application's engine lives long, so compiling is paid once, not per call."""
    with engine.connect() as conn, conn.begin() as tx:
        if topic:
            app.topics.publish_many_tx(
                conn, [app.topics.new_publish(apps.TOPIC, n) for n in range(batch)]
            )
        else:
            app.enqueue_many_tx(
                conn, [r for n in range(batch) for r in direct_rows(app, groups, n)]
            )
        tx.rollback()


def timed_single(url: str, app: App, groups: int, count: int, *, topic: bool) -> float:
    engine = create_engine(url)
    try:
        warm_up(engine, app, groups, 1, topic=topic)
        began = time.perf_counter()
        for n in range(count):
            with engine.begin() as conn:
                if topic:
                    app.topics.publish_tx(conn, apps.TOPIC, {"n": n})
                else:
                    app.enqueue_many_tx(conn, direct_rows(app, groups, n))
        return count / (time.perf_counter() - began)
    finally:
        engine.dispose()


def timed_bulk(url: str, app: App, groups: int, count: int, batch: int, *, topic: bool) -> float:
    engine = create_engine(url)
    try:
        warm_up(engine, app, groups, batch, topic=topic)
        began = time.perf_counter()
        for start in range(0, count, batch):
            with engine.begin() as conn:
                ns = range(start, min(count, start + batch))
                if topic:
                    app.topics.publish_many_tx(
                        conn, [app.topics.new_publish(apps.TOPIC, {"n": n}) for n in ns]
                    )
                else:
                    rows = [r for n in ns for r in direct_rows(app, groups, n)]
                    app.enqueue_many_tx(conn, rows)
        return count / (time.perf_counter() - began)
    finally:
        engine.dispose()


def task_count(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(apps_tasks())).scalar_one())
    finally:
        engine.dispose()


def apps_tasks() -> Any:
    from txtasks.schema.tables import tasks

    return tasks


async def publish_case(url: str, groups: int, mode: str, topic: bool, args: Any) -> float:
    app = await subscribed(url, groups)
    try:
        if mode == "single":
            rate = timed_single(url, app, groups, args.single, topic=topic)
            expected = args.single * groups
        else:
            rate = timed_bulk(url, app, groups, args.bulk, args.batch, topic=topic)
            expected = args.bulk * groups
        assert task_count(url) == expected, "every group got every event"
        return rate
    finally:
        await app.aclose()


async def burn_case(url: str, topic: bool, args: Any) -> float:
    app = await subscribed(url, 3)
    try:
        timed_bulk(url, app, 3, args.burn, args.batch, topic=topic)
    finally:
        await app.aclose()
    argv = [
        sys.executable, "-m", "txtasks", "worker", "tests.benchmarks.topics_apps:app",
        "--database-url", url, "--queue", "t0", "--queue", "t1", "--queue", "t2", "--burst",
        "--burst-horizon", "1", "--concurrency", str(args.concurrency), "--log-level", "warning",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as logs:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        await run_processes([argv] * args.processes, env, Path(logs), args.timeout)
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            query = select(
                func.count(), func.min(archive.c.started_at), func.max(archive.c.finished_at)
            ).where(archive.c.state == "completed")
            done, first, last = conn.execute(query).one()
    finally:
        engine.dispose()
    assert done == 3 * args.burn, f"{done} of {3 * args.burn} tasks completed"
    return float(done) / (last - first).total_seconds()


def report(results: dict[tuple[str, str, str], list[float]]) -> str:
    lines = [
        "| backend | case | runs | topic: events/s median (min-max) | direct: events/s median "
        "| topic / direct |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (backend, case, kind), rates in results.items():
        if kind != "topic":
            continue
        direct = results.get((backend, case, "direct"), [])
        unit = "tasks/s" if case.startswith("burn") else "events/s"
        ratio = statistics.median(rates) / statistics.median(direct) if direct else float("nan")
        lines.append(
            f"| {LABELS[backend]} | {case} | {len(rates)} | {statistics.median(rates):,.0f} "
            f"({min(rates):,.0f}-{max(rates):,.0f}) {unit if unit != 'events/s' else ''} | "
            f"{statistics.median(direct):,.0f} | {ratio:.2f}x |"
        )
    info = [f"- {line}" for line in machine_info()]
    info += [f"- {name}: {version}" for name, version in versions().items()]
    command = "python -m tests.benchmarks.topics " + " ".join(sys.argv[1:])
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
        urls["sqlite"] = f"sqlite:///{args.sqlite or tempfile.mkdtemp() + '/topics.sqlite3'}"
    if not urls:
        raise SystemExit("no database: TXTASKS_BENCH_*_URL or --sqlite")
    results: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for run in range(args.runs):
        for backend, url in urls.items():
            print(f"[run {run + 1}/{args.runs}] {LABELS[backend]} ({masked(url)})", flush=True)
            for groups in GROUP_COUNTS:
                for mode in ("single", "bulk"):
                    case = f"{mode}, {groups} group{'s' if groups > 1 else ''}"
                    for topic in (True, False):  # interleaved, so drifts hit both alike
                        rate = await publish_case(url, groups, mode, topic, args)
                        results[(backend, case, "topic" if topic else "direct")].append(rate)
                    print(f"  {case}: {results[(backend, case, 'topic')][-1]:,.0f} events/s "
                          f"vs {results[(backend, case, 'direct')][-1]:,.0f}", flush=True)  # fmt: skip
            if args.burn:
                case = f"burn-down, 3 groups x {args.burn:,}"
                for topic in (True, False):
                    rate = await burn_case(url, topic, args)
                    results[(backend, case, "topic" if topic else "direct")].append(rate)
                print(f"  {case}: {results[(backend, case, 'topic')][-1]:,.0f} tasks/s "
                      f"vs {results[(backend, case, 'direct')][-1]:,.0f}", flush=True)  # fmt: skip
    return report(results)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.topics",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--sqlite", nargs="?", const="", help="also SQLite (a file)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--single", type=int, default=1000, help="one-publish transactions")
    parser.add_argument("--bulk", type=int, default=10_000, help="publishes in bulk")
    parser.add_argument("--batch", type=int, default=500, help="publishes per bulk transaction")
    parser.add_argument("--burn", type=int, default=10_000, help="events burnt down by 3 groups")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--output", help="write the report (markdown) here too")
    args = parser.parse_args(argv)
    text = asyncio.run(amain(args))
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
