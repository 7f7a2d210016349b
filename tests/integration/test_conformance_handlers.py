"""Conformance suite: handlers that complete in their own transaction, keep results, report
progress, and run inside middleware; on every database (and in memory where it applies)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from cleaner import Periodic, PeriodicConfig
from tests.conftest import BACKENDS, reset_schema, server_url
from tests.integration.conformance import ORDERS, ManualClock, order_names, own_table
from tests.waiting import until
from txtasks import App, Drop, KeyLimits, MemoryDriver, Reject, Retry, TaskState
from txtasks.clock import utcnow
from txtasks.errors import ConfigurationError, LeaseLost, ResultTimeout, TaskFailed
from txtasks.middleware import AttemptEnd, Middleware
from txtasks.payload import headers_decode, headers_encode
from txtasks.testing import run_until_empty
from txtasks.types import NewTask, Outcome, OutcomeKind, Progress, TaskKey, TaskRow
from txtasks.worker.context import TaskContext
from txtasks.worker.progress import ProgressWriter
from txtasks.worker.worker import Worker, WorkerConfig

#: Every test here ends within this many seconds.
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def orders(database_url: str) -> Iterator[str]:
    """The application's own table on the test's database; its URL."""
    with own_table(database_url):
        yield database_url


@pytest.fixture(params=[pytest.param("memory", id="memory"), *BACKENDS])
async def any_app(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[App]:
    """An App in memory, or on a clean database of each backend."""
    if request.param == "memory":
        yield App("test", driver=MemoryDriver())
        return
    url = server_url(request, request.param, tmp_path)
    reset_schema(url)
    application = App("test", database_url=url)
    yield application
    await application.aclose()


async def row_of(app: App, task_id: int) -> TaskRow:
    row = await app.driver.tasks.task_get(task_id)
    assert row is not None, f"task {task_id} is gone"
    return row


# ----------------------------------------------------------------------------- transactions


async def test_async_handler_commits_its_writes_and_a_follow_up_with_its_completion(
    app: App, orders: str
) -> None:
    ran: list[str] = []

    @app.task(name="chain.ship")
    async def ship(payload: dict[str, Any]) -> None:
        ran.append(payload["order"])

    @app.task(name="chain.pay", key=lambda p: p["customer"], key_limits=KeyLimits(ordered=True))
    async def pay(payload: dict[str, Any], ctx: TaskContext) -> None:
        async with ctx.transaction() as conn:
            await conn.execute(insert(ORDERS), {"name": payload["order"]})
            await ship.aenqueue_tx(conn, {"order": payload["order"]})

    first = await pay.aenqueue({"order": "o-1", "customer": "c"})
    second = await pay.aenqueue({"order": "o-2", "customer": "c"})  # waits for its key
    stats = await run_until_empty(app)

    assert order_names(orders) == ["o-1", "o-2"]
    assert ran == ["o-1", "o-2"]  # the chain: each follow-up appeared with its parent's commit
    assert stats.outcomes == {"completed": 4}
    for task_id in (first, second):
        row = await row_of(app, task_id)
        assert (row.state, row.attempt) == (TaskState.COMPLETED, 1)


async def test_sync_handler_commits_its_writes_with_its_completion(app: App, orders: str) -> None:
    @app.task(name="sync.pay", keep_result=True)
    def pay(payload: dict[str, Any], ctx: TaskContext) -> None:
        with ctx.transaction_sync() as conn:
            conn.execute(insert(ORDERS), {"name": payload["order"]})
            ctx.set_result({"paid": payload["order"]})

    task_id = await pay.aenqueue({"order": "o-9"})
    stats = await run_until_empty(app)
    assert stats.outcomes == {"completed": 1}
    assert order_names(orders) == ["o-9"]
    assert await app.results.aget(task_id, timeout=5) == {"paid": "o-9"}


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_a_handler_raising_after_its_writes_rolls_them_back_and_retries(
    app: App, orders: str, flavour: str
) -> None:
    if flavour == "async":

        @app.task(name="tx.fail", max_attempts=2, retry=0)
        async def fail(payload: Any, ctx: TaskContext) -> None:
            async with ctx.transaction() as conn:
                await conn.execute(insert(ORDERS), {"name": f"attempt {ctx.attempt}"})
                raise RuntimeError("after the write")

    else:

        @app.task(name="tx.fail", max_attempts=2, retry=0)
        def fail(payload: Any, ctx: TaskContext) -> None:
            with ctx.transaction_sync() as conn:
                conn.execute(insert(ORDERS), {"name": f"attempt {ctx.attempt}"})
                raise RuntimeError("after the write")

    task_id = await app.aenqueue("tx.fail")
    stats = await run_until_empty(app, burst_horizon=1)
    assert stats.outcomes == {"retryable": 1, "dead": 1}  # the normal retry path
    assert order_names(orders) == []  # neither attempt's write landed
    row = await row_of(app, task_id)
    assert row.state is TaskState.DEAD and "after the write" in (row.last_error or "")


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_a_handler_that_lost_its_lease_writes_nothing(
    app: App, orders: str, flavour: str
) -> None:
    """The cleaner rescues the attempt while its handler runs (its lease ran out): the
    handler's transaction finds the attempt gone, raises LeaseLost, and nothing lands."""
    lost: list[BaseException] = []
    loop = asyncio.get_running_loop()

    async def rescue(ctx: TaskContext) -> None:
        later = utcnow() + __import__("datetime").timedelta(hours=1)
        retry = Outcome(ctx.row.key, OutcomeKind.RETRY, error="lease expired", run_at=later)
        result = await app.driver.claims.outcome_write_many(
            [retry], now=utcnow(), expired_before=later
        )  # the cleaner's fence: a lease expired before `later`
        assert result.applied == 1

    if flavour == "async":

        @app.task(name="tx.lost")
        async def handler(payload: Any, ctx: TaskContext) -> None:
            await rescue(ctx)
            try:
                async with ctx.transaction() as conn:
                    await conn.execute(insert(ORDERS), {"name": "never"})
            except LeaseLost as exc:
                lost.append(exc)
                raise

    else:

        @app.task(name="tx.lost")
        def handler(payload: Any, ctx: TaskContext) -> None:
            asyncio.run_coroutine_threadsafe(rescue(ctx), loop).result(10)
            try:
                with ctx.transaction_sync() as conn:
                    conn.execute(insert(ORDERS), {"name": "never"})
            except LeaseLost as exc:
                lost.append(exc)
                raise

    task_id = await app.aenqueue("tx.lost")
    stats = await run_until_empty(app)
    assert len(lost) == 1 and "no longer this worker's" in str(lost[0])
    assert order_names(orders) == []
    row = await row_of(app, task_id)  # as the rescue left it: the worker wrote nothing more
    assert (row.state, row.attempt, row.last_error) == (
        TaskState.RETRYABLE,
        1,
        "lease expired",
    )
    assert stats.outcomes == {}


async def test_a_transaction_held_past_the_heartbeat_keeps_the_attempt(
    app: App, orders: str
) -> None:
    """The heartbeat leaves the row the handler's transaction holds alone (never waits for
    it), and the attempt still completes."""
    if not app.driver.capabilities.concurrent_claims:
        pytest.skip("SQLite has one writer: the heartbeat waits for the handler's transaction")
    beats = asyncio.Event()

    @app.task(name="tx.long")
    async def long(payload: Any, ctx: TaskContext) -> None:
        async with ctx.transaction() as conn:
            await conn.execute(insert(ORDERS), {"name": "long"})
            await asyncio.wait_for(beats.wait(), 10)

    task_id = await long.aenqueue()
    worker = Worker(app, WorkerConfig(burst=True, poll_interval=0.01, lease=0.9, heartbeat=0.1))
    original = worker.driver.claims.lease_extend_many
    calls = 0

    async def counted(*args: Any, **kwargs: Any) -> int:
        nonlocal calls
        calls += 1
        if calls >= 3:
            beats.set()
        return await original(*args, **kwargs)

    worker.driver.claims.lease_extend_many = counted  # type: ignore[method-assign]
    try:
        stats = await worker.run()
    finally:
        del worker.driver.claims.lease_extend_many
    assert stats.outcomes == {"completed": 1}
    assert order_names(orders) == ["long"]
    assert (await row_of(app, task_id)).state is TaskState.COMPLETED


async def test_the_memory_driver_says_it_has_no_transactions() -> None:
    app = App("memory", driver=MemoryDriver())

    @app.task(name="tx.memory", max_attempts=1)
    async def handler(payload: Any, ctx: TaskContext) -> None:
        async with ctx.transaction():
            pass

    task_id = await handler.aenqueue()
    await run_until_empty(app)
    row = await row_of(app, task_id)
    assert row.state is TaskState.DEAD and "in-memory driver" in (row.last_error or "")
    with pytest.raises(ConfigurationError):
        app.driver.claims.attempt_transaction(row.key, worker_id="w", finish=None)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- results


async def test_results_are_kept_and_final_errors_raised(any_app: App) -> None:
    app = any_app

    @app.task(name="results.add", keep_result=True)
    async def add(payload: dict[str, int]) -> dict[str, int]:
        return {"sum": payload["a"] + payload["b"]}

    @app.task(name="results.plain")
    def plain(payload: Any) -> str:
        return "not kept"

    @app.task(name="results.reject", keep_result=True)
    def reject(payload: Any) -> None:
        raise Reject("bad input")

    @app.task(name="results.drop", keep_result=True)
    def drop(payload: Any) -> None:
        raise Drop("gone")

    @app.task(name="results.huge", keep_result=True, max_attempts=1)
    def huge(payload: Any) -> str:
        return "x" * (app.max_payload_bytes + 1)

    @app.task(name="results.opaque", keep_result=True, max_attempts=1)
    def opaque(payload: Any) -> object:
        return object()

    ids = {
        "add": await add.aenqueue({"a": 2, "b": 3}),
        "plain": await plain.aenqueue(),
        "reject": await reject.aenqueue(),
        "drop": await drop.aenqueue(),
        "huge": await huge.aenqueue(),
        "opaque": await opaque.aenqueue(),
    }
    waiter = asyncio.ensure_future(app.results.aget(ids["add"], timeout=20))
    await run_until_empty(app, archive_completed=False)  # results are archived anyway
    assert await waiter == {"sum": 5}
    assert await app.results.aget(ids["add"]) == {"sum": 5}
    assert await asyncio.to_thread(app.results.get, ids["add"], timeout=5) == {"sum": 5}
    with pytest.raises(LookupError):  # not kept, and not archived
        await app.results.aget(ids["plain"])
    with pytest.raises(TaskFailed) as rejected:
        await app.results.aget(ids["reject"])
    assert (rejected.value.state, rejected.value.error) == ("dead", "bad input")
    with pytest.raises(TaskFailed) as dropped:
        await app.results.aget(ids["drop"])
    assert dropped.value.state == "discarded"
    for name, reason in (("huge", "over the limit of"), ("opaque", "not JSON-serialisable")):
        row = await row_of(app, ids[name])
        assert row.state is TaskState.DEAD and "result is " in (row.last_error or "")
        assert reason in (row.last_error or "")


async def test_a_result_wait_times_out_while_the_task_waits(any_app: App) -> None:
    @any_app.task(name="results.later", keep_result=True)
    def later(payload: Any) -> int:
        return 1

    task_id = await later.aenqueue()
    with pytest.raises(ResultTimeout):
        await any_app.results.aget(task_id, timeout=0.05)
    with pytest.raises(ResultTimeout):
        await asyncio.to_thread(any_app.results.get, task_id, timeout=0.05)


# ----------------------------------------------------------------------------- progress


async def test_progress_is_stored_within_the_progress_interval(any_app: App) -> None:
    """The heartbeat is 30 s: only the progress writer (every 0.05 s) can store the report."""
    app = any_app
    release = asyncio.Event()

    @app.task(name="progress.import")
    async def import_rows(payload: Any, ctx: TaskContext) -> None:
        for done in range(1, 101):
            ctx.progress(done, 100, note=f"row {done}")  # coalesced: the last one is stored
        await asyncio.wait_for(release.wait(), 20)

    task_id = await import_rows.aenqueue()
    config = WorkerConfig(
        burst=True, poll_interval=0.01, heartbeat=30, lease=90, progress_interval=0.05
    )
    worker = Worker(app, config)
    running = asyncio.ensure_future(worker.run())
    try:

        async def reported() -> Any:
            return (await row_of(app, task_id)).progress_report

        report = await until(reported, "the progress report to be stored")
        assert (report.done, report.total, report.note, report.attempt) == (100, 100, "row 100", 1)
        assert report.fraction == 1.0
        # a hundred reports made without an await between them: the writer only ever saw the
        # last, so it wrote once, plus once more each time a claim passing by held the row
        # (the burst worker polls every 0.01 s: how often depends on timing), never per report
        assert worker._progress.writes < 10
    finally:
        release.set()
        await asyncio.wait_for(running, 20)
    row = await row_of(app, task_id)
    assert row.state is TaskState.COMPLETED and row.progress_report is not None


async def test_progress_writes_are_fenced_like_heartbeats(any_app: App) -> None:
    """A report of an attempt this worker no longer holds (a later attempt, another worker)
    is not stored; the report of the attempt it holds is."""
    app = any_app
    app.task(name="progress.fenced")(lambda payload: None)
    task_id = await app.aenqueue("progress.fenced")
    now = utcnow()
    [row] = await app.driver.claims.task_claim_many(
        ["default"], 1, now=now, lease_until=now + timedelta(seconds=60), worker_id="w1"
    )
    mine = ProgressWriter(app.driver, app.clock, interval=1, lease=60, worker_id="w1")
    other = ProgressWriter(app.driver, app.clock, interval=1, lease=60, worker_id="w2")
    other.report(row.key, Progress(5, 10).to_json())
    mine.report(TaskKey(row.id, row.attempt + 1), Progress(7, 10).to_json())
    await other.write()
    await mine.write()
    assert (await row_of(app, task_id)).progress_report is None
    mine.report(row.key, Progress(3, 10, attempt=row.attempt).to_json())
    await mine.write()
    assert (await row_of(app, task_id)).progress_report == Progress(3, 10, attempt=1)


# ----------------------------------------------------------------------------- middleware


class Recorder(Middleware):
    def __init__(self, name: str, seen: list[Any]) -> None:
        self.name, self.seen = name, seen

    def before_attempt(self, ctx: TaskContext) -> None:
        self.seen.append((self.name, "before", ctx.payload))

    async def after_attempt(self, ctx: TaskContext, end: AttemptEnd) -> None:
        error = type(end.exception).__name__ if end.exception else None
        self.seen.append((self.name, "after", end.outcome.kind.value, end.value, error))


class ShortCircuit(Middleware):
    async def before_attempt(self, ctx: TaskContext) -> None:
        verdict = ctx.payload.get("verdict") if isinstance(ctx.payload, dict) else None
        if verdict == "drop":
            raise Drop("dropped by middleware")
        if verdict == "reject":
            raise Reject("rejected by middleware")
        if verdict == "retry":
            raise Retry("retried by middleware", delay=3600)
        if verdict == "change":
            ctx.payload = {"changed": True}


class Stamp(Middleware):
    def before_enqueue(self, rows: Any) -> list[NewTask]:
        return [r.__class__(**{**_fields(r), "priority": 7}) for r in rows]


def _fields(row: NewTask) -> dict[str, Any]:
    return {name: getattr(row, name) for name in row.__slots__}  # type: ignore[attr-defined]


async def test_middleware_wraps_attempts_in_order_and_short_circuits(any_app: App) -> None:
    app = any_app
    seen: list[Any] = []
    handled: list[Any] = []
    app.middleware(Recorder("outer", seen))
    app.middleware(Stamp())

    @app.task(
        name="mw.handle", keep_result=True, middleware=[Recorder("inner", seen), ShortCircuit()]
    )
    def handle(payload: Any) -> Any:
        handled.append(payload)
        return "ok"

    verdicts = ["run", "change", "drop", "reject", "retry"]
    ids = {v: await handle.aenqueue({"verdict": v}) for v in verdicts}
    await run_until_empty(app, concurrency=1)  # one attempt after the other

    assert handled == [{"verdict": "run"}, {"changed": True}]
    states = {v: (await row_of(app, i)).state for v, i in ids.items()}
    assert states == {
        "run": TaskState.COMPLETED,
        "change": TaskState.COMPLETED,
        "drop": TaskState.DISCARDED,
        "reject": TaskState.DEAD,
        "retry": TaskState.RETRYABLE,
    }
    assert (await row_of(app, ids["run"])).priority == 7  # the enqueue hook ran
    assert seen[:4] == [
        ("outer", "before", {"verdict": "run"}),
        ("inner", "before", {"verdict": "run"}),
        ("inner", "after", "completed", "ok", None),
        ("outer", "after", "completed", "ok", None),
    ]
    afters = [s for s in seen if s[1] == "after" and s[0] == "outer"]
    assert [(a[2], a[4]) for a in afters] == [
        ("completed", None),
        ("completed", None),
        ("discarded", "Drop"),
        ("dead", "Reject"),
        ("retryable", "Retry"),
    ]


class TenantHeader(Middleware):
    """Adds a tenant header to every task enqueued (keeping the headers it has); refuses
    payloads that say so."""

    def before_enqueue(self, rows: Any) -> list[NewTask]:
        changed = []
        for r in rows:
            if json.loads(r.payload) == {"refuse": True}:
                raise ValueError("refused by middleware")
            headers = {**headers_decode(r.headers), "tenant": "main"}
            changed.append(dataclasses.replace(r, headers=headers_encode(headers)))
        return changed


async def test_before_enqueue_reaches_tasks_publishes_and_periodic_fires(any_app: App) -> None:
    """Every way a task is written goes through the middleware: an enqueue, a publish to a
    topic (each group's task), and a periodic fire (the cleaner's)."""
    clock = ManualClock(utcnow())
    app = App("mw-everywhere", driver=any_app.driver, clock=clock, middleware=[TenantHeader()])

    @app.task(name="mw.sub", queue="mw", subscribe="mw.topic")
    def sub(payload: Any) -> None:
        return None

    app.periodic(sub, every=10, name="mw.tick")
    await app.topics.asubscribe()
    enqueued = await sub.aenqueue({"n": 1}, headers={"own": "kept"})
    published = await app.topics.apublish("mw.topic", {"n": 2}, headers={"own": "kept"})
    published += app.topics.publish("mw.topic", {"n": 3})
    periodic = Periodic(app, PeriodicConfig())
    assert (await periodic.run_once()).registered == 1
    clock.now += timedelta(seconds=10)
    assert (await periodic.run_once()).fired == 1

    ids = await app.driver.sweeps.ready_list("mw", due_before=datetime.max, limit=10)
    assert len(ids) == 4 and {enqueued, *published} < set(ids)
    for task_id in ids:
        headers = headers_decode((await row_of(app, task_id)).headers)
        assert headers["tenant"] == "main", (task_id, headers)
    for task_id in (enqueued, published[0]):
        assert headers_decode((await row_of(app, task_id)).headers)["own"] == "kept"
    with pytest.raises(ValueError, match="refused by middleware"):
        await app.topics.apublish("mw.topic", {"refuse": True})
    with pytest.raises(ValueError, match="refused by middleware"):
        app.topics.publish("mw.topic", {"refuse": True})
    assert len(await app.driver.sweeps.ready_list("mw", due_before=datetime.max, limit=10)) == 4


async def test_a_failing_after_hook_does_not_change_the_outcome(any_app: App) -> None:
    class Broken(Middleware):
        def after_attempt(self, ctx: TaskContext, end: AttemptEnd) -> None:
            raise RuntimeError("broken middleware")

    any_app.middleware(Broken())

    @any_app.task(name="mw.ok")
    async def ok(payload: Any) -> None:
        return None

    task_id = await ok.aenqueue()
    stats = await run_until_empty(any_app)
    assert stats.outcomes == {"completed": 1}
    assert (await row_of(any_app, task_id)).state is TaskState.COMPLETED


def test_middleware_must_be_middleware() -> None:
    app = App("bad", driver=MemoryDriver())
    with pytest.raises(ConfigurationError, match="middleware"):
        app.middleware(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="middleware"):
        app.task(name="bad", middleware=[object()])(lambda payload: None)  # type: ignore[list-item]
