"""The dashboard's pages and actions over HTTP, on every database."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from tests.web.conftest import CSRF, Seeded, act, client_for, csrf_of
from txtasks import App, ConfigurationError, MemoryDriver
from txtasks.driver import sql_dashboard
from txtasks.policy import error_summary
from txtasks.testing import run_until_empty
from txtasks.web import create_app


async def test_queues_page_shows_depths_paused_and_chart(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    await dashboard_app.control.apause("mail")
    page = await client.get("/")
    assert page.status_code == 200
    text = page.text
    assert 'data-queue="mail"' in text and 'data-queue="reports"' in text
    assert "paused since" in text
    assert "<svg" in text and "1 completed" in text  # the hour's chart title
    # enqueued in the hour, live or finished since: mail a completed task and a waiting one,
    # reports a dead letter and a retrying task
    mail = text.split('data-queue="mail"')[1].split("</tr>")[0]
    reports = text.split('data-queue="reports"')[1].split("</tr>")[0]
    assert "2 / 1 / 0" in mail and "2 enqueued, 1 completed, 0 failed" in mail
    assert "2 / 0 / 1" in reports and 'class="arrived"' in reports
    assert "tenant-1" in text  # the busiest keys


async def test_tasks_filters_and_pages(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    ids = [await dashboard_app.aenqueue("send", {"n": n}, delay=3600) for n in range(5)]
    small = client_for(create_app(dashboard_app, refresh=0, page_size=2))
    async with small:
        first = await small.get("/tasks", params={"queue": "mail"})
        assert first.status_code == 200
        shown = [i for i in ids if f'data-task="{i}"' in first.text]
        assert shown == ids[-2:]  # newest first
        assert 'id="next-page"' in first.text
        after = first.text.split('id="next-page" href="?')[1].split('"')[0].replace("&amp;", "&")
        second = await small.get(f"/tasks?{after}")
        assert [i for i in ids if f'data-task="{i}"' in second.text] == ids[1:3]
    by_key = await client.get("/tasks", params={"key": "tenant-1"})
    assert f'data-task="{seeded.waiting}"' in by_key.text
    assert f'data-task="{ids[0]}"' not in by_key.text
    by_error = await client.get("/tasks", params={"state": "dead", "error": "disk full"})
    assert f'data-task="{seeded.dead}"' in by_error.text
    none = await client.get("/tasks", params={"state": "dead", "error": "100%_no such"})
    assert "No task matches" in none.text
    retrying = await client.get("/tasks", params={"state": "retryable", "task": "flaky"})
    assert f'data-task="{seeded.retrying}"' in retrying.text


async def test_lists_show_the_exception_of_a_task_out_of_retries(
    client: httpx.AsyncClient, seeded: Seeded
) -> None:
    for path in ("/dead", "/tasks?state=dead"):
        page = await client.get(path)
        row = page.text.split(f'<tr data-task="{seeded.dead}">')[1].split("</tr>")[0]
        error = row.split('<td class="error">')[1].split("</td>")[0]
        assert error == "RuntimeError: report 7 failed: disk full", path


def test_error_summary_names_the_exception_of_any_stored_text() -> None:
    ours = "ValueError: bad\n  at shop.f line 3: x()\ncaused by: KeyError: 'a'\n(attempt 2 of 2)"
    assert error_summary(ours) == "ValueError: bad"
    python = "Traceback (most recent call last):\n  File x, line 1\nOSError: gone\n(attempt 2 of 2)"
    assert error_summary(python) == "OSError: gone"
    assert error_summary("lease expired\n(deadline 2026-01-01 passed)") == "lease expired"
    assert error_summary(None) == error_summary("  ") == ""


async def test_task_detail_shows_error_payload_and_result(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    dead = await client.get(f"/tasks/{seeded.dead}")
    assert dead.status_code == 200
    assert 'id="error"' in dead.text and "report 7 failed: disk full" in dead.text
    # its traceback, and the exception it was raised from with its own
    error = dead.text.split('id="error"')[1].split("</pre>")[0]
    assert "at tests.web.conftest.broken line " in error
    assert "caused by: OSError: [Errno 28] No space left on device" in error
    assert "at tests.web.conftest.write_report line " in error
    row = await dashboard_app.control.ainspect(seeded.dead)  # app.inspect holds the same text
    assert row is not None and "caused by: OSError" in (row.last_error or "")
    completed = await dashboard_app.control.atask_list(states=["completed"])
    page = await client.get(f"/tasks/{completed[0].id}")
    assert "a@example.com" in page.text
    assert (await client.get("/tasks/999999")).status_code == 404


async def test_bad_input_is_a_clear_error(client: httpx.AsyncClient, seeded: Seeded) -> None:
    wrong = await client.get("/tasks", params={"state": "nope"})
    assert wrong.status_code == 400 and "unknown state 'nope'" in wrong.text
    cursor = await client.get("/tasks", params={"state": "dead", "after": "x"})
    assert cursor.status_code == 400 and "cursor" in cursor.text


def test_the_dashboard_needs_a_database() -> None:
    with pytest.raises(ConfigurationError, match=r"needs a database \(not the memory driver"):
        create_app(App(driver=MemoryDriver()))


async def test_redacted_payloads_show_only_their_size(dashboard_app: App, seeded: Seeded) -> None:
    async with client_for(create_app(dashboard_app, redact_payloads=True, refresh=0)) as http:
        page = await http.get(f"/tasks/{seeded.waiting}")
    assert "b@example.com" not in page.text
    assert "[redacted:" in page.text


async def test_periodic_and_workers_pages(client: httpx.AsyncClient, seeded: Seeded) -> None:
    periodic = await client.get("/periodic")
    assert 'data-schedule="nightly"' in periodic.text
    workers = await client.get("/workers")
    assert workers.status_code == 200 and "No worker or cleaner is running" in workers.text


async def test_redrive_a_dead_letter_and_it_is_logged_with_who(
    client: httpx.AsyncClient,
    dashboard_app: App,
    seeded: Seeded,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="txtasks.web"):
        done = await act(client, "requeue", id=str(seeded.dead))
    assert done.status_code == 303
    row = await dashboard_app.control.ainspect(seeded.dead)
    assert row is not None and row.state.value == "pending"
    [record] = [r for r in caplog.records if r.name == "txtasks.web"]
    assert "requeue by anonymous@127.0.0.1" in record.getMessage()


async def test_purge_dead_letters_of_a_queue(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    await act(client, "purge", queue="reports")
    assert await dashboard_app.control.ainspect(seeded.dead) is None


async def test_cancel_run_now_pause_resume_and_periodic(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    await act(client, "run_now", id=str(seeded.retrying))
    row = await dashboard_app.control.ainspect(seeded.retrying)
    assert row is not None and row.run_at <= dashboard_app.clock()
    await act(client, "cancel", id=str(seeded.waiting))
    row = await dashboard_app.control.ainspect(seeded.waiting)
    assert row is not None and row.state.value == "cancelled"
    await act(client, "pause", queue="mail")
    assert "mail" in await dashboard_app.driver.control.queue_paused_list()
    await act(client, "resume", queue="mail")
    assert "mail" not in await dashboard_app.driver.control.queue_paused_list()
    before = {t.id for t in await dashboard_app.control.atask_list(queue="mail")}
    await act(client, "periodic_now", schedule="nightly")
    [fired] = [
        t for t in await dashboard_app.control.atask_list(queue="mail") if t.id not in before
    ]
    assert fired.task_name == "send"


async def test_post_without_csrf_is_refused(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    await csrf_of(client)  # the cookie is set; the form field is missing or wrong
    for data in (
        {"action": "purge", "id": str(seeded.dead), "confirmed": "yes"},
        {"action": "purge", "id": str(seeded.dead), "confirmed": "yes", "csrf": "forged"},
    ):
        refused = await client.post("/action", data=data)
        assert refused.status_code == 403 and "CSRF" in refused.text
    assert await dashboard_app.control.ainspect(seeded.dead) is not None


async def test_read_only_hides_and_refuses_every_action(dashboard_app: App, seeded: Seeded) -> None:
    async with client_for(create_app(dashboard_app, read_only=True, refresh=0)) as http:
        for path in ("/", "/dead", f"/tasks/{seeded.dead}", "/periodic"):
            page = await http.get(path)
            assert page.status_code == 200 and 'action="/action"' not in page.text, path
        token = http.cookies["txtasks_csrf"]  # set by the pages above, which have no form
        for action in ("requeue", "purge", "cancel", "run_now", "pause", "resume"):
            data = {"csrf": token, "action": action, "id": str(seeded.dead), "confirmed": "yes"}
            refused = await http.post("/action", data=data)
            assert refused.status_code == 403, action
    assert (await dashboard_app.control.ainspect(seeded.dead)).state.value == "dead"  # type: ignore[union-attr]


async def test_counts_stop_at_their_cap(dashboard_app: App, seeded: Seeded) -> None:
    for n in range(3):
        await dashboard_app.aenqueue("send", {"n": n}, delay=3600)
    depths = await dashboard_app.driver.dashboard.depths(now=dashboard_app.clock(), cap=2)
    assert (depths["mail"].scheduled, depths["mail"].capped) == (2, True)
    assert depths["reports"].dead == 1 and depths["reports"].scheduled == 1


async def test_dead_letters_are_counted_per_queue_up_to_the_cap(
    dashboard_app: App, seeded: Seeded
) -> None:
    """Each queue's count stops at the cap (along the archive's index of dead letters by
    queue)."""
    for n in range(3):
        await dashboard_app.aenqueue("broken", n, queue="exports")
    await run_until_empty(dashboard_app, queues=["exports"])
    depths = await dashboard_app.driver.dashboard.depths(now=dashboard_app.clock(), cap=2)
    assert (depths["exports"].dead, depths["exports"].capped) == (2, True)
    assert (depths["reports"].dead, depths["reports"].capped) == (1, False)
    page = await client_page(dashboard_app, "/")
    exports = page.split('data-queue="exports"')[1].split("</tr>")[0]
    assert '">3</a>' in exports  # under the page's cap (1,000): the count itself


async def client_page(app: App, path: str) -> str:
    async with client_for(create_app(app, refresh=0)) as http:
        return (await http.get(path)).text


async def test_depths_count_each_queue_by_state(dashboard_app: App, seeded: Seeded) -> None:
    for n in range(2):
        await dashboard_app.aenqueue("send", {"n": n})
    now = dashboard_app.clock()
    depths = await dashboard_app.driver.dashboard.depths(now=now)
    mail, reports = depths["mail"], depths["reports"]
    assert (mail.ready, mail.scheduled, mail.processing, mail.capped) == (3, 0, 0, False)
    assert mail.oldest_ready is not None and mail.oldest_ready <= now
    assert (reports.ready, reports.scheduled, reports.dead) == (0, 1, 1)
    assert reports.oldest_ready is None


async def test_error_text_is_looked_for_a_window_at_a_time(
    client: httpx.AsyncClient, seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql_dashboard, "SEARCH_WINDOW", 1)
    first = await client.get("/tasks", params={"error": "FLAKY"})  # the newest: no error
    assert "No task matches" in first.text and 'id="next-page"' in first.text
    after = first.text.split('id="next-page" href="?')[1].split('"')[0].replace("&amp;", "&")
    second = await client.get(f"/tasks?{after}")
    assert f'data-task="{seeded.retrying}"' in second.text


async def test_mounted_in_another_application(dashboard_app: App, seeded: Seeded) -> None:
    outer = Starlette(routes=[Mount("/ops", create_app(dashboard_app, refresh=0))])
    async with client_for(outer) as http:
        page = await http.get("/ops/dead")
        assert page.status_code == 200
        assert f'href="/ops/tasks/{seeded.dead}"' in page.text
        assert 'action="/ops/action"' in page.text
        token = CSRF.search(page.text).group(1)  # type: ignore[union-attr]
        data = {"csrf": token, "action": "requeue", "id": str(seeded.dead), "back": "/dead"}
        done = await http.post("/ops/action", data={**data, "confirmed": "yes"})
    assert done.status_code == 303 and done.headers["location"].startswith("/ops/dead?done=")
    assert (await dashboard_app.control.ainspect(seeded.dead)).state.value == "pending"  # type: ignore[union-attr]


async def test_redrive_and_purge_every_dead_letter_matching_a_filter(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    other = await dashboard_app.aenqueue("broken", 8)
    await run_until_empty(dashboard_app, queues=["reports"])
    assert (await dashboard_app.control.ainspect(other)).state.value == "dead"  # type: ignore[union-attr]
    page = await client.get("/dead", params={"error": "report 8 failed"})
    assert 'id="requeue-matching"' in page.text
    match = {"match": "yes", "match_error": "report 8 failed"}
    await act(client, "requeue", **match)
    assert (await dashboard_app.control.ainspect(other)).state.value == "pending"  # type: ignore[union-attr]
    assert (await dashboard_app.control.ainspect(seeded.dead)).state.value == "dead"  # type: ignore[union-attr]
    await act(client, "purge", match="yes", match_task="broken", match_queue="reports")
    assert await dashboard_app.control.ainspect(seeded.dead) is None
    both = await client.post(
        "/action",
        data={"csrf": await csrf_of(client), "action": "purge", "queue": "reports", **match},
    )
    assert both.status_code == 400 and "not more than one" in both.text


async def test_a_finished_task_shows_how_long_it_waited_and_ran(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    [completed] = await dashboard_app.control.atask_list(states=["completed"])
    page = await client.get(f"/tasks/{completed.id}")
    durations = page.text.split('id="durations">')[1].split("</dd>")[0]
    assert "waited" in durations and "last attempt ran" in durations


async def test_run_now_of_a_keyed_task_scheduled_later(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    later = await dashboard_app.aenqueue("send", {"to": "later"}, key="tenant-2", delay=3600)
    await run_until_empty(dashboard_app, queues=["mail"])  # the key is looked at: not due
    assert (await dashboard_app.control.ainspect(later)).state.value == "pending"  # type: ignore[union-attr]
    await act(client, "run_now", id=str(later))
    # without a hint, claims would not look at the key for an hour: a burst worker would wait
    await asyncio.wait_for(run_until_empty(dashboard_app, queues=["mail"]), 30)
    assert (await dashboard_app.control.ainspect(later)).state.value == "completed"  # type: ignore[union-attr]


async def test_workers_page_lists_workers_and_cleaners_alive_and_gone(
    client: httpx.AsyncClient, dashboard_app: App
) -> None:
    from datetime import timedelta

    from cleaner.daemon import Cleaner, CleanerConfig
    from txtasks.types import ProcessRow
    from txtasks.worker import Worker, WorkerConfig

    app = dashboard_app
    now = app.clock()
    gone = ProcessRow(
        "worker-killed", "worker", "old-host", 4242, "mail", 3,
        now - timedelta(minutes=10), now - timedelta(minutes=5), now - timedelta(minutes=4),
    )  # fmt: skip
    await app.driver.processes.process_beat(gone, forget_before=now - timedelta(hours=1))
    cleaner = Cleaner(app, CleanerConfig(rescuer=None, reannouncer=None, periodic=None))
    worker = Worker(app, WorkerConfig(queues=("mail", "reports"), poll_interval=0.05))
    running = asyncio.create_task(worker.run())
    await cleaner.start()
    try:
        await wait_for_rows(app, 3)
        page = await client.get("/workers")
        rows = {
            r.split("<td>")[2].split("</td>")[0]: r
            for r in page.text.split('id="processes"')[1].split("</table>")[0].split("<tr ")[1:]
        }
        cleaner_id = next(i for i in rows if i.startswith("cleaner:"))
        assert 'class="alive"' in rows[cleaner_id] and "archiver, retention" in rows[cleaner_id]
        mine = rows[worker.worker_id]
        assert 'class="alive"' in mine and ">mail</a>, <a" in mine and ">reports</a>" in mine
        assert 'class="gone"' in rows["worker-killed"]
        assert "stopped beating 4m ago" in rows["worker-killed"]
    finally:
        worker.stop()
        await asyncio.wait_for(running, 10)
        await cleaner.stop()
    # both stopped cleanly: their rows are gone, the killed worker's stays until forgotten
    assert [p.id for p in await app.driver.processes.process_list()] == ["worker-killed"]


async def wait_for_rows(app: App, count: int) -> None:
    from tests.waiting import until

    async def there() -> bool:
        return len(await app.driver.processes.process_list()) == count

    await until(there, f"{count} heartbeat rows")


async def test_pages_say_when_no_cleaner_is_alive_and_a_fire_is_overdue(
    client: httpx.AsyncClient, dashboard_app: App
) -> None:
    """A schedule whose next fire passed with no cleaner alive says so, and so does the queue
    view; a cleaner's heartbeat row running the periodic sweep takes the warning away."""
    from datetime import timedelta

    from txtasks.types import ProcessRow

    app = dashboard_app
    now = app.clock()
    await app.driver.sweeps.periodic_advance(
        "nightly",
        schedule=app.schedules["nightly"].spec,
        expected=None,
        next_fire_at=now - timedelta(hours=2),
        fires=[],
        now=now - timedelta(hours=3),
    )
    periodic = (await client.get("/periodic")).text
    assert 'id="no-cleaner"' in periodic and "these schedules do not fire" in periodic
    row = periodic.split('data-schedule="nightly"')[1].split("</tr>")[0]
    assert '<span class="overdue">overdue by 2.0h</span>' in row
    assert 'id="no-cleaner"' in (await client.get("/")).text

    def cleaner(runs: str, beat: timedelta) -> ProcessRow:
        return ProcessRow(
            f"cleaner:{runs}", "cleaner", "h", 1, runs, None, now - beat, now - beat,
            now - beat + timedelta(seconds=15),
        )  # fmt: skip

    forget = now - timedelta(hours=1)
    await app.driver.processes.process_beat(
        cleaner("periodic", timedelta(minutes=5)), forget_before=forget
    )
    assert 'id="no-cleaner"' in (await client.get("/periodic")).text  # stopped beating
    await app.driver.processes.process_beat(cleaner("archiver", timedelta(0)), forget_before=forget)
    assert 'id="no-cleaner"' not in (await client.get("/")).text
    assert 'id="no-cleaner"' in (await client.get("/periodic")).text  # fires none
    await app.driver.processes.process_beat(
        cleaner("rescuer,periodic", timedelta(0)), forget_before=forget
    )
    assert 'id="no-cleaner"' not in (await client.get("/periodic")).text


async def test_busy_page_shows_what_each_worker_runs(
    client: httpx.AsyncClient, dashboard_app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live worker's tasks (the first it started, at most a page's worth, and how many
    more), an idle one, and tasks held by a worker without a heartbeat row."""
    from datetime import timedelta

    from txtasks.types import ProcessRow
    from txtasks.web import app as web_app

    monkeypatch.setattr(web_app, "BUSY_PER_WORKER", 2)
    app = dashboard_app
    now = app.clock()
    forget = now - timedelta(hours=1)
    for worker in ("w-busy", "w-idle"):
        row = ProcessRow(
            worker, "worker", "host-1", 7, "mail,reports", 0, now, now, now + timedelta(minutes=1)
        )
        await app.driver.processes.process_beat(row, forget_before=forget)
    past = now - timedelta(minutes=5)
    ids = [await app.aenqueue("send", {"n": n}, run_at=past) for n in range(4)]
    claims = app.driver.claims
    for n, worker in enumerate(("w-busy", "w-busy", "w-busy", "w-lost")):
        at = now - timedelta(seconds=60 - n)
        await claims.task_claim_many(
            ["mail"], 1, now=at, lease_until=at + timedelta(minutes=5), worker_id=worker
        )
    page = await client.get("/busy")
    assert page.status_code == 200 and 'href="/busy" class="here"' in page.text
    busy = page.text.split('data-worker="w-busy"')[1].split("</section>")[0]
    assert "on host-1, pid 7" in busy and "3 running" in busy
    assert [i for i in ids if f'data-task="{i}"' in busy] == ids[:2]  # started first
    assert "and 1 more running" in busy and 'class="running-for">1m</td>' in busy
    assert 'data-action="cancel"' in busy
    idle = page.text.split('data-worker="w-idle"')[1].split("</section>")[0]
    assert "idle: running no task" in idle
    lost = page.text.split('data-worker="w-lost"')[1].split("</section>")[0]
    assert "no heartbeat row" in lost and f'data-task="{ids[3]}"' in lost
    async with client_for(create_app(app, read_only=True, refresh=0)) as http:
        assert 'action="/action"' not in (await http.get("/busy")).text


async def fail_for_good(app: App, payload: int) -> int:
    """A task of queue `reports` in state failed (as an ack policy failing it leaves it)."""
    from datetime import timedelta

    from txtasks.types import Outcome, OutcomeKind, TaskKey

    task_id = await app.aenqueue("flaky", payload, run_at=app.clock() - timedelta(seconds=1))
    now = app.clock()
    [row] = await app.driver.claims.task_claim_many(
        ["reports"], 1, now=now, lease_until=now + timedelta(minutes=5), worker_id="w"
    )
    key = TaskKey(row.id, row.attempt)
    await app.driver.claims.outcome_write_many(
        [Outcome(key, OutcomeKind.FAIL, error="bad row")], now=now, archive_completed=True
    )
    return task_id


async def test_bulk_actions_change_only_the_eligible_tasks(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    """Each action on a selection of tasks in mixed states changes those it applies to, and
    the page it lands on says how many."""
    from datetime import timedelta

    app = dashboard_app

    async def state(task_id: int) -> str | None:
        row = await app.control.ainspect(task_id)
        return None if row is None else row.state.value

    failed = await fail_for_good(app, 2)
    [completed] = [t.id for t in await app.control.atask_list(states=["completed"])]
    now = app.clock()
    running = await app.aenqueue("send", {"to": "r"}, run_at=now - timedelta(seconds=1))
    await app.driver.claims.task_claim_many(
        ["mail"], 1, now=now, lease_until=now + timedelta(minutes=5), worker_id="w"
    )
    assert await state(running) == "processing" and await state(failed) == "failed"
    page = await client.get("/tasks")
    assert 'id="select-all"' in page.text and 'id="delete-selected"' in page.text
    assert f'name="id" value="{seeded.waiting}" form="selection"' in page.text

    async def bulk(action: str, *ids: int) -> str:
        done = await act(client, action, id=[str(i) for i in ids], back="/tasks")
        assert done.status_code == 303, done.text
        landed = await client.get(done.headers["location"])
        return landed.text.split('id="done">')[1].split("</p>")[0]

    later = await app.aenqueue("send", {"to": "later"}, delay=3600)
    said = await bulk("run_now", later, seeded.retrying, running, seeded.dead)
    assert said == "2 of 4 made due now (the others were not waiting)"
    assert (await app.control.ainspect(later)).run_at <= app.clock()  # type: ignore[union-attr]
    said = await bulk("retry", seeded.dead, failed, completed, later)
    assert said.startswith("2 of 4 run again")
    assert [await state(i) for i in (seeded.dead, failed, completed, later)] == [
        "pending", "pending", "completed", "pending"
    ]  # fmt: skip
    said = await bulk("cancel", later, running, completed)
    assert said == (
        "1 of 3 cancelled; 1 running: asked to stop; "
        "1 left as they were (finished already, or not found)"
    )
    assert await state(later) == "cancelled" and await state(running) == "processing"
    said = await bulk("delete", completed, later, seeded.waiting)
    assert said.startswith("2 of 3 deleted")
    assert await state(completed) is None and await state(later) is None
    assert await state(seeded.waiting) == "pending"
    too_many = await client.post(
        "/action",
        data={"csrf": await csrf_of(client), "action": "delete", "id": list(range(1, 502))},
    )
    assert too_many.status_code == 400 and "at most 500" in too_many.text


async def test_bulk_actions_need_csrf_and_a_writable_dashboard(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    await csrf_of(client)
    ids = [str(seeded.dead), str(seeded.waiting)]
    for action in ("run_now", "cancel", "retry", "delete"):
        data = {"action": action, "id": ids, "confirmed": "yes"}
        for forged in ({}, {"csrf": "forged"}):
            refused = await client.post("/action", data={**data, **forged})
            assert refused.status_code == 403 and "CSRF" in refused.text, action
    async with client_for(create_app(dashboard_app, read_only=True, refresh=0)) as http:
        page = await http.get("/tasks")
        assert 'name="id"' not in page.text and 'id="select-all"' not in page.text
        token = http.cookies["txtasks_csrf"]
        for action in ("run_now", "cancel", "retry", "delete"):
            data = {"csrf": token, "action": action, "id": ids, "confirmed": "yes"}
            assert (await http.post("/action", data=data)).status_code == 403, action
    assert (await dashboard_app.control.ainspect(seeded.dead)).state.value == "dead"  # type: ignore[union-attr]
    assert (await dashboard_app.control.ainspect(seeded.waiting)).state.value == "pending"  # type: ignore[union-attr]


async def test_long_payloads_are_collapsed_and_times_say_their_zone(
    client: httpx.AsyncClient, dashboard_app: App, seeded: Seeded
) -> None:
    long = await dashboard_app.aenqueue("send", {"lines": [f"line {n}" for n in range(40)]})
    page = (await client.get(f"/tasks/{long}")).text
    collapsed = page.split('<details class="long" id="payload-details">')[1].split("</details>")[0]
    assert "characters, 44 lines: show</summary>" in collapsed and "line 39" in collapsed
    short = (await client.get(f"/tasks/{seeded.waiting}")).text
    assert "<details" not in short and 'id="payload"' in short
    created = short.split("<dt>created</dt><dd>")[1].split("</dd>")[0]
    row = await dashboard_app.control.ainspect(seeded.waiting)
    assert row is not None
    stamp = row.created_at.strftime("%Y-%m-%d %H:%M:%S")
    assert created == (
        f'<time datetime="{row.created_at:%Y-%m-%dT%H:%M:%S}Z" title="UTC">{stamp} UTC</time>'
    )
    listed = (await client.get("/tasks")).text
    assert " UTC</time></td>" in listed
