"""The dashboard's deeper views and settings over HTTP, on every database: the queues' history
over a day or a week, timings per task, queue rates and key limits set at run time."""

from __future__ import annotations

import httpx

from tests.web.conftest import Seeded, act, client_for, csrf_of
from txtasks import App
from txtasks.driver.history import HistoryRow, minute_number
from txtasks.keys import KeyOverride, Rate
from txtasks.web import create_app


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


async def test_set_and_clear_a_queue_rate_and_a_key_limit(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    control = dashboard_app.driver.control
    page = await client.get("/limits")
    assert page.status_code == 200 and 'data-queue="mail"' in page.text

    done = await act(client, "queue_rate", queue="mail", rate="10/s", burst="5")
    assert done.status_code == 303 and "rate%2010/1s%20burst%205" in done.headers["location"]
    assert await control.queue_rates_stored() == {"mail": Rate(10, 1.0, 5)}
    shown = (await client.get("/limits")).text.split('data-queue="mail"')[1].split("</tr>")[0]
    assert "rate 10/1s burst 5" in shown
    done = await act(client, "queue_rate_clear", queue="mail")
    assert "rate%20cleared" in done.headers["location"]
    assert await control.queue_rates_stored() == {}

    done = await act(
        client, "key_limits", key="tenant-1", queue="", concurrency="2", ordered="", rate="5/m"
    )
    assert done.status_code == 303, done.text
    assert await control.key_override_list() == [
        KeyOverride("tenant-1", None, 2, None, Rate(5, 60.0))
    ]
    shown = (await client.get("/limits")).text.split('data-key="tenant-1"')[1].split("</tr>")[0]
    assert "every queue" in shown and "concurrency 2, rate 5/60s burst 1" in shown
    await act(client, "key_limits", key="tenant-1", queue="mail", ordered="yes")
    await act(client, "key_limits_clear", key="tenant-1")
    assert await control.key_override_list() == [KeyOverride("tenant-1", "mail", ordered=True)]


async def test_limits_need_valid_input_csrf_and_a_writable_dashboard(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    control = dashboard_app.driver.control
    token = await csrf_of(client, "/limits")
    for fields, said in [
        ({"action": "queue_rate", "queue": "mail", "rate": "fast"}, "not COUNT/PERIOD"),
        ({"action": "queue_rate", "queue": "mail"}, "give a rate"),
        ({"action": "queue_rate", "rate": "1/s"}, "give a queue"),
        ({"action": "key_limits", "key": "k"}, "give a concurrency"),
        ({"action": "key_limits", "concurrency": "2"}, "give a key"),
        ({"action": "key_limits", "key": "k", "concurrency": "0"}, "at least 1"),
        ({"action": "key_limits", "key": "k", "burst": "2"}, "goes with a rate"),
    ]:
        refused = await client.post("/action", data={"csrf": token, "confirmed": "yes", **fields})
        assert refused.status_code == 400 and said in refused.text, (fields, refused.text)
    forged = {"action": "queue_rate", "queue": "mail", "rate": "1/s", "confirmed": "yes"}
    assert (await client.post("/action", data={**forged, "csrf": "forged"})).status_code == 403
    async with client_for(create_app(dashboard_app, read_only=True, refresh=0)) as http:
        page = await http.get("/limits")
        assert page.status_code == 200 and 'action="/action"' not in page.text
        token = http.cookies["txtasks_csrf"]
        refused = await http.post("/action", data={**forged, "csrf": token})
        assert refused.status_code == 403
    assert await control.queue_rates_stored() == {}


async def test_tasks_and_dead_letters_by_text_in_their_payload(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    found = await client.get("/tasks", params={"payload": "B@EXAMPLE"})
    assert f'data-task="{seeded.waiting}"' in found.text
    assert f'data-task="{seeded.retrying}"' not in found.text
    assert "Text in the payload is looked for among the next 5000 tasks" in found.text
    assert 'name="payload" value="B@EXAMPLE"' in found.text
    dead = await client.get("/dead", params={"payload": "7"})
    assert f'data-task="{seeded.dead}"' in dead.text
    assert 'name="match_payload" value="7"' in dead.text  # "every dead letter matching"
    none = await client.get("/dead", params={"payload": "8"})
    assert f'data-task="{seeded.dead}"' not in none.text
    # purge every dead letter with the text: the confirmation names the filter
    token = await csrf_of(client, "/dead")
    data = {"csrf": token, "action": "purge", "back": "/dead", "match": "yes", "match_payload": "7"}
    asked = await client.post("/action", data=data)
    assert "payload containing &#39;7&#39;" in asked.text
    done = await client.post("/action", data={**data, "confirmed": "yes"})
    assert done.status_code == 303 and "1%20purged" in done.headers["location"]
    assert await dashboard_app.control.ainspect(seeded.dead) is None
