"""Enqueue many tasks in the caller's transaction with one statement per batch."""

import asyncio
import os
import tempfile

from txtasks import App, create_engine, migrate
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("media", database_url=DATABASE_URL)
thumbnails: list[str] = []


@app.task(queue="media")
def make_thumbnail(payload: dict) -> None:
    thumbnails.append(payload["image"])


@app.task(queue="media", name="media.index_image")
def index_image(payload: dict) -> None:
    pass


engine = create_engine(DATABASE_URL)
with engine.begin() as conn:
    migrate(conn)

images = [f"img-{n}.jpg" for n in range(100)]
with engine.begin() as conn:
    rows = [make_thumbnail.new({"image": name}) for name in images]
    rows.append(index_image.new({"images": len(images)}, priority=10))  # options per row
    rows.append(app.new_task("media.index_image", {"again": True}))  # a task by name
    ids = app.enqueue_many_tx(conn, rows)  # the ids, in the order of `rows`

assert len(ids) == len(rows) == 102


async def main() -> None:
    stats = await run_until_empty(app, concurrency=20)
    assert stats.outcomes == {"completed": 102}
    assert sorted(thumbnails) == sorted(images)
    await app.aclose()


asyncio.run(main())
engine.dispose()
