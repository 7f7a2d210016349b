"""What every command shares: loading the app, resolving settings, running async code."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from txtasks.app import ENV_DATABASE_URL, App
from txtasks.driver import Driver, driver_for_url
from txtasks.errors import ConfigurationError, TxtasksError

T = TypeVar("T")

database_url_option = click.option(
    "--database-url",
    envvar=ENV_DATABASE_URL,
    show_envvar=True,
    help="postgresql://..., mysql://... or sqlite:///path (overrides the app's setting).",
)


def load_app(spec: str) -> App:
    """Import `module:attribute` and check it is a txtasks App."""
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
        app = getattr(module, attribute)
    except AttributeError:
        raise click.BadParameter(f"{spec!r}: module {module_name!r} has no {attribute!r}") from None
    if not isinstance(app, App):
        raise click.BadParameter(f"{spec!r} is a {type(app).__name__}, not a txtasks.App")
    return app


def driver_from(url: str | None, app: App | None = None) -> Driver:
    """The driver for the flag/env URL, else the app's own setting."""
    resolved = url or (app.resolve_database_url() if app is not None else None)
    if not resolved:
        raise ConfigurationError(
            f"database_url: not set; pass --database-url or set {ENV_DATABASE_URL}"
        )
    return driver_for_url(resolved)


def run_async(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine; turn txtasks errors into a clean message and exit code 2."""
    try:
        return asyncio.run(_call(make))
    except TxtasksError as exc:
        raise click.ClickException(str(exc)) from exc


async def _call(make: Callable[[], Awaitable[T]]) -> T:
    return await make()


def logging_setup(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def json_default(value: Any) -> Any:
    return str(value)
