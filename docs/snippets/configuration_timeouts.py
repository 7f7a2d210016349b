"""Bound every database operation: a shorter command timeout than the default 30 s."""

import asyncio
import os
import tempfile

from txtasks import App, Timeouts
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

# Past 10 s without an answer, a connection is cut and replaced, and the operation retried.
app = App("bounded", database_url=DATABASE_URL, timeouts=Timeouts(connect=5, command=10))


@app.task(name="bounded.noop")
async def noop(payload: dict) -> None: ...


async def main() -> None:
    assert app.driver.timeouts.command == 10  # type: ignore[attr-defined]
    await app.amigrate()
    await noop.aenqueue({})
    stats = await run_until_empty(app)
    assert stats.outcomes == {"completed": 1}
    await app.aclose()


asyncio.run(main())
