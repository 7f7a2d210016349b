"""A rate per key, a rate for the whole queue, and limits changed at run time for one key (as
`txtasks keys set` does)."""

import asyncio
import os
import tempfile
import time

from txtasks import App, KeyLimits, KeyOverride, Rate
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("webhooks", database_url=DATABASE_URL)
app.queue_rate("webhooks", Rate(25, per=1))  # and at most 25 calls a second in all
starts: dict[str, list[float]] = {}


@app.task(
    queue="webhooks",
    key=lambda hook: hook["host"],
    key_limits=KeyLimits(rate=Rate(20, per=1)),  # at most 20 calls a second to one host
)
def deliver(hook: dict) -> None:
    starts.setdefault(hook["host"], []).append(time.monotonic())


async def main() -> None:
    await app.amigrate()
    # One host asked for fewer: 10 a second, stored in the database, over the declared rate.
    await app.driver.control.key_override_set(KeyOverride("slow.example", rate=Rate(10, per=1)))
    for n in range(5):
        await deliver.aenqueue({"host": "fast.example", "n": n})
        await deliver.aenqueue({"host": "slow.example", "n": n})

    await run_until_empty(app, burst_horizon=1)
    fast, slow = starts["fast.example"], starts["slow.example"]
    assert fast[-1] - fast[0] >= 4 * 0.05 * 0.9  # 5 starts, 1/20 s apart (a start may lag)
    assert slow[-1] - slow[0] >= 4 * 0.10 * 0.9  # 5 starts, 1/10 s apart
    every = sorted(fast + slow)
    assert every[-1] - every[0] >= 9 * 0.04 * 0.9  # 10 starts, 1/25 s apart in all
    await app.aclose()


asyncio.run(main())
