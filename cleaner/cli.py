"""`txtasks cleaner APP` (also `python -m cleaner APP`): run the sweeps until stopped."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import signal
import sys
from typing import Any

import click

from cleaner.daemon import SWEEPS, Cleaner, CleanerConfig
from cleaner.settings import cleaner_services, config_with
from txtasks.cli.common import (
    Command,
    broker_url_option,
    connections_option,
    database_url_option,
    existing_app_database,
    friendly_errors,
    from_command_line,
    health_host_option,
    health_port_option,
    json_default,
    load_app,
    load_object,
    log_format_option,
    logging_setup,
    metrics_port_option,
    run_async,
    timeout_options,
)
from txtasks.errors import ConfigurationError
from txtasks.wakeup import notifier_for_url

log = logging.getLogger("cleaner")


@click.command(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("app_spec", metavar="APP")
@database_url_option
@timeout_options
@connections_option
@broker_url_option
@click.option(
    "--config",
    "config_spec",
    metavar="MODULE:ATTR",
    help="A txtasks.cleaner.CleanerConfig to start from (default: every sweep with its defaults).",
)
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="SWEEP.SETTING=VALUE",
    help="Change one setting, e.g. --set rescuer.interval=2 (repeatable; see docs/operations.md).",
)
@click.option("--only", multiple=True, metavar="SWEEP", help="Run only these sweeps (or services).")
@click.option(
    "--skip", multiple=True, metavar="SWEEP", help="Do not run these sweeps (or services)."
)
@click.option("--once", is_flag=True, help="One pass of each sweep, print the results, exit.")
@health_port_option
@health_host_option
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="debug also logs the passes that found nothing to do.",
)
@log_format_option
@metrics_port_option
def cleaner(
    app_spec: str,
    database_url: str | None,
    broker_url: str | None,
    config_spec: str | None,
    assignments: tuple[str, ...],
    only: tuple[str, ...],
    skip: tuple[str, ...],
    once: bool,
    health_port: int | None,
    health_host: str | None,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
) -> None:
    """Rescue tasks of dead workers, re-announce lost wake-ups, archive, purge old rows and
    fire periodic tasks for APP (module:attribute). SIGTERM/SIGINT stop it."""
    logging_setup(log_level, log_format)
    if log_level != "debug":  # APScheduler logs every job run at INFO
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
    app = load_app(app_spec)
    database_url = from_command_line("database_url", database_url)
    broker_url = from_command_line("broker_url", broker_url)
    config = config_from(config_spec, assignments, only, skip)
    if health_port is not None:
        config = dataclasses.replace(config, health_port=health_port)
    if health_host is not None:
        config = dataclasses.replace(config, health_host=health_host)
    existing_app_database(app, database_url)
    if database_url:
        app.use_driver(app.driver_for(database_url))
    if broker_url:
        app.use_notifier(notifier_for_url(broker_url))
    metrics = None
    if metrics_port is not None and not once:
        from txtasks.metrics import Metrics  # prometheus_client: only when serving metrics

        metrics = Metrics()
        metrics.serve(metrics_port)
    daemon = Cleaner(app, config, metrics=metrics)
    with friendly_errors(app.resolve_database_url(database_url)):
        if once:
            results = run_async(lambda: _once(daemon))
            click.echo(json.dumps(results, indent=2, default=json_default))
            sys.exit(0 if all(r is not None for r in results.values()) else 1)
        run_async(lambda: _serve(daemon))


def config_from(
    spec: str | None, assignments: tuple[str, ...], only: tuple[str, ...], skip: tuple[str, ...]
) -> CleanerConfig:
    """The configuration: --config, then each --set, then --only/--skip."""
    config = CleanerConfig()
    if spec is not None:
        config = load_object(spec)
        if not isinstance(config, CleanerConfig):
            raise click.BadParameter(f"{spec!r} is a {type(config).__name__}, not a CleanerConfig")
    for assignment in assignments:
        config = config_with(config, assignment)
    services = list(cleaner_services(config))
    sweeps = (*SWEEPS, "stats")
    unknown = [name for name in (*only, *skip) if name not in (*sweeps, *services)]
    if unknown:
        raise ConfigurationError(
            f"--only/--skip: no sweep {unknown[0]!r} (sweeps: {', '.join((*sweeps, *services))})"
        )
    chosen = set(only or (*sweeps, *services)) - set(skip)
    if not chosen:
        raise ConfigurationError("--only/--skip: no sweep left to run")
    off: dict[str, Any] = {name: None for name in sweeps if name not in chosen}
    stopped = {name: None for name in services if name not in chosen}
    return dataclasses.replace(config, **off, services={**config.services, **stopped})


async def _once(daemon: Cleaner) -> dict[str, object]:
    try:
        results = await daemon.run_once()
    finally:
        await daemon.app.aclose()
    return {k: None if r is None else r.fields() for k, r in results.items()}


async def _serve(daemon: Cleaner) -> None:
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        log.info("%s received: stopping", signal.Signals(signum).name)
        daemon.request_stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await daemon.run()
    finally:
        await daemon.app.aclose()
