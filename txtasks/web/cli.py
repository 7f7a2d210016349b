"""`txtasks dashboard APP`: serve the web dashboard of an application."""

from __future__ import annotations

import click

from txtasks.cli.common import (
    database_url_option,
    existing_app_database,
    from_command_line,
    load_app,
    log_format_option,
    log_level_option,
    logging_setup,
)


@click.command()
@click.argument("app_spec", metavar="APP")
@database_url_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; any but loopback needs TXTASKS_DASHBOARD_TOKEN, or "
    "TXTASKS_DASHBOARD_USER and TXTASKS_DASHBOARD_PASSWORD.",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option("--read-only", is_flag=True, help="Show no action, and refuse every one.")
@click.option(
    "--redact-payloads",
    is_flag=True,
    envvar="TXTASKS_DASHBOARD_REDACT",
    show_envvar=True,
    help="Show payloads, results and checkpoints only as their size.",
)
@click.option(
    "--refresh",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="How often pages refresh themselves (0: never).",
)
@click.option("--root-path", default="", help="The path prefix a reverse proxy serves it under.")
@log_level_option
@log_format_option
def dashboard(
    app_spec: str,
    database_url: str | None,
    host: str,
    port: int,
    read_only: bool,
    redact_payloads: bool,
    refresh: float,
    root_path: str,
    log_level: str,
    log_format: str,
) -> None:
    """Serve the web dashboard of APP (module:attribute): queues, tasks, dead letters,
    periodic schedules and workers, with actions on them (needs the extra `web`)."""
    from txtasks.errors import TxtasksError, extras_needed

    with extras_needed():  # one line naming the extra `web` when it is not installed
        import uvicorn

        from txtasks.web import create_app
        from txtasks.web.security import LOOPBACK_HOSTS, Auth, check_bind

    logging_setup(log_level, log_format)
    app = load_app(app_spec)
    database_url = from_command_line("database_url", database_url)
    try:
        auth = Auth.from_env()
        check_bind(host, auth)
        existing_app_database(app, database_url)  # the dashboard creates no database
        if database_url:
            app.use_driver(app.driver_for(database_url))
        asgi = create_app(
            app,
            read_only=read_only,
            redact_payloads=redact_payloads,
            auth=auth,
            refresh=refresh,
            # without a login, only a browser on this machine, by a loopback name (a site
            # whose DNS name points at 127.0.0.1 sends its own name as the Host)
            hosts=[*LOOPBACK_HOSTS, host] if auth is None else None,
            close_app=True,
        )
    except TxtasksError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"txtasks dashboard on http://{host}:{port}{root_path}/", err=True)
    uvicorn.run(asgi, host=host, port=port, root_path=root_path, log_level=log_level.lower())
