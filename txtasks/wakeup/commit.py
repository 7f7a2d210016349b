"""Publish wake-ups after the caller's transaction commits: never before, never on rollback.

SQLAlchemy's Session has an after-commit event but Connection has none, so txtasks wraps the
dialect's `do_commit` and `do_rollback` (once per engine). Both flavours, sync and async, commit
through them. Hints wait in the pooled connection's `info` until one of the two runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect

from txtasks.wakeup.base import Notifier

log = logging.getLogger("txtasks.wakeup")

PENDING_KEY = "txtasks.wakeups"
WRAPPED_FLAG = "_txtasks_wakeup_hooks"


class PendingWakeups:
    """Hints collected during one transaction, coalesced per queue."""

    def __init__(self) -> None:
        self.added: list[tuple[Notifier, Mapping[str, Sequence[int]]]] = []
        self.savepoints: dict[str, int] = {}

    def add(self, notifier: Notifier, ids_by_queue: Mapping[str, Sequence[int]]) -> None:
        self.added.append((notifier, ids_by_queue))

    @property
    def by_notifier(self) -> dict[int, tuple[Notifier, dict[str, list[int]]]]:
        grouped: dict[int, tuple[Notifier, dict[str, list[int]]]] = {}
        for notifier, ids_by_queue in self.added:
            _, queues = grouped.setdefault(id(notifier), (notifier, {}))
            for queue, ids in ids_by_queue.items():
                queues.setdefault(queue, []).extend(ids)
        return grouped

    def publish(self) -> None:
        for notifier, queues in self.by_notifier.values():
            for queue, ids in queues.items():
                try:
                    notifier.notify(queue, ids)
                except Exception:  # a hint must never break the caller's commit path
                    log.exception("wake-up for queue %s could not be queued", queue)


def _after(original: Callable[[Any], None], publish: bool) -> Callable[[Any], None]:
    def hooked(dbapi_connection: Any) -> None:
        original(dbapi_connection)
        info = getattr(dbapi_connection, "info", None)
        pending = info.pop(PENDING_KEY, None) if info is not None else None
        if pending is not None and publish:
            pending.publish()

    return hooked


def _discard_first(original: Callable[[Any], None]) -> Callable[[Any], None]:
    def hooked(dbapi_connection: Any) -> None:
        info = getattr(dbapi_connection, "info", None)
        if info is not None:
            info.pop(PENDING_KEY, None)
        original(dbapi_connection)

    return hooked


def _savepoint(original: Callable[..., None]) -> Callable[..., None]:
    def hooked(connection: Any, name: str) -> None:
        original(connection, name)
        pending = connection.connection.info.get(PENDING_KEY)
        if pending is not None:
            pending.savepoints[name] = len(pending.added)
        else:
            connection.connection.info[PENDING_KEY] = p = PendingWakeups()
            p.savepoints[name] = 0

    return hooked


def _rollback_to(original: Callable[..., None]) -> Callable[..., None]:
    def hooked(connection: Any, name: str) -> None:
        original(connection, name)
        pending = connection.connection.info.get(PENDING_KEY)
        if pending is not None and name in pending.savepoints:
            del pending.added[pending.savepoints[name] :]

    return hooked


def install_hooks(dialect: Dialect) -> None:
    """Wrap this dialect instance's commit and rollback once (each engine has its own)."""
    if getattr(dialect, WRAPPED_FLAG, False):
        return
    dialect.do_commit = _after(dialect.do_commit, publish=True)  # type: ignore[method-assign, assignment]
    dialect.do_rollback = _discard_first(dialect.do_rollback)  # type: ignore[method-assign, assignment]
    dialect.do_savepoint = _savepoint(dialect.do_savepoint)  # type: ignore[method-assign]
    dialect.do_rollback_to_savepoint = _rollback_to(dialect.do_rollback_to_savepoint)  # type: ignore[method-assign]
    setattr(dialect, WRAPPED_FLAG, True)


def wakeup_after_commit(
    connection: Connection, notifier: Notifier, ids_by_queue: Mapping[str, Sequence[int]]
) -> None:
    """Queue hints that go out when `connection`'s transaction commits."""
    install_hooks(connection.dialect)
    info = connection.connection.info
    pending = info.get(PENDING_KEY)
    if pending is None:
        pending = info[PENDING_KEY] = PendingWakeups()
    pending.add(notifier, ids_by_queue)
