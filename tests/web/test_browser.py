"""The dashboard in a real headless Chromium (Debian's `chromium`, driven by Playwright), on
PostgreSQL: the queue view, a filtered task list, a task, a dead letter re-driven and run by a
worker in this process, a queue paused (no claim) and resumed, the page refreshing itself.

A screenshot of each main view is saved under $TXTASKS_TEST_ARTIFACTS/dashboard (default:
test-artifacts/dashboard at the repository root). Without Chromium or Playwright the test is
skipped, and fails when CI is set, like a missing server.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from cleaner.daemon import Cleaner, CleanerConfig
from tests import pace
from tests.conftest import backends
from tests.servers import in_ci
from tests.waiting import until
from tests.web.conftest import BROKEN, Seeded
from txtasks import App
from txtasks.testing import run_until_empty
from txtasks.web import create_app
from txtasks.worker import Worker, WorkerConfig

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("TXTASKS_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("TXTASKS_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "dashboard"
pytestmark = [
    pytest.mark.parametrize("database_url", backends("postgresql"), indirect=True),
    pytest.mark.timeout(90),
]


def _missing(what: str) -> None:
    message = f"dashboard browser test: {what}"
    if in_ci():
        pytest.fail(f"{message} (CI is set: a missing browser is a failure)", pytrace=False)
    pytest.skip(message)


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    if not shutil.which(CHROMIUM):
        _missing(f"no {CHROMIUM} (apt-get install chromium; see tests/install-deps.sh)")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield launched
        await launched.close()


@pytest.fixture
async def served(dashboard_app: App) -> AsyncIterator[str]:
    """The dashboard served by uvicorn on a free loopback port, in this event loop."""
    async with serving(create_app(dashboard_app, refresh=0.3)) as url:
        yield url


@asynccontextmanager
async def serving(asgi: Any) -> AsyncIterator[str]:
    """`asgi` served by uvicorn on a free loopback port, in this event loop: its URL."""
    import uvicorn

    config = uvicorn.Config(asgi, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    running = asyncio.create_task(server.serve())
    await until(lambda: server.started or running.done(), "uvicorn started")
    assert server.started, running
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(running, pace.seconds(10))


async def new_page(browser: Any) -> Any:
    """A page whose waits (Playwright's default: 30 s) allow for the run's pace."""
    page = await browser.new_page(viewport={"width": 1280, "height": 800})
    page.set_default_timeout(pace.seconds(30) * 1000)
    return page


async def shot(page: Any, name: str) -> Path:
    """Save a screenshot of the page and check it is an image with something in it."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000, f"{path}: empty screenshot"
    return path


async def confirm(page: Any) -> None:
    """Answer the confirmation page of an action, and land back where it came from."""
    await page.wait_for_selector("#confirm-button")
    await page.click("#confirm-button")
    await page.wait_for_selector("#done")


async def state_of(app: App, task_id: int) -> str | None:
    row = await app.control.ainspect(task_id)
    return None if row is None else row.state.value


async def test_the_dashboard_in_chromium(
    browser: Any, served: str, dashboard_app: App, seeded: Seeded
) -> None:
    app = dashboard_app
    page = await new_page(browser)

    # the queue view, and it refreshes itself: a queue that gets tasks appears without a reload
    await page.goto(served + "/")
    await page.wait_for_selector('tr[data-queue="reports"]')
    # the chart of the last hour: tasks enqueued (a line) and finished (bars) per minute
    chart = page.locator('tr[data-queue="mail"] svg.chart')
    assert await chart.locator("polyline.arrived").count() == 1
    assert await chart.locator("rect.ok").count() >= 1
    assert "2 enqueued, 1 completed" in await chart.locator("title").text_content()
    await shot(page, "queues")
    await app.aenqueue("send", {"to": "c@example.com"}, queue="newsletters", delay=60)
    await page.wait_for_selector('tr[data-queue="newsletters"]', timeout=pace.seconds(10) * 1000)

    # filter the tasks, then open one
    await page.goto(served + "/tasks")
    await page.fill("input[name=key]", "tenant-1")
    await page.click("form#filters button[type=submit]")
    await page.wait_for_selector(f'tr[data-task="{seeded.waiting}"]')
    assert await page.locator("#task-rows tr[data-task]").count() == 1
    await shot(page, "tasks")
    await page.click(f'tr[data-task="{seeded.waiting}"] a')
    await page.wait_for_selector("#payload")
    assert "b@example.com" in await page.inner_text("#payload")
    await shot(page, "task")

    # a dead letter's last error, with its traceback and the exception it was raised from
    await page.goto(f"{served}/tasks/{seeded.dead}")
    error = await page.inner_text("#error")
    assert error.startswith("RuntimeError: report 7 failed: disk full")
    assert "at tests.web.conftest.broken line " in error
    assert "caused by: OSError: [Errno 28] No space left on device" in error
    await shot(page, "task-error")

    # re-drive a dead letter from a selection, and see a worker run it
    await page.goto(served + "/dead")
    await page.check(f'tr[data-task="{seeded.dead}"] input[name=id]')
    listed = await page.inner_text(f'tr[data-task="{seeded.dead}"] td.error')
    assert listed == "RuntimeError: report 7 failed: disk full"  # the exception, not the attempt
    await shot(page, "dead")
    BROKEN["disk"] = False
    worker = Worker(app, WorkerConfig(queues=("reports",), poll_interval=0.05))
    running = asyncio.create_task(worker.run())
    try:
        await page.click("#requeue-selected")
        await confirm(page)
        assert "1 re-driven" in await page.inner_text("#done")
        await until(lambda: _is(app, seeded.dead, "completed"), "the re-driven task completed")
    finally:
        worker.stop()
        await asyncio.wait_for(running, pace.seconds(10))
    await page.goto(f"{served}/tasks/{seeded.dead}")
    assert "completed" in await page.inner_text("h2")

    # pause a queue: a worker claims none of its tasks; resume it: they run
    await page.goto(served + "/")
    await page.click('tr[data-queue="mail"] button[data-action="pause"]')
    await confirm(page)
    await page.wait_for_selector('tr[data-queue="mail"] .paused')
    held = await app.aenqueue("send", {"to": "d@example.com"})
    stats = await run_until_empty(app, queues=["mail"])
    assert stats.claimed == 0 and await state_of(app, held) == "pending"
    await page.click('tr[data-queue="mail"] button[data-action="resume"]')
    await confirm(page)
    await run_until_empty(app, queues=["mail"])
    assert await state_of(app, held) == "completed"

    await page.goto(f"{served}/periodic")
    # no cleaner alive: the page says the schedules do not fire, and what to start
    assert "txtasks cleaner APP" in await page.inner_text("#no-cleaner")
    await shot(page, "periodic")

    # the workers view: a cleaner and a worker alive, from their heartbeat rows
    cleaner = Cleaner(app, CleanerConfig(rescuer=None, reannouncer=None, periodic=None))
    worker = Worker(app, WorkerConfig(queues=("mail",), poll_interval=0.05))
    running = asyncio.create_task(worker.run())
    await cleaner.start()
    try:
        await page.goto(f"{served}/workers")
        await page.wait_for_selector(
            'tr[data-process="cleaner"].alive', timeout=pace.seconds(10) * 1000
        )
        await page.wait_for_selector(
            'tr[data-process="worker"].alive', timeout=pace.seconds(10) * 1000
        )
        assert "archiver, retention" in await page.inner_text('tr[data-process="cleaner"]')
        await shot(page, "workers")
        # a cleaner is alive: the queue view no longer warns; this one fires no schedule
        await page.goto(served + "/")
        await page.wait_for_selector('tr[data-queue="mail"]')
        assert await page.locator("#no-cleaner").count() == 0
        await page.goto(f"{served}/periodic")
        assert "periodic" in await page.inner_text("#no-cleaner")
    finally:
        worker.stop()
        await asyncio.wait_for(running, pace.seconds(10))
        await cleaner.stop()


async def _is(app: App, task_id: int, state: str) -> bool:
    return await state_of(app, task_id) == state


async def test_bulk_actions_in_chromium(
    browser: Any, served: str, dashboard_app: App, seeded: Seeded
) -> None:
    """Select tasks on the task list (one by one, or every one on the page), act on them with
    a confirmation step, and read how many changed."""
    app = dashboard_app
    page = await new_page(browser)
    later = await app.aenqueue("send", {"to": "later"}, delay=3600)

    async def selected(action: str, *ids: int, path: str = "/tasks") -> str:
        await page.goto(served + path)
        for task_id in ids:
            await page.check(f'tr[data-task="{task_id}"] input[name=id]')
        await page.click(f"#{action}-selected")
        await confirm(page)
        return str(await page.inner_text("#done"))

    # every live task on the page: the waiting ones become due now
    await page.goto(served + "/tasks")
    await page.check("#select-all")
    assert await page.locator("input[name=id]:checked").count() == 3
    await shot(page, "tasks-selected")
    await page.click("#run_now-selected")
    await page.wait_for_selector("#describe")
    assert "run now tasks" in await page.inner_text("#describe")
    await confirm(page)
    assert "3 of 3 made due now" in await page.inner_text("#done")

    # cancel one, retry a dead letter, delete a finished task
    assert "cancelled (was pending)" in await selected("cancel", later)
    assert await state_of(app, later) == "cancelled"
    said = await selected("retry", seeded.dead, path="/tasks?state=dead")
    assert "1 of 1 run again" in said and await state_of(app, seeded.dead) == "pending"
    [done] = await app.control.atask_list(states=["completed"])
    said = await selected("delete", done.id, path="/tasks?state=completed")
    assert "1 of 1 deleted" in said and await state_of(app, done.id) is None
    # live tasks are not deleted: cancel them first
    said = await selected("delete", seeded.waiting, seeded.retrying)
    assert "0 of 2 deleted" in said and await state_of(app, seeded.waiting) == "pending"


async def test_a_long_payload_opens_on_a_click(
    browser: Any, served: str, dashboard_app: App, seeded: Seeded
) -> None:
    long = await dashboard_app.aenqueue("send", {"lines": [f"line {n}" for n in range(40)]})
    page = await new_page(browser)
    await page.goto(f"{served}/tasks/{long}")
    assert not await page.is_visible("#payload")  # collapsed: its size only
    assert "lines: show" in await page.inner_text("#payload-details summary")
    assert "UTC" in await page.inner_text("#task-fields")
    await page.click("#payload-details summary")
    await page.wait_for_selector("#payload", state="visible")
    assert "line 39" in await page.inner_text("#payload")
    # the page refreshes itself (every 0.3 s here) and the payload stays open
    before = await page.evaluate("document.getElementById('live').dataset.updated || '0'")
    await page.wait_for_function(
        f"(document.getElementById('live').dataset.updated || '0') !== '{before}'"
    )
    assert await page.is_visible("#payload")
    await shot(page, "task-long-payload")


async def test_the_busy_view_shows_a_running_task(
    browser: Any, served: str, dashboard_app: App, seeded: Seeded
) -> None:
    """A worker in this process runs a task that waits: the busy view lists it under the
    worker, with its attempt and when it started."""
    app = dashboard_app
    started, release = asyncio.Event(), asyncio.Event()

    @app.task(name="export", queue="exports")
    async def export(payload: Any) -> None:
        started.set()
        await release.wait()

    task_id = await app.aenqueue("export", {"month": "2026-10"})
    worker = Worker(app, WorkerConfig(queues=("exports",), poll_interval=0.05))
    running = asyncio.create_task(worker.run())
    page = await new_page(browser)
    try:
        await asyncio.wait_for(started.wait(), pace.seconds(10))
        await page.goto(f"{served}/busy")
        row = f'section[data-worker="{worker.worker_id}"] tr[data-task="{task_id}"]'
        await page.wait_for_selector(row, timeout=pace.seconds(10) * 1000)
        text = await page.inner_text(row)
        assert "export" in text and "exports" in text and "1/" in text and "UTC" in text
        assert "1 running" in await page.inner_text(f'section[data-worker="{worker.worker_id}"]')
        await shot(page, "busy")
    finally:
        release.set()
        worker.stop()
        await asyncio.wait_for(running, pace.seconds(10))


async def test_the_queue_chart_over_a_day_and_the_timings_in_chromium(
    browser: Any, served: str, dashboard_app: App, seeded: Seeded
) -> None:
    """The queue page's range: 24 hours from the history the cleaners write; then the
    timings per task of the last hour."""
    from txtasks.driver.history import HistoryRow, minute_number

    minute = minute_number(dashboard_app.clock())
    row = HistoryRow(minute - 120, "mail", enqueued=7, completed=6, dead=1)
    await dashboard_app.driver.sweeps.history_write([row])
    page = await new_page(browser)
    await page.goto(served + "/")
    await page.wait_for_selector('#range strong[data-range="1h"]')
    await page.click('#range a[data-range="24h"]')
    await page.wait_for_selector('#range strong[data-range="24h"]')
    title = await page.locator('tr[data-queue="mail"] svg.chart title').text_content()
    assert title.startswith("last 24 hours: 7 enqueued, 6 completed, 1 failed or dead")
    # the page refreshes itself in the range chosen
    before = await page.evaluate("document.getElementById('live').dataset.updated || '0'")
    await page.wait_for_function(
        f"(document.getElementById('live').dataset.updated || '0') !== '{before}'"
    )
    assert await page.locator('#range strong[data-range="24h"]').count() == 1
    await shot(page, "queues-day")

    await page.click('header a[href$="/timings"]')
    await page.wait_for_selector('#timings tr[data-task-name="send"]')
    cells = await page.locator('#timings tr[data-task-name="broken"] td').all_inner_texts()
    assert cells[:3] == ["broken", "1", "1"]  # one run, dead-lettered
    assert "5,000" in await page.inner_text("#timings-window")
    await shot(page, "timings")


async def test_queue_rates_and_key_limits_set_in_chromium(
    browser: Any, served: str, dashboard_app: App, seeded: Seeded
) -> None:
    """Set a queue's rate and a key's limits from the limits page, each after a confirmation,
    and clear them again: the stored values are those the CLI and the workers read."""
    from txtasks.keys import KeyOverride, Rate

    control = dashboard_app.driver.control
    page = await new_page(browser)
    await page.goto(served + "/limits")
    mail = 'tr[data-queue="mail"]'
    await page.fill(f"{mail} input[name=rate]", "10/s")
    await page.fill(f"{mail} input[name=burst]", "3")
    await page.click(f'{mail} button[data-action="queue_rate"]')
    await page.wait_for_selector("#describe")
    assert "to rate 10/1s burst 3" in await page.inner_text("#describe")
    await confirm(page)
    assert "queue mail: rate 10/1s burst 3" in await page.inner_text("#done")
    assert await control.queue_rates_stored() == {"mail": Rate(10, 1.0, 3)}
    assert await page.inner_text(f"{mail} td.set") == "rate 10/1s burst 3"

    form = "#key-limits-form"
    await page.fill(f"{form} input[name=key]", "tenant-1")
    await page.fill(f"{form} input[name=concurrency]", "2")
    await page.select_option(f"{form} select[name=ordered]", "yes")
    await page.click(f'{form} button[data-action="key_limits"]')
    await confirm(page)
    assert "key tenant-1 in every queue: concurrency 2, ordered" in await page.inner_text("#done")
    assert await control.key_override_list() == [KeyOverride("tenant-1", None, 2, True)]
    await page.wait_for_selector('tr[data-key="tenant-1"]')
    await shot(page, "limits")

    await page.click(f'{mail} button[data-action="queue_rate_clear"]')
    await confirm(page)
    assert "rate cleared" in await page.inner_text("#done")
    await page.click('tr[data-key="tenant-1"] button[data-action="key_limits_clear"]')
    await confirm(page)
    assert "limits cleared" in await page.inner_text("#done")
    assert await control.queue_rates_stored() == {} and await control.key_override_list() == []


async def test_search_by_payload_text_in_chromium(
    browser: Any, served: str, dashboard_app: App, seeded: Seeded
) -> None:
    """Type text of a payload in the filters of the task list and of the dead letters."""
    page = await new_page(browser)
    await page.goto(served + "/tasks")
    await page.fill("input[name=payload]", "B@EXAMPLE")
    await page.click("form#filters button[type=submit]")
    await page.wait_for_selector(f'tr[data-task="{seeded.waiting}"]')
    assert await page.locator("#task-rows tr[data-task]").count() == 1
    assert "looked for among the next 5000" in await page.inner_text("#search-window")
    await shot(page, "tasks-payload")
    await page.goto(served + "/dead")
    await page.fill("input[name=payload]", "7")
    await page.click("form#filters button[type=submit]")
    await page.wait_for_selector(f'tr[data-task="{seeded.dead}"]')
    assert await page.locator("#requeue-matching").count() == 1  # every dead letter matching


async def test_a_page_asks_for_its_next_refresh_only_once_the_last_is_answered(
    browser: Any, dashboard_app: App, seeded: Seeded
) -> None:
    """A server that answers slower than the refresh interval is asked by a page for one
    refresh at a time: the next ticks `refresh` seconds after the last answer, so requests of
    its own pages never queue up in the browser and keep a slow dashboard busy for good."""
    dashboard = create_app(dashboard_app, refresh=0.05)
    answered = 0

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        nonlocal answered
        if scope["type"] != "http" or (b"x-live", b"1") not in scope["headers"]:
            return await dashboard(scope, receive, send)
        await asyncio.sleep(0.3)  # the slow server: six refresh intervals per answer
        await dashboard(scope, receive, send)
        answered += 1

    async with serving(slow) as url:
        page = await new_page(browser)
        asked: list[str] = []
        page.on("request", lambda r: r.headers.get("x-live") and asked.append(r.url))
        await page.goto(url + "/")
        await until(lambda: answered >= 3, "three refreshes answered", timeout=10)
        await page.close()
    assert 3 <= len(asked) <= answered + 1, (len(asked), answered)
