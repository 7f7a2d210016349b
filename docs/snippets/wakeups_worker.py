"""A worker woken by RabbitMQ a few milliseconds after each commit (polling when no broker)."""

import asyncio
import os
import tempfile

from txtasks import App, Worker, WorkerConfig, create_async_engine

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/wakeups.sqlite3"
)
BROKER_URL = os.environ.get("TXTASKS_BROKER_URL")  # e.g. amqp://guest:guest@localhost/

app = App(database_url=DATABASE_URL, broker_url=BROKER_URL)
started = asyncio.Event()


@app.task(name="wakeups.greet", queue="wakeups-example")
async def greet(payload: dict) -> None:
    started.set()


async def main() -> None:
    await app.amigrate()
    # With a broker, only a wake-up can start the task in time: the poll is 30 s away.
    poll_interval = 30.0 if BROKER_URL else 0.1
    worker = Worker(app, WorkerConfig(poll_interval=poll_interval))
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(worker.idle.wait(), timeout=10)  # started, and found nothing to do

    engine = create_async_engine(DATABASE_URL)
    async with engine.begin() as conn:
        await greet.aenqueue_tx(conn, {"name": "Ada"})
    # The wake-up was published when that block committed, not before.
    await asyncio.wait_for(started.wait(), timeout=10)
    print("started by", "a wake-up" if worker.stats.wakeups else "a poll")

    worker.stop()
    await running
    await engine.dispose()
    await app.aclose()


asyncio.run(main())
