"""Middleware: time every attempt, refuse some before they run, stamp every enqueue."""

import asyncio
import os
import tempfile
import time

from txtasks import App, AttemptEnd, Drop, Middleware, TaskContext, TaskState
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)
timings: list[tuple[str, str]] = []


class Timing(Middleware):
    def before_attempt(self, ctx: TaskContext) -> None:
        ctx.extra["started"] = time.perf_counter()

    def after_attempt(self, ctx: TaskContext, end: AttemptEnd) -> None:
        seconds = time.perf_counter() - ctx.extra["started"]
        timings.append((ctx.task.name, end.outcome.kind.value))
        ctx.logger.info("%s took %.3f s: %s", ctx.task.name, seconds, end.outcome.kind.value)


class Maintenance(Middleware):
    """Short-circuit: tasks of retired tenants are discarded without running."""

    async def before_attempt(self, ctx: TaskContext) -> None:
        if ctx.headers.get("tenant") == "retired":
            raise Drop("tenant retired")


class Tenant(Middleware):
    """Every enqueue gets a tenant header unless it has one."""

    def before_enqueue(self, rows):
        return [
            r if r.headers else r.__class__(**{**_fields(r), "headers": '{"tenant":"main"}'})
            for r in rows
        ]


def _fields(row):
    return {name: getattr(row, name) for name in row.__slots__}


app = App("tenants", database_url=DATABASE_URL, middleware=[Timing(), Tenant()])


@app.task(name="tenants.sync", middleware=[Maintenance()])  # inside the application's
def sync_tenant(payload: dict, ctx: TaskContext) -> None:
    assert ctx.headers["tenant"] in ("main",)


async def main() -> None:
    await app.amigrate()
    kept = await sync_tenant.aenqueue({})
    dropped = await sync_tenant.aenqueue({}, headers={"tenant": "retired"})
    await run_until_empty(app)
    assert (await app.driver.tasks.task_get(kept)).state is TaskState.COMPLETED
    assert (await app.driver.tasks.task_get(dropped)).state is TaskState.DISCARDED
    assert sorted(timings) == [("tenants.sync", "completed"), ("tenants.sync", "discarded")]
    await app.aclose()


asyncio.run(main())
