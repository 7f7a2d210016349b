"""What `txtasks demo` runs: enqueue thousands of tasks in transactions, run workers, check the
guarantees (imported only when the demo runs)."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy import Engine, delete, func, select

from txtasks.app import ENV_BROKER_URL, ENV_DATABASE_URL
from txtasks.cli.demo_app import MAX_ATTEMPTS, QUEUE, app, effects, metadata, orders
from txtasks.driver.urls import url_safe
from txtasks.engines import create_engine
from txtasks.schema.migrate import migrate
from txtasks.schema.tables import archive, tasks
from txtasks.wakeup import notifier_for_url

APP_SPEC = "txtasks.cli.demo_app:app"


@dataclass
class Plan:
    """What the demo enqueued: order number -> kind, and the rolled-back order numbers."""

    kinds: dict[int, str] = field(default_factory=dict)
    rolled_back: set[int] = field(default_factory=set)

    @property
    def committed(self) -> dict[int, str]:
        return {n: k for n, k in self.kinds.items() if n not in self.rolled_back}


def _engine(url: str) -> Engine:
    return create_engine(url)


def _prepare(engine: Engine) -> None:
    """Migrate, and start from a clean demo queue and demo tables."""
    with engine.begin() as conn:
        migrate(conn)
    with engine.begin() as conn:
        metadata.drop_all(conn)
        metadata.create_all(conn)
        conn.execute(delete(tasks).where(tasks.c.queue == QUEUE))
        conn.execute(delete(archive).where(archive.c.queue == QUEUE))


def _enqueue(
    engine: Engine,
    plan: Plan,
    count: int,
    rng: random.Random,
    progress: Progress,
    rollback: float,
    flaky: float,
    poison: float,
) -> None:
    """Transactions of 1-5 orders, each order row written with its task; some roll back."""
    bar = progress.add_task("enqueue in transactions", total=count)
    order_no = 0
    while order_no < count:
        size = min(rng.randint(1, 5), count - order_no)
        roll_back = rng.random() < rollback
        with engine.connect() as conn, conn.begin() as tx:
            rows = []
            for _ in range(size):
                order_no += 1
                draw = rng.random()
                kind = "poison" if draw < poison else "flaky" if draw < poison + flaky else "ok"
                plan.kinds[order_no] = kind
                conn.execute(orders.insert().values(order_no=order_no, kind=kind))
                rows.append(
                    app.new_task(
                        "demo.process_order",
                        {"order_no": order_no, "kind": kind},
                        dedup_key=f"demo-order-{order_no}",
                    )
                )
            app.enqueue_many_tx(conn, rows)
            if roll_back:
                plan.rolled_back.update(range(order_no - size + 1, order_no + 1))
                tx.rollback()
            else:
                tx.commit()
        progress.update(bar, completed=order_no)


def _run_workers(
    url: str, workers: int, concurrency: int, progress: Progress, total: int, engine: Engine
) -> list[int]:
    """Start worker processes in burst mode and show progress until they all exit.

    They inherit TXTASKS_BROKER_URL, so with a broker they are woken by RabbitMQ.
    """
    env = {**os.environ, ENV_DATABASE_URL: url}
    command = [
        sys.executable,
        "-m",
        "txtasks",
        "worker",
        APP_SPEC,
        "--burst",
        "--burst-horizon",
        "2",
        "--concurrency",
        str(concurrency),
        "--poll-interval",
        "0.05",
        "--lease",
        "30",
        "--log-level",
        "warning",
    ]
    procs = [subprocess.Popen(command, env=env) for _ in range(workers)]
    done_bar = progress.add_task(f"finish with {workers} worker processes", total=total)
    retry_bar = progress.add_task("retries scheduled", total=None)
    try:
        while True:
            finished, retried = _progress_counts(engine)
            progress.update(done_bar, completed=finished)
            progress.update(retry_bar, completed=retried)
            if all(p.poll() is not None for p in procs):
                break
            time.sleep(0.2)  # a progress display refresh, not a wait for a condition
    finally:
        for proc in procs:  # on Ctrl-C or an error, no worker is left behind
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            proc.wait()
    finished, _ = _progress_counts(engine)
    progress.update(done_bar, completed=finished)
    return [p.returncode for p in procs]


def _progress_counts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        finished = conn.execute(
            select(func.count()).select_from(archive).where(archive.c.queue == QUEUE)
        ).scalar_one()
        retried = conn.execute(
            select(func.coalesce(func.sum(archive.c.attempt - 1), 0)).where(
                archive.c.queue == QUEUE
            )
        ).scalar_one()
    return int(finished), int(retried)


def _verify(engine: Engine, plan: Plan) -> list[tuple[str, bool, str]]:
    """Check the guarantees from the database; each check: (what, passed, detail)."""
    with engine.connect() as conn:
        archived = conn.execute(
            select(archive.c.dedup_key, archive.c.state, archive.c.attempt).where(
                archive.c.queue == QUEUE
            )
        ).all()
        live = conn.execute(
            select(func.count()).select_from(tasks).where(tasks.c.queue == QUEUE)
        ).scalar_one()
        effect_rows = conn.execute(select(effects.c.order_no)).scalars().all()
        order_rows = set(conn.execute(select(orders.c.order_no)).scalars().all())
    by_order = Counter(int(k.rsplit("-", 1)[1]) for k, _, _ in archived)
    final = {int(k.rsplit("-", 1)[1]): (s, a) for k, s, a in archived}
    effect_count = Counter(effect_rows)
    committed = plan.committed

    def ids(kind: str) -> list[int]:
        return [n for n, k in committed.items() if k == kind]

    def bad(items: list[int]) -> str:
        return f"{len(items)} wrong, e.g. {items[:5]}" if items else "ok"

    leaked = sorted(
        n for n in plan.rolled_back if n in by_order or effect_count[n] or n in order_rows
    )
    not_once = sorted(n for n in committed if by_order[n] != 1)
    effects_wrong = sorted(
        n for n in committed if effect_count[n] != (0 if committed[n] == "poison" else 1)
    )
    ok_wrong = sorted(n for n in ids("ok") if final.get(n) != ("completed", 1))
    flaky_wrong = sorted(n for n in ids("flaky") if final.get(n) != ("completed", 2))
    poison_wrong = sorted(n for n in ids("poison") if final.get(n) != ("dead", MAX_ATTEMPTS))
    return [
        (
            f"{len(plan.rolled_back)} rolled-back tasks never existed and never ran",
            not leaked,
            bad(leaked),
        ),
        (
            f"{len(committed)} committed tasks finished exactly once",
            not not_once and live == 0,
            bad(not_once) + ("" if live == 0 else f"; {live} still live"),
        ),
        ("each successful task took effect exactly once", not effects_wrong, bad(effects_wrong)),
        (f"{len(ids('ok'))} ok tasks completed at the first attempt", not ok_wrong, bad(ok_wrong)),
        (
            f"{len(ids('flaky'))} flaky tasks completed at attempt 2 after a retry",
            not flaky_wrong,
            bad(flaky_wrong),
        ),
        (
            f"{len(ids('poison'))} poison tasks dead-lettered after {MAX_ATTEMPTS} attempts",
            not poison_wrong,
            bad(poison_wrong),
        ),
    ]


def run(
    database_url: str | None,
    count: int,
    workers: int,
    concurrency: int,
    rollback: float,
    flaky: float,
    poison: float,
    seed: int,
    broker_url: str | None,
) -> None:
    """Run the demo (`txtasks demo`) and print the guarantees it checked."""
    console = Console()
    if broker_url:
        os.environ[ENV_BROKER_URL] = broker_url  # for the worker processes
        app.use_notifier(notifier_for_url(broker_url))
    tmp = None
    if database_url is None:
        tmp = tempfile.TemporaryDirectory(prefix="txtasks-demo-")
        database_url = f"sqlite:///{Path(tmp.name) / 'demo.sqlite3'}"
    console.print(
        f"[bold]txtasks demo[/] on {url_safe(database_url)}: {count} tasks, "
        f"{workers} workers x {concurrency}"
    )
    engine = _engine(database_url)
    plan = Plan()
    started = time.perf_counter()
    try:
        _prepare(engine)
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console) as progress:
            _enqueue(engine, plan, count, random.Random(seed), progress, rollback, flaky, poison)
            codes = _run_workers(
                database_url, workers, concurrency, progress, len(plan.committed), engine
            )
        checks = _verify(engine, plan)
    finally:
        engine.dispose()
        asyncio.run(app.aclose())
        if tmp is not None:
            tmp.cleanup()
    elapsed = time.perf_counter() - started
    checks.append(
        (
            f"{workers} worker processes exited cleanly",
            all(c == 0 for c in codes),
            f"exit codes {codes}",
        )
    )
    table = Table(title=f"guarantees checked from the database ({elapsed:.1f}s)")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail")
    for what, passed, detail in checks:
        table.add_row(what, "[green]PASS[/]" if passed else "[red]FAIL[/]", detail)
    console.print(table)
    if not all(passed for _, passed, _ in checks):
        raise SystemExit(1)
