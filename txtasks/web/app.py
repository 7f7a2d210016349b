"""The dashboard as a Starlette application: server-rendered pages over an App's admin API,
and actions behind a confirmation page, a CSRF token and a server-side log of who did what."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from txtasks.app import App
from txtasks.driver.sql import SqlDriver
from txtasks.errors import ConfigurationError, TxtasksError
from txtasks.task import check_queue_name
from txtasks.types import TaskRow
from txtasks.web.charts import sparkline
from txtasks.web.queries import (
    COUNT_CAP,
    FINISHED,
    LIVE,
    SEARCH_WINDOW,
    QueueDepth,
    Reads,
    TaskQuery,
    check_cursor,
)
from txtasks.web.security import CSRF_COOKIE, CSRF_FIELD, Auth, csrf_ok, new_csrf_token

log = logging.getLogger("txtasks.web")
HERE = Path(__file__).parent


@dataclass(frozen=True)
class Settings:
    """How the dashboard behaves: `read_only` shows no action and refuses every POST;
    `redact_payloads` hides payloads, results and checkpoints; `auth` (None: none) is asked of
    every request; pages refresh every `refresh` seconds (0: never)."""

    read_only: bool = False
    redact_payloads: bool = False
    auth: Auth | None = None
    refresh: float = 5.0
    page_size: int = 50


def create_app(
    app: App,
    *,
    read_only: bool = False,
    redact_payloads: bool = False,
    auth: Auth | None = None,
    refresh: float = 5.0,
    page_size: int = 50,
    close_app: bool = False,
) -> ASGIApp:
    """The dashboard of `app` as an ASGI application, to serve (`txtasks dashboard`) or to
    mount in another one (`Mount("/tasks", create_app(app))`). `close_app`: close the App's
    connections when the application shuts down (for an App it owns)."""
    if page_size < 1:
        raise ConfigurationError(f"page_size: must be at least 1, got {page_size!r}")
    if not isinstance(app.driver, SqlDriver):
        raise ConfigurationError("dashboard: needs a database (not a MemoryDriver)")
    settings = Settings(read_only, redact_payloads, auth, refresh, page_size)
    return Dashboard(app, settings, close_app=close_app).asgi


class Dashboard:
    def __init__(self, app: App, settings: Settings, *, close_app: bool) -> None:
        self.app, self.settings, self.close_app = app, settings, close_app
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(["html"]),
        )
        self.templates.filters["age"] = _age
        self.templates.filters["when"] = _when
        self.templates.globals.update(cap=COUNT_CAP, search_window=SEARCH_WINDOW)
        routes = [
            Route("/", self.page_queues),
            Route("/tasks", self.page_tasks),
            Route("/tasks/{task_id:int}", self.page_task),
            Route("/dead", self.page_dead),
            Route("/periodic", self.page_periodic),
            Route("/workers", self.page_workers),
            Route("/action", self.action, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        self.asgi: ASGIApp = _Guard(Starlette(routes=routes, lifespan=self.lifespan), settings.auth)

    @asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        yield
        if self.close_app:
            await self.app.aclose()

    @property
    def reads(self) -> Reads:
        driver = self.app.driver
        assert isinstance(driver, SqlDriver)  # checked by create_app
        return Reads(driver)

    # -- rendering ----------------------------------------------------------------------------

    def render(self, request: Request, name: str, **context: Any) -> HTMLResponse:
        token = request.cookies.get(CSRF_COOKIE) or new_csrf_token()
        root = request.scope.get("root_path", "")
        path = request.url.path
        here = path[len(root) :] if root and path.startswith(root) else path
        if request.url.query:
            here += "?" + request.url.query
        context.setdefault("refresh", self.settings.refresh)
        context.update(
            request=request,
            root=root,
            here=here or "/",
            csrf=token,
            read_only=self.settings.read_only,
            who=request.scope.get("txtasks.who"),
            live=request.headers.get("x-live") == "1",
        )
        response = HTMLResponse(self.templates.get_template(name).render(**context))
        if request.cookies.get(CSRF_COOKIE) != token:
            response.set_cookie(
                CSRF_COOKIE, token, path=root or "/", httponly=True, samesite="strict"
            )
        return response

    def shown(self, row: TaskRow) -> dict[str, Any]:
        """A task's fields as the pages show them, payloads redacted when so set."""
        redact = self.settings.redact_payloads
        data = row._asdict()
        data["state"] = row.state.value
        data["payload"] = _redacted(row.payload) if redact else _text_of(row.payload)
        for name in ("result", "checkpoint"):
            value = data[name]
            if redact and value is not None:
                data[name] = _redacted(value.encode())
        report = row.progress_report
        data["progress"] = None if report is None else report
        data["headers"] = _pretty(row.headers)
        return data

    # -- pages --------------------------------------------------------------------------------

    async def page_queues(self, request: Request) -> Response:
        now = self.app.clock()
        reads = self.reads
        depths = await reads.depths(now=now)
        paused = await self.app.driver.queue_paused_list()
        rates = await reads.finished_per_minute(now=now)
        for name in [*paused, *rates, *self.app.queues]:
            depths.setdefault(name, QueueDepth(name))
        queues = []
        for name in sorted(depths):
            series = rates.get(name, {})
            completed = series.get("completed", [0] * 60)
            others = [s for k, s in series.items() if k != "completed"]
            failed = [sum(v) for v in zip(*others, strict=True)] if others else [0] * 60
            queues.append(
                {
                    "depth": depths[name],
                    "paused_at": paused.get(name),
                    "oldest": _since(now, depths[name].oldest_ready),
                    "done_hour": sum(completed),
                    "failed_hour": sum(failed),
                    "chart": sparkline(completed, failed),
                }
            )
        keys = await reads.busy_keys(now=now)
        subscriptions = await self.app.driver.subscription_list()
        return self.render(
            request, "queues.html", queues=queues, keys=keys, subscriptions=subscriptions
        )

    async def page_tasks(self, request: Request) -> Response:
        return await self._listing(request, "tasks.html", default_state=None)

    async def page_dead(self, request: Request) -> Response:
        return await self._listing(request, "dead.html", default_state="dead")

    async def _listing(self, request: Request, name: str, *, default_state: str | None) -> Response:
        params = request.query_params
        state = params.get("state") or default_state
        if state is not None and state not in (*LIVE, *FINISHED):
            return _bad(f"state: unknown state {state!r}")
        query = TaskQuery(
            state=state,
            queue=params.get("queue") or None,
            task_name=params.get("task") or None,
            key=params.get("key") or None,
            error=params.get("error") or None,
        )
        try:
            cursor = check_cursor(params.get("after"), query.live)
        except ValueError as exc:
            return _bad(str(exc))
        page = await self.reads.task_page(query, cursor, self.settings.page_size)
        return self.render(
            request,
            name,
            query=query,
            rows=[self.shown(r) for r in page.rows],
            next_cursor=page.next_cursor,
            states=[*LIVE, *FINISHED],
            filters={k: v for k, v in params.items() if k != "after" and v},
        )

    async def page_task(self, request: Request) -> Response:
        task_id = request.path_params["task_id"]
        row = await self.app.ainspect(task_id)
        if row is None:
            return _bad(f"task {task_id}: no such task", status=404)
        return self.render(request, "task.html", task=self.shown(row))

    async def page_periodic(self, request: Request) -> Response:
        stored = await self.app.driver.periodic_list()
        schedules = []
        for name, schedule in sorted(self.app.schedules.items()):
            row = stored.get(name)
            schedules.append({"schedule": schedule, "row": row})
        others = [row for name, row in sorted(stored.items()) if name not in self.app.schedules]
        return self.render(request, "periodic.html", schedules=schedules, others=others)

    async def page_workers(self, request: Request) -> Response:
        workers = await self.reads.workers(now=self.app.clock())
        return self.render(request, "workers.html", workers=workers, now=self.app.clock())

    # -- actions ------------------------------------------------------------------------------

    async def action(self, request: Request) -> Response:
        if self.settings.read_only:
            return _bad("read-only dashboard: actions are turned off", status=403)
        form = await request.form()
        if not csrf_ok(request.cookies.get(CSRF_COOKIE), _field(form, CSRF_FIELD)):
            return _bad("missing or wrong CSRF token: reload the page and try again", status=403)
        name = _field(form, "action") or ""
        action = ACTIONS.get(name)
        if action is None:
            return _bad(f"action: unknown action {name!r}")
        try:
            ids = [int(i) for i in form.getlist("id") if isinstance(i, str)]
            queue = _field(form, "queue") or None
            if queue is not None:
                check_queue_name(queue)
            target = Target(ids, queue, _field(form, "schedule") or None, _match_of(form))
        except ValueError as exc:
            return _bad(f"bad input: {exc}")
        if action.needs_target(target):
            return _bad(f"{name}: {action.needs_target(target)}")
        back = _field(form, "back") or "/"
        if not back.startswith("/") or back.startswith("//"):
            back = "/"
        if _field(form, "confirmed") != "yes":
            return self.render(
                request,
                "confirm.html",
                action=name,
                describe=action.describe(target),
                fields=[(k, v) for k, v in form.multi_items() if k not in (CSRF_FIELD,)],
                back=back,
                refresh=0,
            )
        who = request.scope.get("txtasks.who") or "anonymous"
        client = request.client.host if request.client else "?"
        try:
            done = await action.run(self.app, target)
        except TxtasksError as exc:
            log.warning("dashboard: %s by %s from %s failed: %s", name, who, client, exc)
            return _bad(f"{name}: {exc}")
        log.info(
            "dashboard: %s by %s from %s: %s; %s",
            name,
            who,
            client,
            action.describe(target),
            done,
            extra={"action": name, "who": who, "client": client, "ids": ids, "queue": queue},
        )
        root = request.scope.get("root_path", "")
        separator = "&" if "?" in back else "?"
        return RedirectResponse(f"{root}{back}{separator}done={_quote(done)}", status_code=303)


@dataclass(frozen=True)
class Target:
    ids: list[int]
    queue: str | None
    schedule: str | None
    #: Every dead letter matching these filters (up to `MATCH_LIMIT` an action).
    match: TaskQuery | None = None

    def match_text(self) -> str:
        m = self.match
        assert m is not None
        found = [
            f"{k} {v}" for k, v in (("queue", m.queue), ("task", m.task_name), ("key", m.key)) if v
        ]
        if m.error:
            found.append(f"error containing {m.error!r}")
        return ", ".join(found) or "no filter"


#: Dead letters an action on a filter takes at most (the next click takes the next ones).
MATCH_LIMIT = 10_000


@dataclass(frozen=True)
class Action:
    """One kind of action: what it needs, how it says what it will do, and how it runs."""

    what: str
    run_it: Callable[[App, Target], Awaitable[str]]
    by_queue: bool = False
    by_schedule: bool = False

    def needs_target(self, target: Target) -> str | None:
        if self.by_schedule:
            return None if target.schedule else "give a schedule"
        given = sum(1 for x in (target.ids, target.queue, target.match) if x)
        if self.by_queue and given > 1:
            return "give task ids, a queue or a filter, not more than one"
        if not target.ids and not (self.by_queue and given):
            return "give task ids" + (", a queue or a filter" if self.by_queue else "")
        return None

    def describe(self, target: Target) -> str:
        if self.by_schedule:
            return f"{self.what} {target.schedule}"
        if target.match is not None:
            return (
                f"{self.what} every dead letter with {target.match_text()} "
                f"(up to {MATCH_LIMIT:,} at a time)"
            )
        if target.ids:
            shown = ", ".join(str(i) for i in target.ids[:20])
            more = f" and {len(target.ids) - 20} more" if len(target.ids) > 20 else ""
            return f"{self.what} task{'s' if len(target.ids) > 1 else ''} {shown}{more}"
        return f"{self.what} every one of queue {target.queue}"

    async def run(self, app: App, target: Target) -> str:
        return await self.run_it(app, target)


async def _matching(app: App, target: Target) -> dict[int, str]:
    """The dead letters an action takes: {id: queue}, of the ids given or matching the filter
    (None for an action on a whole queue)."""
    driver = app.driver
    assert isinstance(driver, SqlDriver)
    if target.match is None:
        rows = [await app.ainspect(i) for i in target.ids]
        return {r.id: r.queue for r in rows if r is not None}
    found: dict[int, str] = {}
    cursor = None
    while len(found) < MATCH_LIMIT:
        page = await Reads(driver).task_page(target.match, cursor, 500)
        found.update((r.id, r.queue) for r in page.rows[: MATCH_LIMIT - len(found)])
        cursor = page.next_cursor
        if cursor is None:
            break
    return found


async def _requeue(app: App, target: Target) -> str:
    if target.queue is not None:
        ids = await app.driver.dead_requeue(queue=target.queue, now=app.clock())
        app.notify(target.queue, ids)
        return f"{len(ids)} re-driven"
    chosen = await _matching(app, target)
    done: list[int] = []
    batch = list(chosen)
    for start in range(0, len(batch), 1000):
        done += await app.driver.dead_requeue(batch[start : start + 1000], now=app.clock())
    for queue in sorted({chosen[i] for i in done}):
        app.notify(queue, [i for i in done if chosen[i] == queue])
    return f"{len(done)} re-driven"


async def _purge(app: App, target: Target) -> str:
    if target.queue is not None:
        return f"{await app.driver.dead_purge(queue=target.queue)} purged"
    batch = list(await _matching(app, target))
    count = 0
    for start in range(0, len(batch), 1000):
        count += await app.driver.dead_purge(batch[start : start + 1000])
    return f"{count} purged"


async def _cancel(app: App, target: Target) -> str:
    results = await app.acancel_many(target.ids)
    return "; ".join(c.describe() for c in results)


async def _run_now(app: App, target: Target) -> str:
    driver = app.driver
    assert isinstance(driver, SqlDriver)
    made = []
    for task_id in target.ids:
        queue = await Reads(driver).task_run_now(task_id, now=app.clock())
        if queue is not None:
            app.notify(queue, [task_id])
            made.append(task_id)
    return f"{len(made)} of {len(target.ids)} made due now (the others were not waiting)"


async def _pause(app: App, target: Target) -> str:
    assert target.queue is not None
    was = await app.apause(target.queue)
    return f"queue {target.queue} " + ("was already paused" if was else "paused")


async def _resume(app: App, target: Target) -> str:
    assert target.queue is not None
    resumed = await app.aresume(target.queue)
    return f"queue {target.queue} " + ("resumed" if resumed else "was not paused")


async def _periodic_now(app: App, target: Target) -> str:
    schedule = app.schedules.get(target.schedule or "")
    if schedule is None:
        raise ConfigurationError(f"schedule {target.schedule!r}: not declared by this app")
    options: dict[str, Any] = {}
    if schedule.queue is not None:
        options["queue"] = schedule.queue
    if schedule.priority is not None:
        options["priority"] = schedule.priority
    task_id = await app.aenqueue(schedule.task_name, schedule.payload, **options)
    return f"schedule {schedule.name}: task {task_id} enqueued"


class _QueueAction(Action):
    def needs_target(self, target: Target) -> str | None:
        return None if target.queue else "give a queue"

    def describe(self, target: Target) -> str:
        return f"{self.what} queue {target.queue}"


ACTIONS: dict[str, Action] = {
    "requeue": Action("re-drive (run again)", _requeue, by_queue=True),
    "purge": Action("delete for good", _purge, by_queue=True),
    "cancel": Action("cancel", _cancel),
    "run_now": Action("run now", _run_now),
    "pause": _QueueAction("pause", _pause),
    "resume": _QueueAction("resume", _resume),
    "periodic_now": Action("enqueue one run now of schedule", _periodic_now, by_schedule=True),
}


class _Guard:
    """Asks every HTTP request for the configured login; records who made it."""

    def __init__(self, app: ASGIApp, auth: Auth | None) -> None:
        self.app, self.auth = app, auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.auth is None:
            if scope["type"] == "http":
                client = scope.get("client")
                scope["txtasks.who"] = f"anonymous@{client[0] if client else '?'}"
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        raw = headers.get(b"authorization")
        who = self.auth.who(raw.decode("latin-1") if raw else None)
        if who is None:
            response = PlainTextResponse(
                "login required",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="txtasks", charset="UTF-8"'},
            )
            await response(scope, receive, send)
            return
        scope["txtasks.who"] = who
        await self.app(scope, receive, send)


def _match_of(form: FormData) -> TaskQuery | None:
    """The filter of an action on every dead letter matching it (fields match_*), if any."""
    if _field(form, "match") != "yes":
        return None
    queue = _field(form, "match_queue") or None
    if queue is not None:
        check_queue_name(queue, setting="match_queue")
    return TaskQuery(
        state="dead",
        queue=queue,
        task_name=_field(form, "match_task") or None,
        key=_field(form, "match_key") or None,
        error=_field(form, "match_error") or None,
    )


def _bad(message: str, *, status: int = 400) -> Response:
    return PlainTextResponse(message, status_code=status)


def _field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text[:300])


def _text_of(payload: bytes) -> str:
    try:
        return _pretty(payload.decode("utf-8")) or ""
    except UnicodeDecodeError:
        return f"<{len(payload)} bytes, not UTF-8>"


def _pretty(text: str | None) -> str | None:
    if text is None:
        return None
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def _redacted(value: bytes) -> str:
    return f"[redacted: {len(value)} bytes]"


def _age(delta: Any) -> str:
    if delta is None:
        return ""
    seconds = delta.total_seconds() if hasattr(delta, "total_seconds") else float(delta)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _since(now: datetime, then: datetime | None) -> Any:
    return None if then is None else now - then


def _when(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")
