"""Run a worker inside your own asyncio service, with explicit settings."""

import asyncio
import os
import signal
import tempfile

from txtasks import App, TaskState, Worker, WorkerConfig

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("service", database_url=DATABASE_URL)
sent: list[int] = []
all_sent = asyncio.Event()


@app.task(name="emails.send", queue="emails")
async def send_email(payload: dict) -> None:
    sent.append(payload["n"])
    if len(sent) == 3:
        all_sent.set()


@app.task(name="reports.build", queue="reports")
async def build_report(payload: dict) -> None: ...


async def main() -> None:
    await app.amigrate()
    for n in range(3):
        await send_email.aenqueue({"n": n})
    report_id = await build_report.aenqueue({})

    config = WorkerConfig(
        queues=("emails",),  # default: every queue the app's tasks use
        concurrency=20,
        lease=60,
        heartbeat=15,  # default: a third of the lease
        poll_interval=0.5,
        shutdown_grace=10,
    )
    worker = Worker(app, config)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, worker.stop)  # stop claiming, let tasks finish

    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(all_sent.wait(), timeout=30)
    worker.stop()
    stats = await running

    assert stats.outcomes == {"completed": 3}
    assert (
        await app.driver.tasks.task_get(report_id)
    ).state is TaskState.PENDING  # not served here
    await app.aclose()


asyncio.run(main())
