"""Prometheus metrics of a worker and of the cleaner, read from their registries and scraped
over HTTP."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from cleaner import Cleaner, CleanerConfig
from txtasks import App, Drop, Middleware, Retry, TaskContext, Worker, WorkerConfig
from txtasks.driver import MemoryDriver
from txtasks.metrics import Metrics
from txtasks.schema.tables import metadata
from txtasks.wakeup import WakeupStats


def make_app() -> App:
    app = App("metrics", driver=MemoryDriver(), default_queue="mq")

    @app.task(name="ok")
    async def ok(payload: Any) -> None:
        return None

    @app.task(name="flaky", retry=0, max_attempts=2)
    async def flaky(payload: Any) -> None:
        raise Retry("not yet")

    return app


async def test_worker_counts_claims_outcomes_and_handler_time() -> None:
    app = make_app()
    for n in range(3):
        await app.aenqueue("ok", n)
    await app.aenqueue("flaky")
    metrics = Metrics()
    config = WorkerConfig(burst=True, burst_horizon=0, poll_interval=0.01, flush_interval=0.001)

    await Worker(app, config, metrics=metrics).run()

    value = metrics.registry.get_sample_value
    assert value("txtasks_tasks_claimed_total", {"queue": "mq", "task": "ok"}) == 3
    assert value("txtasks_tasks_claimed_total", {"queue": "mq", "task": "flaky"}) == 2
    finished = {"queue": "mq", "task": "flaky", "outcome": "retryable"}
    assert value("txtasks_tasks_finished_total", finished) == 1
    assert value("txtasks_tasks_finished_total", {**finished, "outcome": "dead"}) == 1
    ok_done = {"queue": "mq", "task": "ok", "outcome": "completed"}
    assert value("txtasks_tasks_finished_total", ok_done) == 3
    assert value("txtasks_handler_seconds_count", {"queue": "mq", "task": "ok"}) == 3


def test_wakeup_counters_are_read_at_scrape_time() -> None:
    stats = WakeupStats()
    metrics = Metrics()
    metrics.watch_wakeups(stats)
    stats.received, stats.dropped, stats.connected = 7, 2, True
    value = metrics.registry.get_sample_value
    assert value("txtasks_wakeups_received_total") == 7
    assert value("txtasks_wakeups_dropped_total") == 2
    assert value("txtasks_broker_connected") == 1


async def test_cleaner_counts_sweeps_and_sets_queue_gauges_and_serves_them() -> None:
    clock_now = datetime(2030, 1, 1)
    app = App("metrics", driver=MemoryDriver(), default_queue="mq", clock=lambda: clock_now)
    app.task(name="ok")(lambda payload: None)
    await app.aenqueue("ok", 1)
    await app.aenqueue("ok", 2, delay=3600)
    clock_now += timedelta(seconds=30)
    metrics = Metrics()
    cleaner = Cleaner(app, CleanerConfig(), metrics=metrics)

    await cleaner.run_once()

    value = metrics.registry.get_sample_value
    assert value("txtasks_sweep_passes_total", {"sweep": "rescuer", "ok": "true"}) == 1
    assert value("txtasks_sweep_passes_total", {"sweep": "stats", "ok": "true"}) == 1
    assert value("txtasks_queue_tasks", {"queue": "mq", "state": "pending"}) == 2
    assert value("txtasks_queue_oldest_ready_seconds", {"queue": "mq"}) == 30

    port = metrics.serve(0, "127.0.0.1")
    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    )
    text = body.decode()
    assert 'txtasks_queue_tasks{queue="mq",state="pending"} 2.0' in text
    assert 'txtasks_sweep_passes_total{ok="true",sweep="periodic"} 1.0' in text


async def test_queue_gauges_fall_to_zero_when_a_queue_empties() -> None:
    """A backlog that drains must read 0, not its last non-zero count: an autoscaler on it
    would otherwise never scale in."""
    app = make_app()
    [task_id] = [await app.aenqueue("ok", 1)]
    metrics = Metrics()
    cleaner = Cleaner(app, CleanerConfig(), metrics=metrics)
    await cleaner.run_once()
    value = metrics.registry.get_sample_value
    assert value("txtasks_queue_tasks", {"queue": "mq", "state": "pending"}) == 1
    assert value("txtasks_queue_ready_tasks", {"queue": "mq"}) == 1

    await app.control.apause("mq")
    await cleaner.run_once()
    assert value("txtasks_queue_paused", {"queue": "mq"}) == 1

    await app.control.acancel(task_id)
    await app.control.aresume("mq")
    await cleaner.run_once()

    assert value("txtasks_queue_tasks", {"queue": "mq", "state": "pending"}) == 0
    assert value("txtasks_queue_ready_tasks", {"queue": "mq"}) == 0
    assert value("txtasks_queue_oldest_ready_seconds", {"queue": "mq"}) == 0
    assert value("txtasks_queue_paused", {"queue": "mq"}) == 0


async def test_cleaner_exports_arrival_and_finish_rates_per_queue() -> None:
    app = make_app()
    for n in range(3):
        await app.aenqueue("ok", n)
    await app.aenqueue("flaky")
    config = WorkerConfig(burst=True, burst_horizon=0, poll_interval=0.01, flush_interval=0.001)
    await Worker(app, config).run()
    metrics = Metrics()

    await Cleaner(app, CleanerConfig(), metrics=metrics).run_once()

    value = metrics.registry.get_sample_value
    assert value("txtasks_queue_enqueued_per_second", {"queue": "mq"}) == 4 / 60
    finished = "txtasks_queue_finished_per_second"
    assert value(finished, {"queue": "mq", "state": "completed"}) == 3 / 60
    assert value(finished, {"queue": "mq", "state": "dead"}) == 1 / 60


def test_every_metric_the_docs_name_exists() -> None:
    """The metrics named in the operations and deployment guides are the ones served."""
    metrics = Metrics()
    metrics.watch_wakeups(WakeupStats())
    families = {m.name for m in metrics.registry.collect()}
    docs = Path(__file__).parents[2] / "docs"
    tables = set(metadata.tables)
    named = set()
    for page in ("operations.md", "deployment.md"):
        named |= set(re.findall(r"\btxtasks_[a-z_]+[a-z]", (docs / page).read_text())) - tables
    unknown = {n for n in named if re.sub(r"_(total|bucket|count|sum)$", "", n) not in families}
    assert named and not unknown, sorted(unknown)


async def test_metrics_count_attempts_as_middleware_and_rows_refused_before_any() -> None:
    """The metrics are the first middleware of every attempt: an attempt the application's
    middleware short-circuits is counted and timed; a row dead-lettered before any attempt
    (its task unknown here) is counted without a duration."""
    app = make_app()

    class Closed(Middleware):
        def before_attempt(self, ctx: TaskContext) -> None:
            if ctx.payload == "closed":
                raise Drop("the shop is closed")

    app.middleware(Closed())
    await app.aenqueue("ok", "closed")
    await app.aenqueue("ok", "open")
    other = App("other", driver=app.driver, default_queue="mq")
    other.task(name="unknown")(make_app)
    await other.aenqueue("unknown")
    metrics = Metrics()
    config = WorkerConfig(burst=True, burst_horizon=0, poll_interval=0.01, flush_interval=0.001)

    await Worker(app, config, metrics=metrics).run()

    value = metrics.registry.get_sample_value
    done = {"queue": "mq", "task": "ok"}
    assert value("txtasks_tasks_finished_total", {**done, "outcome": "discarded"}) == 1
    assert value("txtasks_tasks_finished_total", {**done, "outcome": "completed"}) == 1
    assert value("txtasks_handler_seconds_count", done) == 2
    unknown = {"queue": "mq", "task": "unknown"}
    assert value("txtasks_tasks_finished_total", {**unknown, "outcome": "dead"}) == 1
    assert value("txtasks_handler_seconds_count", unknown) is None
