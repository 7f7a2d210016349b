"""`txtasks publish`, `subscribe`, `unsubscribe` and `topics`: topics from the command line."""

from __future__ import annotations

import json
from typing import Any

import click

from txtasks.cli.common import (
    broker_url_option,
    database_url_option,
    existing_database,
    friendly_errors,
    from_command_line,
    json_default,
    load_app,
    resolve_url,
    run_async,
    with_driver,
)


def _payload(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="PAYLOAD") from exc
    except RecursionError as exc:
        raise click.BadParameter("nested too deeply to decode", param_hint="PAYLOAD") from exc


@click.command()
@click.argument("app_spec", metavar="APP")
@click.argument("topic")
@click.argument("payload", required=False, default="null")
@database_url_option
@broker_url_option
@click.option("--delay", type=click.FloatRange(min=0), help="Seconds before it may run.")
@click.option("--priority", type=int, help="Higher runs first (default: each group's own).")
@click.option("--dedup-key", help="A group whose live task holds this key gets no new one.")
@click.option("--key", help="The key whose limits each group's task shares in its queue.")
def publish(
    app_spec: str,
    topic: str,
    payload: str,
    database_url: str | None,
    broker_url: str | None,
    **options: Any,
) -> None:
    """Publish a JSON PAYLOAD (default null) to TOPIC: one task per group subscribed to it.
    Prints the ids of the tasks (none: no group subscribed, and the drop is counted)."""
    from txtasks.errors import TxtasksError

    app = load_app(app_spec)
    database_url = from_command_line("database_url", database_url)
    broker_url = from_command_line("broker_url", broker_url)
    try:  # bad input fails before anything is opened
        publish = app.topics.new_publish(
            topic, _payload(payload), **{k: v for k, v in options.items() if v is not None}
        )
    except TxtasksError as exc:
        raise click.BadParameter(str(exc)) from None
    url = existing_database(resolve_url(database_url, app))
    from txtasks.engines import create_engine
    from txtasks.wakeup import notifier_for_url

    with friendly_errors(url):
        engine = create_engine(url)
        try:
            if broker_url:
                app.use_notifier(notifier_for_url(broker_url))
            with engine.begin() as conn:
                [ids] = app.topics.publish_many_tx(conn, [publish])
        finally:
            engine.dispose()
            run_async(app.aclose)  # publishes the wake-ups before exiting
    click.echo(" ".join(map(str, ids)) if ids else f"dropped: topic {topic} has no subscriber")


@click.command()
@click.argument("app_spec", metavar="APP")
@click.argument("topics", nargs=-1)
@database_url_option
def subscribe(app_spec: str, topics: tuple[str, ...], database_url: str | None) -> None:
    """Store the subscriptions APP's tasks declare (of TOPICS only, when given); a worker of
    APP stores those of its queues at its start too. Publishes committed from now on reach
    them."""
    from txtasks.errors import MissingExtraError, TxtasksError

    app = load_app(app_spec)
    database_url = from_command_line("database_url", database_url)
    app.use_driver(app.driver_for(existing_database(resolve_url(database_url, app))))
    try:
        subs = run_async(lambda: _subscribe(app, topics or None))
    except MissingExtraError:
        raise
    except TxtasksError as exc:
        raise click.BadParameter(str(exc)) from None
    if not subs:
        click.echo("no subscription declared" + (f" for {', '.join(topics)}" if topics else ""))
    for s in subs:
        click.echo(f"{s.topic}\t{s.group}\t{s.task_name}\tqueue {s.queue}")


async def _subscribe(app: Any, topics: tuple[str, ...] | None) -> Any:
    try:
        return await app.topics.asubscribe(topics)
    finally:
        await app.aclose()


@click.command()
@database_url_option
@click.argument("topic")
@click.argument("groups", nargs=-1, required=True)
def unsubscribe(database_url: str | None, topic: str, groups: tuple[str, ...]) -> None:
    """Delete the subscriptions of GROUPS to TOPIC: publishes from now on skip them (their
    tasks already delivered stay). A worker that declares one stores it again at its start."""
    from txtasks.errors import TxtasksError
    from txtasks.topics import check_group_name, check_topic_name

    try:
        pairs = [(check_topic_name(topic, setting="TOPIC"), check_group_name(g)) for g in groups]
    except TxtasksError as exc:
        raise click.BadParameter(str(exc)) from None
    deleted = with_driver(
        database_url, lambda driver: driver.topics.subscription_delete_many(pairs)
    )
    click.echo(f"{topic}: {deleted} subscription(s) deleted")


@click.command()
@database_url_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def topics(database_url: str | None, as_json: bool) -> None:
    """Topics, their groups (task, queue, live tasks by state) and the publishes dropped for
    want of a subscriber (kept for the cleaner's retention.topic_drops)."""
    from txtasks.cli.tables import Grid, grids_print

    stats = with_driver(database_url, lambda driver: driver.topics.topic_stats())
    if as_json:
        click.echo(json.dumps([_topic_json(s) for s in stats], indent=2, default=json_default))
        return
    rows = []
    for s in stats:
        dropped = str(s.dropped) if s.dropped else ""
        if not s.groups:
            rows.append([s.topic, "-", "", "", "", "", "", dropped])
        for n, (sub, counts) in enumerate(s.groups):
            states = [str(counts.get(k, 0)) for k in ("pending", "processing", "retryable")]
            topic, drop = (s.topic, dropped) if n == 0 else ("", "")
            rows.append([topic, sub.group, sub.task_name, sub.queue, *states, drop])
    headers = ["topic", "group", "task", "queue", "pending", "processing", "retryable", "dropped"]
    grids_print([Grid("txtasks topics", headers, rows, text=frozenset(headers[1:4]))])


def _topic_json(s: Any) -> dict[str, Any]:
    return {
        "topic": s.topic,
        "groups": [
            {"group": sub.group, "task": sub.task_name, "queue": sub.queue, "tasks": counts}
            for sub, counts in s.groups
        ],
        "dropped": s.dropped,
        "last_dropped_at": s.last_dropped_at,
    }


COMMANDS = (publish, subscribe, unsubscribe, topics)
