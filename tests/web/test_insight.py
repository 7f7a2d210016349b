"""The dashboard's longer views over HTTP, on every database: the queues' history over a day
or a week."""

from __future__ import annotations

import httpx

from tests.web.conftest import Seeded
from txtasks import App
from txtasks.driver.base import HistoryRow, minute_number


async def test_the_queue_chart_covers_a_day_or_a_week_from_the_history(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    now = dashboard_app.clock()
    minute = minute_number(now)
    await dashboard_app.driver.sweeps.history_write(
        [
            HistoryRow(minute - 120, "mail", enqueued=7, completed=6, dead=1),  # 2 hours ago
            HistoryRow(minute - 3 * 1440, "mail", enqueued=40, completed=40),  # 3 days ago
            HistoryRow(minute - 10 * 1440, "mail", enqueued=500, completed=500),  # kept too long
        ]
    )

    def mail(text: str) -> str:
        return text.split('data-queue="mail"')[1].split("</tr>")[0]

    hour = await client.get("/")
    assert "2 enqueued, 1 completed, 0 failed or dead; peak 2/min" in mail(hour.text)
    day = await client.get("/", params={"range": "24h"})
    assert day.status_code == 200
    assert "last 24 hours: 7 enqueued, 6 completed, 1 failed or dead" in mail(day.text)
    assert "7 / 6 / 1" in mail(day.text)
    assert '<strong data-range="24h">24 h</strong>' in day.text
    assert "from the history the cleaners write" in day.text
    week = await client.get("/", params={"range": "7d"})
    assert "last 7 days: 47 enqueued, 46 completed, 1 failed or dead; peak 40/hour" in week.text
    assert week.text.count('data-queue="reports"') == 1  # a queue without history is listed
    assert (await client.get("/", params={"range": "1y"})).status_code == 400


async def test_timings_per_task_of_the_last_hour(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    page = await client.get("/timings")
    assert page.status_code == 200
    assert "the last 5,000 completed" in page.text
    rows = page.text.split('id="timings"')[1]
    send = rows.split('data-task-name="send"')[1].split("</tr>")[0]
    broken = rows.split('data-task-name="broken"')[1].split("</tr>")[0]
    # send: one completed run; broken: one dead letter; flaky waits for its retry
    assert '<td class="num">1</td><td class="num">0</td>' in send
    assert '<td class="num">1</td><td class="num">1</td>' in broken
    assert 'data-task-name="flaky"' not in rows
    assert "ms</td>" in send  # a wait and a run time of a few milliseconds
