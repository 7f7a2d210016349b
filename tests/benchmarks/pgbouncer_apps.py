"""What the worker processes of the PgBouncer benchmark (tests/benchmarks/pgbouncer.py) and of
its test (tests/acceptance/test_pgbouncer_workers.py) import.

`app`: a txtasks App with one async task, `crowd.run`, on the queue `crowd`. Run it with
`python -m txtasks worker tests.benchmarks.pgbouncer_apps:app ...`; the database and the broker
come from TXTASKS_DATABASE_URL and TXTASKS_BROKER_URL.

The handler reads `time.monotonic()` first thing and, when TXTASKS_BENCH_REPORT names a
`host:port`, sends it with the task id as one UDP datagram (CLOCK_MONOTONIC is one clock for
the whole machine on Linux: the benchmark subtracts its own commit time from it). Then, unless
its payload says `"tx": false`, it writes one row to `crowd_runs` (task id, attempt, pid) in its
transactional completion (`ctx.transaction()`): the row commits with the task's completion, so
the table holds one row per completed attempt, whichever worker ran it.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, insert

from txtasks import App, TaskContext
from txtasks.schema.tables import Id

QUEUE = "crowd"
#: A token in every report (TXTASKS_BENCH_RUN): a late report of an earlier run is ignored.
RUN_VAR = "TXTASKS_BENCH_RUN"
REPORT_VAR = "TXTASKS_BENCH_REPORT"

metadata = MetaData()
runs = Table(
    "crowd_runs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("task_id", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
)

app = App("crowd", default_queue=QUEUE)

_report: tuple[socket.socket, tuple[str, int], str] | None = None


def _reporter() -> tuple[socket.socket, tuple[str, int], str] | None:
    global _report
    where = os.environ.get(REPORT_VAR)
    if _report is None and where:
        host, _, port = where.rpartition(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _report = (sock, (host, int(port)), os.environ.get(RUN_VAR, ""))
    return _report


@app.task(name="crowd.run", queue=QUEUE)
async def run(payload: dict[str, Any], ctx: TaskContext) -> None:
    started = time.monotonic()
    report = _reporter()
    if report is not None:
        sock, address, token = report
        sock.sendto(f"{token} {ctx.task_id} {started!r}".encode(), address)
    if payload.get("tx", True):
        async with ctx.transaction() as conn:
            row = {"task_id": ctx.task_id, "attempt": ctx.attempt, "pid": os.getpid()}
            await conn.execute(insert(runs).values(**row))
