"""Bounded database operations: connect timeout, command timeout, TCP keepalives.

A connection whose peer vanished (a NAT or firewall dropping state, a frozen proxy) never
answers: without a bound, a worker waits on it forever. Every connection txtasks opens is
bounded three ways:

- `connect`: seconds to open a connection (the drivers' own connect timeout). Taking a
  connection out of a pool, opening it and its first statements included, is bounded by
  `connect` + `command` (`Timeouts.checkout`): some drivers bound only the TCP connect, and a
  network that stalls while the server greets or authenticates would hold the caller for good;
- `command`: seconds any use of a connection may take (a transaction, a statement). Past it the
  connection's socket is closed under the statement: the only way out of a half-open
  connection, where a polite cancel would wait for an answer too. The operation raises
  `DatabaseTimeout` (a `TimeoutError`), the connection is replaced, the caller retries. The
  server is told the same bound (`statement_timeout`, `idle_in_transaction_session_timeout`
  on PostgreSQL), so it frees the locks of a statement nobody waits for any more;
- TCP keepalives (`keepalive_idle`, `keepalive_interval`, `keepalive_count`) and
  `TCP_USER_TIMEOUT`: the kernel notices a dead peer of an idle pooled connection, or of one
  whose sent data goes unacknowledged, within about idle + interval x count seconds.

Defaults notice a dead connection within 30 s. Set them with `Timeouts(...)` (``App(timeouts=)``
or a driver's ``timeouts=``), with query parameters of the database URL
(``?connect_timeout=5&command_timeout=60``), or with the environment variables
``TXTASKS_DB_CONNECT_TIMEOUT``, ``TXTASKS_DB_COMMAND_TIMEOUT`` and ``TXTASKS_DB_KEEPALIVE_IDLE``
(the CLI's ``--db-connect-timeout`` / ``--db-command-timeout`` set these). The environment
overrides the others (one line logged when it changes a `Timeouts` given in code); the URL's parameters apply when no `Timeouts` is given. ``command_timeout=0`` (or ``none``) turns the command bound off.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL

from txtasks.errors import ConfigurationError

#: URL query parameter -> Timeouts field; these are taken out of the URL before it reaches
#: the database drivers.
URL_PARAMS = {
    "connect_timeout": "connect",
    "command_timeout": "command",
    "keepalives_idle": "keepalive_idle",
    "keepalives_interval": "keepalive_interval",
    "keepalives_count": "keepalive_count",
}
log = logging.getLogger("txtasks")
#: Environment variable -> Timeouts field.
ENV_VARS = {
    "TXTASKS_DB_CONNECT_TIMEOUT": "connect",
    "TXTASKS_DB_COMMAND_TIMEOUT": "command",
    "TXTASKS_DB_KEEPALIVE_IDLE": "keepalive_idle",
}


class DatabaseTimeout(TimeoutError):
    """The database did not answer within the command timeout; the connection was dropped."""


@dataclass(frozen=True)
class Timeouts:
    """Bounds of every database operation txtasks makes, in seconds."""

    #: Opening a connection.
    connect: float = 10.0
    #: Any use of a connection (one driver operation); None: unbounded.
    command: float | None = 30.0
    #: Idle seconds before the first TCP keepalive probe.
    keepalive_idle: float = 10.0
    #: Seconds between probes.
    keepalive_interval: float = 5.0
    #: Unanswered probes before the kernel drops the connection.
    keepalive_count: int = 3

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.name == "command":
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigurationError(
                    f"timeouts.{f.name}: must be a finite number > 0, got {value!r}"
                )

    @property
    def dead_after(self) -> float:
        """Seconds after which the kernel gives up on a silent peer."""
        return self.keepalive_idle + self.keepalive_interval * self.keepalive_count

    @property
    def checkout(self) -> float:
        """Seconds a connection may take to come out of a pool: opened (`connect`: the TCP
        connection, the server's greeting, the authentication) and set up (its first
        statements: `command`), or handed over by another user of the pool."""
        return self.connect + (self.command if self.command is not None else self.connect)

    def replace(self, changes: Mapping[str, str]) -> Timeouts:
        """These timeouts with `changes` (field -> text, as in a URL or the environment)."""
        values: dict[str, Any] = {}
        for name, text in changes.items():
            values[name] = _parse(name, text)
        return dataclasses.replace(self, **values)

    @classmethod
    def resolve(
        cls, url: URL, given: Timeouts | None = None, env: Mapping[str, str] | None = None
    ) -> tuple[Timeouts, URL]:
        """`given`, else the defaults with the URL's query parameters; then the environment
        (one line logged when it changes what `given` set). And the URL without txtasks'
        parameters."""
        explicit = given is not None
        if given is None:
            query = {URL_PARAMS[k]: str(v) for k, v in url.query.items() if k in URL_PARAMS}
            given = cls().replace(query)
        env = os.environ if env is None else env
        timeouts = given.replace({f: env[v] for v, f in ENV_VARS.items() if env.get(v)})
        if explicit and timeouts != given:
            changed = [
                f"{v}={env[v]}" for v, f in ENV_VARS.items() if env.get(v)
                and getattr(timeouts, f) != getattr(given, f)
            ]  # fmt: skip
            log.info(
                "timeouts: %s used, over the Timeouts given in code (unset it to use the code's)",
                ", ".join(changed),
            )
        return timeouts, url.difference_update_query(URL_PARAMS)


def _parse(name: str, text: str) -> float | int | None:
    """A timeout setting's text: a number of seconds; for `command`, 0 or none means off."""
    if name == "command" and text.strip().lower() in ("0", "none", "off"):
        return None
    try:
        value = int(text) if name == "keepalive_count" else float(text)
    except ValueError:
        raise ConfigurationError(
            f"timeouts.{name}: expected a number of seconds, got {text!r}"
        ) from None
    return value


# -- applying them --------------------------------------------------------------------------


def socket_of(driver_connection: Any) -> Any:
    """The socket under an asyncpg, aiomysql or pymysql connection (None if not found)."""
    transport = getattr(driver_connection, "_transport", None)  # asyncpg
    writer = getattr(driver_connection, "_writer", None)  # aiomysql
    if transport is None and writer is not None:
        transport = writer.transport
    if transport is not None:
        return transport.get_extra_info("socket")
    return getattr(driver_connection, "_sock", None)  # pymysql


def keepalive_set(sock: Any, timeouts: Timeouts) -> None:
    """TCP keepalives on `sock`, and TCP_USER_TIMEOUT where the platform has it."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    options = {
        "TCP_KEEPIDLE": max(1, int(timeouts.keepalive_idle)),
        "TCP_KEEPINTVL": max(1, int(timeouts.keepalive_interval)),
        "TCP_KEEPCNT": timeouts.keepalive_count,
        "TCP_USER_TIMEOUT": int(timeouts.dead_after * 1000),
    }
    for name, value in options.items():
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class Watchdog:
    """Calls `cut()` if the block is still running after `limit` seconds; the block's error
    then becomes a `DatabaseTimeout`."""

    def __init__(self, limit: float | None, cut: Callable[[], None]) -> None:
        self.limit = limit
        self.cut = cut
        self.fired = False
        self._handle: asyncio.TimerHandle | None = None

    def _fire(self) -> None:
        self.fired = True
        with contextlib.suppress(Exception):  # already closed: nothing to cut
            self.cut()

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        if self.limit is not None:
            self._handle = asyncio.get_running_loop().call_later(self.limit, self._fire)
        try:
            yield
        except Exception as exc:
            if self.fired:
                raise DatabaseTimeout(
                    f"no answer from the database within {self.limit:g}s "
                    "(command timeout): the connection was dropped"
                ) from exc
            raise
        finally:
            if self._handle is not None:
                self._handle.cancel()
