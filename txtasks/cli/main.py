"""`txtasks`: migrate, worker, cleaner, status, dlq, keys, enqueue, publish, subscribe,
unsubscribe, topics, cancel, pause, resume, inspect, tasks, demo."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

import click

from txtasks._version import __version__
from txtasks.cli.common import (
    Commands,
    broker_url_option,
    connections_option,
    database_url_option,
    existing_app_database,
    existing_database,
    friendly_errors,
    from_command_line,
    health_host_option,
    health_port_option,
    json_default,
    load_app,
    log_format_option,
    log_level_option,
    logging_setup,
    loop_choice,
    loop_option,
    metrics_port_option,
    resolve_url,
    run_async,
    task_json,
    timeout_options,
    with_driver,
)
from txtasks.cli.control import COMMANDS as control_commands
from txtasks.cli.demo import demo
from txtasks.cli.status import status
from txtasks.cli.topics import COMMANDS as topic_commands
from txtasks.clock import utcnow
from txtasks.types import TaskState

if TYPE_CHECKING:  # each command imports what it runs: the group and --help need none of it
    from txtasks.driver import Driver

log = logging.getLogger("txtasks.cli")


class WorkerDefault:
    """The default of a `WorkerConfig` setting, read when the worker runs or shows its help:
    listing the commands does not import the worker."""

    def __init__(self, setting: str) -> None:
        self.setting = setting

    def __call__(self) -> Any:
        from txtasks.worker import WorkerConfig

        return getattr(WorkerConfig(), self.setting)

    def __str__(self) -> str:  # click shows it as the default
        return str(self())

    def __bool__(self) -> bool:  # click reads a flag's default as its truth
        return bool(self())


@click.group(
    cls=Commands,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="txtasks")
def main() -> None:
    """txtasks: a transactional task queue. Tasks are rows; workers claim them."""


# -- migrate -----------------------------------------------------------------------------------


@main.command()
@database_url_option
@click.option("--sql", "print_sql", is_flag=True, help="Print the SQL instead of running it.")
@click.option(
    "--dialect",
    type=click.Choice(["postgresql", "mysql", "sqlite"]),
    help="With --sql and no database: the dialect to print for.",
)
@click.option(
    "--since", type=click.IntRange(min=0), default=0, help="With --sql: only later versions."
)
def migrate(database_url: str | None, print_sql: bool, dialect: str | None, since: int) -> None:
    """Create or upgrade the txtasks tables."""
    from txtasks.driver import driver_for_url
    from txtasks.driver.urls import backend_name
    from txtasks.schema import migrate as schema_migrate

    if print_sql:
        name = dialect or (backend_name(database_url) if database_url else None)
        if name is None:
            raise click.UsageError("--sql needs --dialect or --database-url")
        click.echo(schema_migrate.migrate_sql(name, since=since), nl=False)
        return
    url = resolve_url(database_url)
    driver = driver_for_url(url)

    async def go() -> list[int]:
        try:
            return await driver.migrate()
        finally:
            await driver.close()

    with friendly_errors(url):
        applied = run_async(go)
    latest = schema_migrate.latest_version()
    if applied:
        click.echo(f"applied migrations {', '.join(map(str, applied))}; schema at version {latest}")
    else:
        click.echo(f"schema already at version {latest}")


# -- worker ------------------------------------------------------------------------------------


def services_off(skipped: tuple[str, ...], publish_deferred: bool) -> dict[str, None]:
    """The worker's services turned off: `--skip-service` (and `--no-publish-deferred`)."""
    return dict.fromkeys([*skipped, *([] if publish_deferred else ["publisher"])])


@main.command()
@click.argument("app_spec", metavar="APP")
@database_url_option
@timeout_options
@connections_option
@broker_url_option
@click.option(
    "-q",
    "--queue",
    "queues",
    multiple=True,
    help="Queue to serve (repeatable); default: all the app's queues.",
)
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1),
    show_default="10; async handlers: up to 200 while a backlog lasts",
    envvar="TXTASKS_CONCURRENCY",
    help="Tasks run at once.",
)
@click.option(
    "--lease",
    type=click.FloatRange(min=0, min_open=True),
    default=WorkerDefault("lease"),
    show_default=True,
    help="Seconds a claim holds a task without a heartbeat.",
)
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0, min_open=True),
    default=WorkerDefault("poll_interval"),
    show_default=True,
    help="Seconds between polls when idle.",
)
@click.option(
    "--shutdown-grace",
    type=click.FloatRange(min=0),
    default=WorkerDefault("shutdown_grace"),
    show_default=True,
    help="Seconds in-flight tasks get to finish on SIGTERM/SIGINT.",
)
@click.option(
    "--burst", is_flag=True, help="Exit once no task is due within --burst-horizon seconds."
)
@click.option(
    "--burst-horizon",
    type=click.FloatRange(min=0),
    default=WorkerDefault("burst_horizon"),
    show_default=True,
)
@click.option(
    "--archive-completed/--no-archive-completed",
    default=WorkerDefault("archive_completed"),
    show_default=True,
    help="Keep completed tasks in the archive table.",
)
@click.option(
    "--publish-deferred/--no-publish-deferred",
    default=True,
    show_default=True,
    help="Publish the rows of Spark writes committed in deferred mode "
    "(--no-publish-deferred: --skip-service publisher).",
)
@click.option(
    "--skip-service",
    "skipped",
    multiple=True,
    metavar="NAME",
    help="Do not run this service (repeatable; see docs/architecture.md#services).",
)
@loop_option
@metrics_port_option
@health_port_option
@health_host_option
@log_level_option
@log_format_option
def worker(
    app_spec: str,
    database_url: str | None,
    broker_url: str | None,
    queues: tuple[str, ...],
    loop: str,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
    health_host: str | None,
    **settings: Any,
) -> None:
    """Run the tasks of APP (module:attribute). SIGTERM/SIGINT stop it gracefully."""
    from txtasks.errors import TxtasksError
    from txtasks.metrics import Metrics
    from txtasks.wakeup import notifier_for_url
    from txtasks.worker import Worker, WorkerConfig

    logging_setup(log_level, log_format)
    event_loop = loop_choice(loop)
    app = load_app(app_spec)
    database_url = from_command_line("database_url", database_url)
    broker_url = from_command_line("broker_url", broker_url)
    try:
        if health_host is not None:
            settings["health_host"] = health_host
        services = services_off(settings.pop("skipped"), settings.pop("publish_deferred"))
        config = WorkerConfig(queues=queues or None, services=services, **settings)
        existing_app_database(app, database_url)
        if database_url:  # the flag; else the app's own setting, else TXTASKS_DATABASE_URL
            app.use_driver(app.driver_for(database_url))
        if broker_url:
            app.use_notifier(notifier_for_url(broker_url))
        metrics = None
        if metrics_port is not None:
            metrics = Metrics()
            metrics.watch_wakeups(app.notifier.stats)
            metrics.serve(metrics_port)
        runner = Worker(app, config, metrics=metrics)
    except TxtasksError as exc:
        raise click.ClickException(str(exc)) from exc

    async def go() -> None:
        loop = asyncio.get_running_loop()
        signals = {"count": 0}

        def on_signal(signum: int) -> None:
            signals["count"] += 1
            name = signal.Signals(signum).name
            log.info(
                "%s received: %s", name, "stopping" if signals["count"] == 1 else "stopping now"
            )
            runner.stop(now=signals["count"] > 1)

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        try:
            await runner.run()
        finally:
            await app.aclose()

    with friendly_errors(app.resolve_database_url(database_url)):
        run_async(go, loop=event_loop)
    if runner.threads_alive:  # a sync handler ignored the grace period; do not hang on it
        logging.shutdown()
        os._exit(0)


# -- dead letters -------------------------------------------------------------------------


@main.group()
def dlq() -> None:
    """Inspect, re-drive or purge dead-lettered tasks."""


@dlq.command("list")
@database_url_option
@click.option("--queue", help="Only this queue.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def dlq_list(database_url: str | None, queue: str | None, limit: int, as_json: bool) -> None:
    """Dead-lettered tasks, newest first."""
    from txtasks.cli.tables import Grid, grids_print
    from txtasks.policy import error_summary

    rows = with_driver(
        database_url, lambda driver: driver.admin.dead_list(queue=queue, limit=limit)
    )
    if as_json:
        click.echo(json.dumps([task_json(r) for r in rows], default=json_default, indent=2))
        return
    lines = []
    for r in rows:
        lines.append([
            str(r.id),
            r.queue,
            r.task_name,
            f"{r.attempt}/{r.max_attempts}",
            str(r.finished_at),
            error_summary(r.last_error),
        ])  # fmt: skip
    headers = ["id", "queue", "task", "attempts", "finished", "error"]
    text = frozenset({"queue", "task", "error"})
    grids_print([Grid(f"dead letters ({len(rows)})", headers, lines, text=text)])


def _selection(ids: tuple[int, ...], queue: str | None, all_: bool) -> list[int] | None:
    if not ids and not queue and not all_:
        raise click.UsageError("name task ids, --queue QUEUE, or --all")
    return list(ids) if ids else None


@dlq.command("requeue")
@database_url_option
@broker_url_option
@click.argument("ids", nargs=-1, type=int)
@click.option("--queue", help="Every dead letter of this queue.")
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
def dlq_requeue(
    database_url: str | None,
    broker_url: str | None,
    ids: tuple[int, ...],
    queue: str | None,
    all_: bool,
) -> None:
    """Move dead letters back to pending with a fresh attempt budget (and wake the workers)."""
    chosen = _selection(ids, queue, all_)

    async def requeue(driver: Driver) -> list[int]:
        done = await driver.admin.dead_requeue(chosen, queue=queue, now=utcnow())
        if done and broker_url:  # a hint per queue that now has ready tasks
            from txtasks.wakeup import notifier_for_url

            notifier = notifier_for_url(broker_url)
            try:
                for stats in await driver.admin.queue_stats(now=utcnow()):
                    if stats.counts.get(TaskState.PENDING.value):
                        notifier.notify(stats.queue, done)
            finally:
                await notifier.close()
        return done

    done = with_driver(database_url, requeue)
    click.echo(f"requeued {len(done)} task(s){': ' + ', '.join(map(str, done)) if done else ''}")


@dlq.command("purge")
@database_url_option
@click.argument("ids", nargs=-1, type=int)
@click.option("--queue", help="Every dead letter of this queue.")
@click.option("--all", "all_", is_flag=True, help="Every dead letter.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def dlq_purge(
    database_url: str | None, ids: tuple[int, ...], queue: str | None, all_: bool, yes: bool
) -> None:
    """Delete dead letters for good."""
    chosen = _selection(ids, queue, all_)
    if not yes:
        click.confirm("Delete these dead letters for good?", abort=True)
    purged = with_driver(database_url, lambda driver: driver.admin.dead_purge(chosen, queue=queue))
    click.echo(f"purged {purged} task(s)")


# -- keys --------------------------------------------------------------------------------------


@main.group()
def keys() -> None:
    """Limits of keys set at run time, over those the application declares."""


@keys.command("set")
@database_url_option
@click.argument("key")
@click.option("--queue", help="Only in this queue (default: the key in every queue).")
@click.option("--concurrency", type=click.IntRange(min=1), help="At most N processing at once.")
@click.option("--ordered/--unordered", default=None, help="One at a time, in enqueue order.")
@click.option("--rate", help="At most COUNT starts per PERIOD, such as 10/s, 100/60s or 5/m.")
@click.option("--burst", type=click.IntRange(min=1), help="Starts of credit after a quiet spell.")
def keys_set(
    database_url: str | None,
    key: str,
    queue: str | None,
    concurrency: int | None,
    ordered: bool | None,
    rate: str | None,
    burst: int | None,
) -> None:
    """Set the limits of KEY; the next claims apply them. Limits not given keep the declared
    ones."""
    from txtasks._checks import check_key, check_queue_name
    from txtasks.errors import TxtasksError
    from txtasks.keys import KeyOverride

    if concurrency is None and ordered is None and rate is None:
        raise click.UsageError("give --concurrency, --ordered/--unordered or --rate")
    if burst is not None and rate is None:
        raise click.UsageError("--burst goes with --rate")
    try:
        check_key(key, setting="KEY")
        parsed = _rate_of(rate, burst)
        if queue is not None:
            check_queue_name(queue, setting="--queue")
    except TxtasksError as exc:
        raise click.BadParameter(str(exc)) from None
    override = KeyOverride(key, queue, concurrency, ordered, parsed)
    with_driver(database_url, lambda driver: driver.control.key_override_set(override))
    click.echo(f"{key}{'' if queue is None else f' in queue {queue}'}: {_limits_text(override)}")


@keys.command("clear")
@database_url_option
@click.argument("key")
@click.option("--queue", help="The limits set for this queue (default: for every queue).")
def keys_clear(database_url: str | None, key: str, queue: str | None) -> None:
    """Remove the limits set for KEY: the declared ones apply again."""
    found = with_driver(database_url, lambda driver: driver.control.key_override_clear(key, queue))
    click.echo(f"{key}: {'cleared' if found else 'had no limits set'}")


@keys.command("list")
@database_url_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def keys_list(database_url: str | None, as_json: bool) -> None:
    """Every key with limits set at run time."""
    overrides = with_driver(database_url, lambda driver: driver.control.key_override_list())
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(o) for o in overrides], indent=2))
        return
    for o in overrides:
        click.echo(f"{o.key}\t{o.queue or '*'}\t{_limits_text(o)}")


@keys.command("queue-rate")
@database_url_option
@click.argument("queue")
@click.argument("rate", required=False)
@click.option("--burst", type=click.IntRange(min=1), help="Starts of credit after a quiet spell.")
@click.option("--clear", is_flag=True, help="Remove the rate set: the declared one applies again.")
def keys_queue_rate(
    database_url: str | None, queue: str, rate: str | None, burst: int | None, clear: bool
) -> None:
    """Set the rate of QUEUE as a whole (RATE such as 100/s: at most that many starts of its
    tasks, with a key or without, across every worker), over the one the application declares;
    workers apply it within 5 seconds. Without RATE: the rates set."""
    from txtasks._checks import check_queue_name
    from txtasks.errors import TxtasksError

    if clear and (rate is not None or burst is not None):
        raise click.UsageError("--clear takes no RATE or --burst")
    if burst is not None and rate is None:
        raise click.UsageError("--burst goes with RATE")
    try:
        check_queue_name(queue, setting="QUEUE")
        parsed = _rate_of(rate, burst)
    except TxtasksError as exc:
        raise click.BadParameter(str(exc)) from None
    if clear:
        found = with_driver(database_url, lambda driver: driver.control.queue_rate_clear(queue))
        click.echo(f"queue {queue}: {'rate cleared' if found else 'had no rate set'}")
    elif parsed is not None:
        with_driver(database_url, lambda driver: driver.control.queue_rate_set(queue, parsed))
        click.echo(f"queue {queue}: {_rate_text(parsed)}")
    else:
        stored = with_driver(database_url, lambda driver: driver.control.queue_rates_stored())
        known = stored.get(queue)
        click.echo(f"queue {queue}: {'no rate set' if known is None else _rate_text(known)}")


def _rate_of(rate: str | None, burst: int | None) -> Any:
    """The Rate of a RATE text (such as 10/s) and its --burst (None: no RATE)."""
    from txtasks.keys import Rate

    parsed = None if rate is None else Rate.parse(rate)
    if parsed is not None and burst is not None:
        parsed = Rate(parsed.count, parsed.per, burst)
    return parsed


def _rate_text(rate: Any) -> str:
    return f"rate {rate.count}/{rate.per:g}s burst {rate.burst}"


def _limits_text(o: Any) -> str:
    parts = []
    if o.concurrency is not None:
        parts.append(f"concurrency {o.concurrency}")
    if o.ordered is not None:
        parts.append("ordered" if o.ordered else "unordered")
    if o.rate is not None:
        parts.append(_rate_text(o.rate))
    return ", ".join(parts)


# -- enqueue -----------------------------------------------------------------------------------


@main.command()
@click.argument("app_spec", metavar="APP")
@click.argument("task_name", metavar="TASK")
@click.argument("payload", required=False, default="null")
@database_url_option
@broker_url_option
@click.option("--delay", type=click.FloatRange(min=0), help="Seconds before it may run.")
@click.option("--priority", type=int, help="Higher runs first.")
@click.option("--dedup-key", help="A live task with this key is returned instead of a new one.")
@click.option("--queue", help="Override the task's queue.")
@click.option("--key", help="The key whose limits the task shares (default: the task's own).")
def enqueue(
    app_spec: str,
    task_name: str,
    payload: str,
    database_url: str | None,
    broker_url: str | None,
    **options: Any,
) -> None:
    """Enqueue TASK of APP with a JSON PAYLOAD (default null)."""
    app = load_app(app_spec)
    database_url = from_command_line("database_url", database_url)
    broker_url = from_command_line("broker_url", broker_url)
    try:
        value = json.loads(payload)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="PAYLOAD") from exc
    except RecursionError as exc:
        raise click.BadParameter("nested too deeply to decode", param_hint="PAYLOAD") from exc
    url = existing_database(resolve_url(database_url, app))
    from txtasks.engines import create_engine
    from txtasks.wakeup import notifier_for_url

    with friendly_errors(url):
        engine = create_engine(url)
        try:
            if broker_url:
                app.use_notifier(notifier_for_url(broker_url))
            with engine.begin() as conn:
                task_id = app.enqueue_tx(
                    conn, task_name, value, **{k: v for k, v in options.items() if v is not None}
                )
        finally:
            engine.dispose()
            run_async(app.aclose)  # publishes the wake-up before exiting
    click.echo(task_id)


main.add_command(demo)
main.add_command(status)
for _command in (*topic_commands, *control_commands):
    main.add_command(_command)


def _help_options(command: click.Command) -> None:
    """Give every command `-h` as well as `--help`, also when it runs on its own."""
    command.context_settings.setdefault("help_option_names", ["-h", "--help"])
    for sub in getattr(command, "commands", {}).values():
        _help_options(sub)


_help_options(main)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
