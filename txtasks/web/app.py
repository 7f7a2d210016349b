"""The dashboard as a Starlette application: server-rendered pages over an App's driver (its
`dashboard` reads, and `admin`, `control`, `topics`, `sweeps`, `processes`), and actions behind
a confirmation page, a CSRF token and a server-side log of who did what."""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from txtasks._checks import check_queue_name
from txtasks.app import App
from txtasks.driver.base import (
    COUNT_CAP,
    FINISHED,
    LIVE,
    SEARCH_WINDOW,
    QueueDepth,
    TaskQuery,
    check_cursor,
)
from txtasks.driver.history import minute_number
from txtasks.driver.timings import task_timings
from txtasks.errors import ConfigurationError, TxtasksError
from txtasks.policy import error_summary
from txtasks.types import TaskRow
from txtasks.web.actions import ACTIONS, Target, field_of, limits_of, match_of, rate_text
from txtasks.web.charts import sparkline
from txtasks.web.security import CSRF_COOKIE, CSRF_FIELD, Auth, Guard, csrf_ok, new_csrf_token

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
    #: The Host headers answered (None: any).
    hosts: Collection[str] | None = None


def create_app(
    app: App,
    *,
    read_only: bool = False,
    redact_payloads: bool = False,
    auth: Auth | None = None,
    refresh: float = 5.0,
    page_size: int = 50,
    hosts: Collection[str] | None = None,
    close_app: bool = False,
) -> ASGIApp:
    """The dashboard of `app` as an ASGI application, to serve (`txtasks dashboard`) or to
    mount in another one (`Mount("/tasks", create_app(app))`). `hosts`: answer only requests
    with one of these Host headers (None: any). `close_app`: close the App's connections when
    the application shuts down (for an App it owns)."""
    if page_size < 1:
        raise ConfigurationError(f"page_size: must be at least 1, got {page_size!r}")
    if not app.driver.capabilities.shared:
        raise ConfigurationError(
            f"dashboard: needs a database (not the {app.driver.capabilities.name} driver, "
            "which keeps tasks in this process)"
        )
    settings = Settings(read_only, redact_payloads, auth, refresh, page_size, hosts)
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
        self.templates.tests["long"] = _long
        self.templates.filters["error_summary"] = error_summary
        self.templates.filters["rate"] = rate_text
        self.templates.globals.update(cap=COUNT_CAP, search_window=SEARCH_WINDOW)
        routes = [
            Route("/", self.page_queues),
            Route("/tasks", self.page_tasks),
            Route("/tasks/{task_id:int}", self.page_task),
            Route("/dead", self.page_dead),
            Route("/periodic", self.page_periodic),
            Route("/busy", self.page_busy),
            Route("/workers", self.page_workers),
            Route("/timings", self.page_timings),
            Route("/limits", self.page_limits),
            Route("/action", self.action, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        starlette = Starlette(routes=routes, lifespan=self.lifespan)
        self.asgi: ASGIApp = Guard(starlette, settings.auth, settings.hosts)

    @asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        yield
        if self.close_app:
            await self.app.aclose()

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
        data["waited"] = _since(row.started_at, row.run_at) if row.started_at else None
        data["ran"] = _since(row.finished_at, row.started_at) if row.finished_at else None
        return data

    # -- pages --------------------------------------------------------------------------------

    async def page_queues(self, request: Request) -> Response:
        now = self.app.clock()
        span = RANGES.get(request.query_params.get("range") or "1h")
        if span is None:
            return _bad(f"range: one of {', '.join(RANGES)}")
        reads = self.app.driver.dashboard
        depths = await reads.depths(now=now)
        paused = await self.app.driver.control.queue_paused_list()
        counts = await self.counts(span, now)
        for name in [*paused, *counts, *self.app.queues]:
            depths.setdefault(name, QueueDepth(name))
        queues = []
        for name in sorted(depths):
            arrived, completed, failed = counts.get(name, ([0] * span.slots,) * 3)
            queues.append(
                {
                    "depth": depths[name],
                    "paused_at": paused.get(name),
                    "oldest": _since(now, depths[name].oldest_ready),
                    "in_hour": sum(arrived),
                    "done_hour": sum(completed),
                    "failed_hour": sum(failed),
                    "chart": sparkline(completed, failed, arrived, span=span.title, per=span.per),
                }
            )
        keys = await reads.busy_keys(now=now)
        subscriptions = await self.app.driver.topics.subscription_list()
        cleaners = await self.cleaners_alive(now)
        return self.render(
            request,
            "queues.html",
            queues=queues,
            keys=keys,
            subscriptions=subscriptions,
            cleaners=cleaners,
            span=span,
            ranges=RANGES,
        )

    async def counts(
        self, span: Span, now: datetime
    ) -> dict[str, tuple[list[int], list[int], list[int]]]:
        """Per queue: tasks enqueued, completed, and failed or dead, per slot of `span`: the
        last hour per minute from the task tables, longer spans from the history."""
        reads = self.app.driver.dashboard
        found: dict[str, tuple[list[int], list[int], list[int]]] = {}
        if span.history is None:
            rates = await reads.finished_per_minute(now=now)
            arrivals = await reads.arrived_per_minute(now=now)
            for name in {*rates, *arrivals}:
                series = rates.get(name, {})
                completed = series.get("completed", [0] * 60)
                others = [s for k, s in series.items() if k != "completed"]
                failed = [sum(v) for v in zip(*others, strict=True)] if others else [0] * 60
                found[name] = (arrivals.get(name, [0] * 60), completed, failed)
            return found
        size = span.history
        current = minute_number(now)
        last = current - current % size + size
        buckets = await reads.history_buckets(
            first=last - size * span.slots, last=last, minutes=size
        )
        for name, series in buckets.items():
            failed = [f + d for f, d in zip(series["failed"], series["dead"], strict=True)]
            found[name] = (series["enqueued"], series["completed"], failed)
        return found

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
            payload=params.get("payload") or None,
        )
        try:
            cursor = check_cursor(params.get("after"), query.live)
        except ValueError as exc:
            return _bad(str(exc))
        page = await self.app.driver.dashboard.task_page(query, cursor, self.settings.page_size)
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
        row = await self.app.control.ainspect(task_id)
        if row is None:
            return _bad(f"task {task_id}: no such task", status=404)
        return self.render(request, "task.html", task=self.shown(row))

    async def page_periodic(self, request: Request) -> Response:
        now = self.app.clock()
        stored = await self.app.driver.sweeps.periodic_list()
        schedules = []
        for name, schedule in sorted(self.app.schedules.items()):
            row = stored.get(name)
            late = None if row is None else _since(now, row.next_fire_at)
            overdue = late if late is not None and late.total_seconds() > OVERDUE_AFTER else None
            schedules.append({"schedule": schedule, "row": row, "overdue": overdue})
        others = [row for name, row in sorted(stored.items()) if name not in self.app.schedules]
        firing = await self.cleaners_alive(now, sweep="periodic")
        return self.render(
            request, "periodic.html", schedules=schedules, others=others, firing=firing
        )

    async def cleaners_alive(self, now: datetime, sweep: str | None = None) -> int:
        """How many cleaners (running `sweep`, when given) have a heartbeat row alive."""
        processes = await self.app.driver.processes.process_list()
        return sum(
            1
            for p in processes
            if p.kind == "cleaner"
            and p.alive(now)
            and (sweep is None or sweep in p.runs.split(","))
        )

    async def page_workers(self, request: Request) -> Response:
        processes = await self.app.driver.processes.process_list()
        return self.render(request, "workers.html", processes=processes, now=self.app.clock())

    async def page_timings(self, request: Request) -> Response:
        """Per task name, the 50th and 95th percentiles of how long the tasks finished in the
        last hour waited and ran: of the last `TIMING_ROWS` of each final state at most."""
        since = self.app.clock() - timedelta(hours=1)
        rows = await self.app.driver.dashboard.finished_times(since=since, limit=TIMING_ROWS)
        per_state = Counter(r.state for r in rows)
        return self.render(
            request,
            "timings.html",
            timings=task_timings(rows),
            rows=TIMING_ROWS,
            full=any(n >= TIMING_ROWS for n in per_state.values()),
        )

    async def page_limits(self, request: Request) -> Response:
        """Queue rates and key limits: those the application declares, those set at run time
        (over the declared ones), with forms to set and clear them."""
        control = self.app.driver.control
        stored = await control.queue_rates_stored()
        declared = self.app.declared_queue_rates
        names = sorted({*self.app.queues, *declared, *stored})
        return self.render(
            request,
            "limits.html",
            queues=[{"queue": q, "declared": declared.get(q), "set": stored.get(q)} for q in names],
            declared_keys=sorted(self.app.declared_key_limits.items()),
            overrides=await control.key_override_list(),
            refresh=0,  # its forms keep what is typed in them
        )

    async def page_busy(self, request: Request) -> Response:
        """What each worker runs now: its heartbeat row, and the first `BUSY_PER_WORKER` tasks
        it started (with how many it runs); tasks of a worker without a row come last."""
        now = self.app.clock()
        processes = await self.app.driver.processes.process_list()
        running = await self.app.driver.dashboard.running_by_worker(per_worker=BUSY_PER_WORKER)
        workers = [
            {"process": p, "busy": running.pop(p.id, None)} for p in processes if p.kind == "worker"
        ]
        return self.render(
            request,
            "busy.html",
            workers=workers,
            unknown=[running[w] for w in sorted(running)],
            now=now,
            per_worker=BUSY_PER_WORKER,
        )

    # -- actions ------------------------------------------------------------------------------

    async def action(self, request: Request) -> Response:
        if self.settings.read_only:
            return _bad("read-only dashboard: actions are turned off", status=403)
        form = await request.form()
        if not csrf_ok(request.cookies.get(CSRF_COOKIE), field_of(form, CSRF_FIELD)):
            return _bad("missing or wrong CSRF token: reload the page and try again", status=403)
        name = field_of(form, "action") or ""
        action = ACTIONS.get(name)
        if action is None:
            return _bad(f"action: unknown action {name!r}")
        try:
            ids = [int(i) for i in form.getlist("id") if isinstance(i, str)]
            queue = field_of(form, "queue") or None
            if queue is not None:
                check_queue_name(queue)
            target = Target(
                ids, queue, field_of(form, "schedule") or None, match_of(form), limits_of(form)
            )
        except ValueError as exc:
            return _bad(f"bad input: {exc}")
        if action.needs_target(target):
            return _bad(f"{name}: {action.needs_target(target)}")
        back = field_of(form, "back") or "/"
        if not back.startswith("/") or back.startswith("//"):
            back = "/"
        if field_of(form, "confirmed") != "yes":
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


def _bad(message: str, *, status: int = 400) -> Response:
    return PlainTextResponse(message, status_code=status)


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
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _since(now: datetime | None, then: datetime | None) -> Any:
    return None if now is None or then is None else now - then


def _when(value: datetime | None) -> Markup | str:
    """A time as the pages show it, labelled with its zone: the database keeps UTC."""
    if value is None:
        return ""
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc).replace(tzinfo=None)
    stamp = value.strftime("%Y-%m-%dT%H:%M:%SZ")
    shown = value.strftime("%Y-%m-%d %H:%M:%S")
    return Markup(f'<time datetime="{stamp}" title="UTC">{shown} UTC</time>')


def _long(text: str | None) -> bool:
    """Whether a payload, result or checkpoint is shown collapsed (the page stays readable)."""
    return text is not None and (len(text) > LONG_TEXT_CHARS or text.count("\n") >= LONG_TEXT_LINES)


@dataclass(frozen=True)
class Span:
    """A range of the queue page's chart: its slots, and the minutes of the history each sums
    (None: the last hour per minute, from the task tables)."""

    label: str
    title: str
    slots: int
    history: int | None
    per: str


#: The ranges of the queue page's chart, by the value of its `range` parameter.
RANGES = {
    "1h": Span("1 h", "last hour", 60, None, "min"),
    "24h": Span("24 h", "last 24 hours", 96, 15, "15 min"),
    "7d": Span("7 d", "last 7 days", 168, 60, "hour"),
}

#: A payload, result or checkpoint longer than this (characters, or lines) is shown collapsed.
LONG_TEXT_CHARS = 2000
LONG_TEXT_LINES = 30

#: The timings page reads the times of at most this many tasks finished in the last hour, of
#: each final state (completed, failed, dead).
TIMING_ROWS = 5_000

#: Tasks of each worker the busy view lists (the page says how many others it runs).
BUSY_PER_WORKER = 20

#: Seconds past its next fire time after which a schedule is shown as overdue (a cleaner
#: running the periodic sweep fires it within about a second).
OVERDUE_AFTER = 30.0
