"""What every command shares: loading the app, resolving settings, running async code."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

import click

from txtasks._checks import check_number
from txtasks.env import ENV_BROKER_URL, ENV_DATABASE_URL
from txtasks.errors import ConfigurationError, PayloadError, TxtasksError, missing_extra
from txtasks.payload import headers_decode, payload_decode
from txtasks.types import JSON_CONTENT_TYPE, TaskRow

if TYPE_CHECKING:  # imported where used: building the commands and --help need none of them
    from sqlalchemy.engine import URL
    from sqlalchemy.exc import DBAPIError

    from txtasks.app import App
    from txtasks.driver import Driver


T = TypeVar("T")


class Share(click.FloatRange):
    """A fraction from 0 to 1; NaN, which passes click's bounds, is refused."""

    name = "share"

    def __init__(self) -> None:
        super().__init__(0, 1)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        try:
            return check_number(param.name if param else "value", number, minimum=0, maximum=1)
        except ConfigurationError as exc:
            self.fail(str(exc), param, ctx)


database_url_option = click.option(
    "--database-url",
    envvar=ENV_DATABASE_URL,
    show_envvar=True,
    help="postgresql://..., mysql://... or sqlite:///path (beats the app's setting, "
    "which beats the variable).",
)


broker_url_option = click.option(
    "--broker-url",
    envvar=ENV_BROKER_URL,
    show_envvar=True,
    help="amqp://... RabbitMQ for wake-ups (beats the app's setting, which beats the "
    "variable); none: polling only.",
)


def _timeout_setting(variable: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    """A click callback putting a timeout flag where every driver reads it: the environment."""

    def store(_ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is None:
            return
        from txtasks.driver.timeouts import ENV_VARS, Timeouts

        try:
            Timeouts().replace({ENV_VARS[variable]: value})
        except ConfigurationError as exc:
            raise click.BadParameter(str(exc), param=param) from None
        os.environ[variable] = value

    return store


def timeout_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--db-connect-timeout and --db-command-timeout (see txtasks.driver.timeouts)."""
    for flag, variable, text in (
        (
            "--db-command-timeout",
            "TXTASKS_DB_COMMAND_TIMEOUT",
            "Seconds any database "
            "operation may take before its connection is dropped [default: 30; 0: unbounded].",
        ),
        (
            "--db-connect-timeout",
            "TXTASKS_DB_CONNECT_TIMEOUT",
            "Seconds to open a database connection [default: 10].",
        ),
    ):
        command = click.option(
            flag,
            envvar=variable,
            show_envvar=True,
            expose_value=False,
            is_eager=True,
            metavar="SECONDS",
            callback=_timeout_setting(variable),
            help=text,
        )(command)
    return command


def _connections_setting(_ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """A click callback putting --db-connections where every driver reads it: the
    environment (TXTASKS_DB_CONNECTIONS)."""
    if value is None:
        return
    from txtasks.driver.pooling import ENV_CONNECTIONS, connections_parse

    try:
        connections_parse(value, "--db-connections")
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param=param) from None
    os.environ[ENV_CONNECTIONS] = value


connections_option = click.option(
    "--db-connections",
    envvar="TXTASKS_DB_CONNECTIONS",
    show_envvar=True,
    expose_value=False,
    is_eager=True,
    metavar="N",
    callback=_connections_setting,
    help="The most database connections this process holds at once (see docs/connections.md) "
    "[default: each pool its own size].",
)


def from_command_line(name: str, value: str | None) -> str | None:
    """`value` when the command line gave it; None when it came from the environment, which
    an app's own setting beats (App.resolve_database_url)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or value is None:
        return value
    source = ctx.get_parameter_source(name)
    return None if source is click.core.ParameterSource.ENVIRONMENT else value


def load_app(spec: str) -> App:
    """Import `module:attribute` and check it is a txtasks App."""
    from txtasks.app import App

    app = load_object(spec)
    if not isinstance(app, App):
        raise click.BadParameter(f"{spec!r} is a {type(app).__name__}, not a txtasks.App")
    return app


def load_object(spec: str) -> Any:
    """Import `module:attribute` (the working directory is importable)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"{spec!r}: expected module:attribute, e.g. myproject.tasks:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"{spec!r}: cannot import {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise click.BadParameter(f"{spec!r}: module {module_name!r} has no {attribute!r}") from None


def resolve_url(url: str | None, app: App | None = None) -> str:
    """The flag (or, without an app, the environment's) URL, else the app's own setting, else
    the environment; an error when none is set."""
    resolved = url or (app.resolve_database_url() if app is not None else None)
    if not resolved:
        raise ConfigurationError(
            f"database_url: not set; pass --database-url or set {ENV_DATABASE_URL}"
        )
    return resolved


def existing_database(url: str) -> str:
    """`url`, unless it names a SQLite file that does not exist: commands that read or change
    tasks refuse it rather than create an empty database (only `migrate` creates one)."""
    from txtasks.driver.urls import sqlite_file_missing, url_safe

    missing = sqlite_file_missing(url)
    if missing is not None:
        raise ConfigurationError(
            f"database_url: no SQLite database at {missing} ({url_safe(url)}); check the path, "
            f"or create it with: txtasks migrate --database-url {url_safe(url)}"
        )
    return url


def existing_app_database(app: App, url: str | None) -> None:
    """Refuse the database `app` would use (the flag's `url`, else its own) when it names a
    SQLite file that does not exist (`existing_database`)."""
    resolved = app.resolve_database_url(url)
    if resolved:
        existing_database(resolved)


def with_driver(url: str | None, call: Callable[[Driver], Awaitable[T]]) -> T:
    """Open a driver for the URL (an existing database: `existing_database`), run one call
    with it, close it."""
    from txtasks.driver import driver_for_url

    resolved = existing_database(resolve_url(url))
    driver = driver_for_url(resolved)

    async def go() -> T:
        try:
            await driver.open()
            return await call(driver)
        finally:
            await driver.close()

    with friendly_errors(resolved):
        return run_async(go)


def run_async(make: Callable[[], Awaitable[T]], *, loop: str = "asyncio") -> T:
    """Run a coroutine to completion (errors are reported by `Commands`), on the standard
    event loop or on uvloop (`loop_choice`)."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(_call(make))
    return asyncio.run(_call(make))


def loop_choice(name: str) -> str:
    """The event loop for `--loop`: auto is uvloop when it is installed (txtasks[fast])."""
    installed = importlib.util.find_spec("uvloop") is not None
    if name == "auto":
        return "uvloop" if installed else "asyncio"
    if name == "uvloop" and not installed:
        raise click.BadParameter('uvloop is not installed (pip install "txtasks[fast]")')
    return name


loop_option = click.option(
    "--loop",
    type=click.Choice(["auto", "asyncio", "uvloop"]),
    default="auto",
    show_default=True,
    envvar="TXTASKS_LOOP",
    show_envvar=True,
    help="Event loop; auto: uvloop when installed, else asyncio.",
)


#: A database error about a table that is not there: the table's name in group 1.
MISSING_TABLE = re.compile(
    r"""relation "(\w+)" does not exist|Table '(?:\w+\.)?(\w+)' doesn't exist|no such table: (\w+)"""
)


def error_message(exc: BaseException, url: str | URL | None = None) -> str | None:
    """A one-line message for errors a user can fix, None for a bug (shown as a traceback).
    With the database `url`, a connection error names it (its password hidden)."""
    if isinstance(exc, TxtasksError):
        return str(exc)
    missing = missing_extra(exc) if isinstance(exc, ImportError) else None
    if missing is not None:
        return str(missing)
    if isinstance(exc, database_errors()):
        return database_message(exc, url)
    if isinstance(exc, OSError):
        from txtasks.driver.urls import url_safe

        where = f" to {url_safe(url)}" if url is not None else ""
        return f"cannot connect{where}: {exc.strerror or exc}"
    return None


def database_errors() -> tuple[type[DBAPIError], ...]:
    """SQLAlchemy's database error, when SQLAlchemy is loaded (else none can have been raised:
    a `--help` or a usage error does not import it)."""
    exc_module = sys.modules.get("sqlalchemy.exc")
    return (exc_module.DBAPIError,) if exc_module is not None else ()


def database_message(exc: DBAPIError, url: str | URL | None) -> str:
    """One line for a database error: the connection that failed, the table that is missing,
    or the driver's first line (never the statement or its parameters)."""
    from txtasks.driver.urls import url_safe

    lines = str(exc.orig).strip().splitlines() if exc.orig is not None else []
    detail = lines[0] if lines else type(exc).__name__
    missing = MISSING_TABLE.search(detail)
    if missing:
        table = next(name for name in missing.groups() if name)
        return f"table {table} missing: run txtasks migrate"
    if exc.statement is None or exc.connection_invalidated:  # connecting failed, or the link
        where = f" to {url_safe(url)}" if url is not None else ""
        return f"cannot connect{where}: {detail}"
    return f"database error: {detail}"


@contextlib.contextmanager
def friendly_errors(url: str | URL | None = None) -> Iterator[None]:
    """A bad setting, a missing extra or an unreachable database becomes a one-line message,
    not a trace; with `url`, connection errors name the database."""
    try:
        yield
    except Exception as exc:
        message = error_message(exc, url)
        if message is None:  # a bug, or click's own exit: raised as it is
            raise
        raise click.ClickException(message) from exc


class Lazy(NamedTuple):
    """A command of another package: where it is ("module:attribute") and the first paragraph
    of its help, which `txtasks --help` shortens and lists without importing the command (a
    test checks it is the command's own)."""

    spec: str
    help_text: str


class Commands(click.Group):
    """The `txtasks` group, reporting errors with `friendly_errors`. Commands of other packages
    (`lazy`) are imported only when they run or show their own help."""

    lazy: ClassVar[dict[str, Lazy]] = {
        "cleaner": Lazy(
            "cleaner.cli:cleaner",
            "Rescue tasks of dead workers, re-announce lost wake-ups, archive, purge old rows and "
            "fire periodic tasks for APP (module:attribute). SIGTERM/SIGINT stop it.",
        ),
        "dashboard": Lazy(
            "txtasks.web.cli:dashboard",
            "Serve the web dashboard of APP (module:attribute): queues, tasks, dead letters, "
            "periodic schedules and workers, with actions on them (needs the extra `web`).",
        ),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is None and name in self.lazy:
            module, _, attribute = self.lazy[name].spec.partition(":")
            command = getattr(importlib.import_module(module), attribute)
            command.context_settings.setdefault("help_option_names", ["-h", "--help"])
            self.add_command(command, name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, with the summary of a lazy command not imported yet."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names), default=0)
        rows = []
        for name in names:
            command = self.commands.get(name)
            if command is None:
                placeholder = click.Command(name, help=self.lazy[name].help_text)
                rows.append((name, placeholder.get_short_help_str(limit)))
            elif not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        with friendly_errors():
            return super().invoke(ctx)


class Command(click.Command):
    """A command run on its own (`python -m cleaner`), reporting errors likewise."""

    def invoke(self, ctx: click.Context) -> Any:
        with friendly_errors():
            return super().invoke(ctx)


async def _call(make: Callable[[], Awaitable[T]]) -> T:
    return await make()


#: Libraries whose debug logs drown ours.
QUIET_LOGGERS = ("aiosqlite", "aiormq", "aio_pika", "asyncio")

metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    envvar="TXTASKS_METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus metrics on this port at /metrics (0: any free port).",
)

health_port_option = click.option(
    "--health-port",
    type=click.IntRange(min=0, max=65535),
    envvar="TXTASKS_HEALTH_PORT",
    show_envvar=True,
    help="Serve /livez and /readyz on this port (0: any free port).",
)
health_host_option = click.option(
    "--health-host", help="Address the health endpoint listens on (default: 0.0.0.0, all)."
)

log_level_option = click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
log_format_option = click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    envvar="TXTASKS_LOG_FORMAT",
    show_envvar=True,
    show_default=True,
    help="json: one JSON object per line, with the structured fields of each record.",
)


def logging_setup(level: str, log_format: str = "text") -> None:
    """Log to stderr as text, or as one JSON object per line (extra fields included)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
    for chatty in QUIET_LOGGERS:  # they log every statement or packet at debug
        logging.getLogger(chatty).setLevel(max(logging.INFO, logging.getLogger().level))


def json_default(value: Any) -> Any:
    """JSON for what `json.dumps` does not know: datetimes as ISO text, bytes as base64."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def task_json(row: TaskRow) -> dict[str, Any]:
    """A task for `--json` output: the payload decoded when it is JSON."""
    data = row._asdict()
    if row.content_type == JSON_CONTENT_TYPE:
        try:
            data["payload"] = payload_decode(row.payload, row.content_type)
        except PayloadError:
            data["payload_error"] = "not valid JSON"
    data["headers"] = headers_decode(row.headers) if row.headers else None
    return data
