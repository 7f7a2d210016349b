"""Groups are independent: a group subscribed later gets only what is published after; a dedup
key is per group; a key orders each group's tasks on its own; a topic nobody subscribes to drops
the publish and counts it."""

import asyncio
import os
import tempfile

from txtasks import App, KeyLimits, TaskContext
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("ledger", database_url=DATABASE_URL)
seen: dict[str, list[int]] = {"ledger": [], "audit": []}


@app.task(
    queue="ledger",
    subscribe="payment.settled",
    group="ledger",
    key_limits=KeyLimits(ordered=True),  # one at a time per account, in publish order
)
def post(payment: dict, ctx: TaskContext) -> None:
    seen["ledger"].append(payment["n"])


@app.task(queue="audit", subscribe="payment.settled", group="audit")
def audit(payment: dict) -> None:
    seen["audit"].append(payment["n"])


async def main() -> None:
    await app.amigrate()
    await app.topics.asubscribe(["payment.settled"])  # as `txtasks subscribe ledger:app` does
    await app.topics.aunsubscribe("payment.settled", "audit")  # as `txtasks unsubscribe` does

    first = await app.topics.apublish("payment.settled", {"n": 1}, key="account:7")
    assert len(first) == 1  # only the ledger is subscribed now

    await app.topics.asubscribe()  # the audit group is back: it gets what is published from now on
    for n in (2, 3):
        ids = await app.topics.apublish(
            "payment.settled", {"n": n}, key="account:7", dedup_key=f"p{n}"
        )
        assert len(ids) == 2
    again = await app.topics.apublish("payment.settled", {"n": 3}, key="account:7", dedup_key="p3")
    assert again == []  # each group's task with that dedup key is still live: none added

    assert await app.topics.apublish("payment.refunded", {"n": 4}) == []  # no subscriber: dropped
    stats = {s.topic: s for s in await app.driver.topics.topic_stats()}  # as `txtasks topics` shows
    assert stats["payment.refunded"].dropped == 1
    assert [sub.group for sub, _counts in stats["payment.settled"].groups] == ["audit", "ledger"]

    await run_until_empty(app)
    assert seen["ledger"] == [1, 2, 3]  # in publish order: the ledger's key is ordered
    assert sorted(seen["audit"]) == [2, 3]  # the audit queue sets no limits: any order
    await app.aclose()


asyncio.run(main())
