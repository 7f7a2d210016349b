"""Wake-ups go out after the caller's transaction commits: never before, never on rollback.

No broker here: a recording notifier stands in for RabbitMQ, and SQLite files stand in for the
database (the hooks live at the SQLAlchemy level, so every flavour commits through them).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from txtasks import App, ConfigurationError
from txtasks.app import Task
from txtasks.schema.migrate import migrate
from txtasks.wakeup import (
    Notifier,
    NullNotifier,
    Wakeup,
    WakeupStats,
    notifier_for_url,
    wakeup_decode,
    wakeup_encode,
    wakeup_read,
)
from txtasks.wakeup.base import MAX_IDS, MAX_MESSAGE_BYTES
from txtasks.wakeup.commit import PENDING_KEY

FLAVOURS = ["connection", "session", "async_connection", "async_session"]


class RecordingNotifier:
    """Records every wake-up, and which of its task ids a fresh connection could see then."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self.stats = WakeupStats()
        #: (queue, ids, ids committed and visible from another connection at notify time)
        self.calls: list[tuple[str, list[int], list[int]]] = []

    def notify(self, queue: str, ids: Sequence[int] = ()) -> None:
        self.calls.append((queue, list(ids), self.committed(ids)))
        self.stats.published += 1

    def committed(self, ids: Sequence[int]) -> list[int]:
        if not ids:
            return []
        with contextlib.closing(sqlite3.connect(self.database, timeout=5)) as db:
            marks = ",".join("?" * len(ids))
            rows = db.execute(f"SELECT id FROM txtasks_tasks WHERE id IN ({marks})", list(ids))
            return sorted(row[0] for row in rows)

    async def subscribe(self, queues: Sequence[str], on_wakeup: Callable[[str], None]) -> None:
        return None

    async def close(self) -> None:
        return None

    @property
    def published(self) -> dict[str, list[int]]:
        """Queue -> ids, one entry per call (a queue seen twice fails the test)."""
        by_queue: dict[str, list[int]] = {}
        for queue, ids, _ in self.calls:
            assert queue not in by_queue, f"two wake-ups for queue {queue}: {self.calls}"
            by_queue[queue] = ids
        return by_queue


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.sqlite3"
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as conn:
            migrate(conn)
    finally:
        engine.dispose()
    return path


@pytest.fixture
def notifier(database: Path) -> RecordingNotifier:
    return RecordingNotifier(database)


@pytest.fixture
async def app(database: Path, notifier: RecordingNotifier) -> AsyncIterator[App]:
    application = App("hooks", database_url=f"sqlite:///{database}", notifier=notifier)
    yield application
    await application.aclose()


@pytest.fixture
def tasks(app: App) -> tuple[Task, Task]:
    mail = app.task(name="hooks.mail", queue="mail")(lambda payload: None)
    report = app.task(name="hooks.report", queue="reports")(lambda payload: None)
    return mail, report


@pytest.fixture
def engine(database: Path) -> Iterator[Engine]:
    sync_engine = create_engine(f"sqlite:///{database}")
    yield sync_engine
    sync_engine.dispose()


@pytest.fixture
async def async_engine(database: Path) -> AsyncIterator[AsyncEngine]:
    aengine = create_async_engine(f"sqlite+aiosqlite:///{database}")
    yield aengine
    await aengine.dispose()


Work = list[tuple[Task, Any]]


async def transaction(
    flavour: str,
    engine: Engine,
    async_engine: AsyncEngine,
    notifier: RecordingNotifier,
    work: Work,
    *,
    commit: bool,
    bulk: bool = False,
) -> list[int]:
    """Enqueue `work` in one transaction of `flavour`, check nothing went out yet, then end it."""
    app = work[0][0].app

    def sync_enqueue(executor: Any) -> list[int]:
        if bulk:
            return app.enqueue_many_tx(executor, [task.new(payload) for task, payload in work])
        return [task.enqueue_tx(executor, payload) for task, payload in work]

    async def async_enqueue(executor: Any) -> list[int]:
        if bulk:
            rows = [task.new(payload) for task, payload in work]
            return await app.aenqueue_many_tx(executor, rows)
        return [await task.aenqueue_tx(executor, payload) for task, payload in work]

    if flavour == "connection":
        with engine.connect() as conn:
            ids = sync_enqueue(conn)
            assert notifier.calls == [], "a wake-up went out before the commit"
            conn.commit() if commit else conn.rollback()
    elif flavour == "session":
        with Session(engine) as session:
            ids = sync_enqueue(session)
            assert notifier.calls == [], "a wake-up went out before the commit"
            session.commit() if commit else session.rollback()
    elif flavour == "async_connection":
        async with async_engine.connect() as aconn:
            ids = await async_enqueue(aconn)
            assert notifier.calls == [], "a wake-up went out before the commit"
            await (aconn.commit() if commit else aconn.rollback())
    elif flavour == "async_session":
        async with AsyncSession(async_engine) as asession:
            ids = await async_enqueue(asession)
            assert notifier.calls == [], "a wake-up went out before the commit"
            await (asession.commit() if commit else asession.rollback())
    else:  # pragma: no cover
        raise AssertionError(flavour)
    return ids


@pytest.mark.parametrize("bulk", [False, True], ids=["one_by_one", "bulk"])
@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_commit_publishes_one_wakeup_per_queue_after_commit(
    flavour: str,
    bulk: bool,
    tasks: tuple[Task, Task],
    engine: Engine,
    async_engine: AsyncEngine,
    notifier: RecordingNotifier,
) -> None:
    mail, report = tasks
    work: Work = [(mail, 1), (report, 2), (mail, 3), (mail, 4), (report, 5)]
    ids = await transaction(flavour, engine, async_engine, notifier, work, commit=True, bulk=bulk)

    mail_ids, report_ids = [ids[0], ids[2], ids[3]], [ids[1], ids[4]]
    assert notifier.published == {"mail": mail_ids, "reports": report_ids}
    for queue, queue_ids, visible in notifier.calls:  # published after the commit, not before
        assert visible == sorted(queue_ids), f"{queue}: rows not committed at notify time"


@pytest.mark.parametrize("bulk", [False, True], ids=["one_by_one", "bulk"])
@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_rollback_publishes_nothing(
    flavour: str,
    bulk: bool,
    tasks: tuple[Task, Task],
    engine: Engine,
    async_engine: AsyncEngine,
    notifier: RecordingNotifier,
) -> None:
    mail, report = tasks
    work: Work = [(mail, 1), (report, 2)]
    ids = await transaction(flavour, engine, async_engine, notifier, work, commit=False, bulk=bulk)

    assert len(ids) == 2
    assert notifier.calls == []
    assert notifier.committed(ids) == []  # really rolled back


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_an_engine_reused_later_does_not_publish_old_hints_again(
    flavour: str,
    tasks: tuple[Task, Task],
    engine: Engine,
    async_engine: AsyncEngine,
    notifier: RecordingNotifier,
) -> None:
    mail, report = tasks
    first = await transaction(flavour, engine, async_engine, notifier, [(mail, 1)], commit=True)
    assert notifier.published == {"mail": first}
    notifier.calls.clear()

    # a rolled-back transaction on the same engine (and pooled connection) leaves nothing behind
    await transaction(flavour, engine, async_engine, notifier, [(mail, 2)], commit=False)
    assert notifier.calls == []

    later = await transaction(flavour, engine, async_engine, notifier, [(report, 3)], commit=True)
    assert notifier.published == {"reports": later}

    # a later transaction without enqueues publishes nothing either
    notifier.calls.clear()
    with engine.begin() as conn:
        conn.exec_driver_sql("SELECT 1")
    async with async_engine.begin() as aconn:
        await aconn.exec_driver_sql("SELECT 1")
    assert notifier.calls == []


def test_closing_a_connection_without_commit_drops_its_hints(
    tasks: tuple[Task, Task], engine: Engine, notifier: RecordingNotifier
) -> None:
    mail, _ = tasks
    with engine.connect() as conn:
        mail.enqueue_tx(conn, "never committed")
        raw = conn.connection.dbapi_connection
        assert raw is not None
    # the pooled connection went back to the pool (rolled back); the next commit on it is clean
    with engine.connect() as conn:
        assert conn.connection.dbapi_connection is raw
        assert PENDING_KEY not in conn.connection.info
        conn.exec_driver_sql("SELECT 1")
        conn.commit()
    assert notifier.calls == []


def test_an_exception_in_the_with_block_rolls_back_and_publishes_nothing(
    tasks: tuple[Task, Task], engine: Engine, notifier: RecordingNotifier
) -> None:
    mail, _ = tasks
    with pytest.raises(RuntimeError, match="business logic failed"), engine.begin() as conn:
        mail.enqueue_tx(conn, "order 1")
        raise RuntimeError("business logic failed")
    with (
        pytest.raises(RuntimeError, match="business logic failed"),
        Session(engine) as session,
        session.begin(),
    ):
        mail.enqueue_tx(session, "order 2")
        raise RuntimeError("business logic failed")
    assert notifier.calls == []


def test_each_transaction_publishes_its_own_ids(
    tasks: tuple[Task, Task], engine: Engine, notifier: RecordingNotifier
) -> None:
    mail, _ = tasks
    with engine.connect() as first:
        one = mail.enqueue_tx(first, 1)
        first.commit()
        with engine.connect() as second:
            two = mail.enqueue_tx(second, 2)
            second.rollback()
            three = mail.enqueue_tx(second, 3)
            second.commit()
    assert [(queue, ids) for queue, ids, _ in notifier.calls] == [
        ("mail", [one]),
        ("mail", [three]),
    ]
    assert notifier.committed([one, two, three]) == sorted({one, three})


def test_a_savepoint_rolled_back_takes_its_hints_with_it(
    tasks: tuple[Task, Task], engine: Engine, notifier: RecordingNotifier
) -> None:
    """Only committed rows are announced: a rolled-back SAVEPOINT's tasks never existed."""
    mail, report = tasks
    with Session(engine) as session:
        kept = mail.enqueue_tx(session, "kept")
        nested = session.begin_nested()
        gone = report.enqueue_tx(session, "gone")
        nested.rollback()
        session.commit()
    assert notifier.committed([kept, gone]) == [kept]
    assert notifier.published == {"mail": [kept]}


async def test_own_transaction_enqueue_notifies_after_commit(
    tasks: tuple[Task, Task], app: App, notifier: RecordingNotifier
) -> None:
    mail, report = tasks
    first = mail.enqueue("sync")
    assert [(q, ids, visible) for q, ids, visible in notifier.calls] == [("mail", [first], [first])]
    notifier.calls.clear()

    second = await report.aenqueue("async")
    assert notifier.calls == [("reports", [second], [second])]
    notifier.calls.clear()

    ids = await app.aenqueue_many([mail.new(1), report.new(2), mail.new(3)])
    assert notifier.published == {"mail": [ids[0], ids[2]], "reports": [ids[1]]}
    for _, queue_ids, visible in notifier.calls:
        assert visible == sorted(queue_ids)
    notifier.calls.clear()

    ids = app.enqueue_many([report.new(4), report.new(5)])
    assert notifier.calls == [("reports", ids, sorted(ids))]


async def test_notify_sends_now_and_checks_the_queue_name(
    app: App, notifier: RecordingNotifier
) -> None:
    app.notify("mail", [7, 8])
    app.notify("reports")
    assert notifier.calls == [("mail", [7, 8], []), ("reports", [], [])]
    with pytest.raises(ConfigurationError, match="queue"):
        app.notify("no spaces allowed")
    assert len(notifier.calls) == 2


class BrokenNotifier(RecordingNotifier):
    """Breaks the "never raises" promise, as a thread that cannot start would."""

    def notify(self, queue: str, ids: Sequence[int] = ()) -> None:
        super().notify(queue, ids)
        raise RuntimeError("can't start new thread")


async def test_a_failing_notifier_never_breaks_the_commit(
    tasks: tuple[Task, Task], engine: Engine, notifier: RecordingNotifier, app: App
) -> None:
    broken = BrokenNotifier(notifier.database)
    app.use_notifier(broken)
    mail, report = tasks
    with engine.connect() as conn:
        ids = [mail.enqueue_tx(conn, 1), report.enqueue_tx(conn, 2)]
        conn.commit()  # returns normally
    assert sorted(q for q, _, _ in broken.calls) == ["mail", "reports"]  # both were tried
    assert broken.committed(ids) == sorted(ids)


async def test_a_failing_notifier_never_fails_an_enqueue_that_committed(
    tasks: tuple[Task, Task], notifier: RecordingNotifier, app: App
) -> None:
    """An error after the commit would make the caller retry, and enqueue the task twice."""
    broken = BrokenNotifier(notifier.database)
    app.use_notifier(broken)
    mail, report = tasks
    first = mail.enqueue("sync")  # returns its id: the row is committed
    second = await report.aenqueue("async")
    assert broken.committed([first, second]) == sorted([first, second])
    assert [q for q, _, _ in broken.calls] == ["mail", "reports"]


async def test_without_a_broker_nothing_is_hooked(
    database: Path, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TXTASKS_BROKER_URL", raising=False)
    app = App("plain", database_url=f"sqlite:///{database}")
    try:
        assert isinstance(app.notifier, NullNotifier)
        mail = app.task(name="plain.mail", queue="mail")(lambda payload: None)
        with engine.connect() as conn:
            mail.enqueue_tx(conn, 1)
            assert PENDING_KEY not in conn.connection.info
            conn.commit()
        app.notify("mail")  # a no-op, no error
    finally:
        await app.aclose()


# ----------------------------------------------------------------------------- the message


def test_wakeup_encode_round_trips_and_caps_the_ids() -> None:
    body = wakeup_encode("mail", [1, 2, 3])
    assert json.loads(body) == {"queue": "mail", "ids": [1, 2, 3]}
    assert wakeup_decode(body) == ("mail", [1, 2, 3])
    many = wakeup_encode("mail", list(range(10 * MAX_IDS)))
    assert wakeup_decode(many) == ("mail", list(range(MAX_IDS)))
    assert len(many) <= MAX_MESSAGE_BYTES


@pytest.mark.parametrize(
    "body",
    [
        b'{"queue": "mail", "ids": [1, 2]}',
        b'{"queue": "mail"}',
        b'{"queue": "a.b:c-d_9", "ids": []}',
        b'{"queue": "mail", "ids": [1], "extra": "ignored"}',
        json.dumps({"queue": "q" * 128, "ids": list(range(MAX_IDS))}).encode(),
    ],
)
def test_wakeup_decode_accepts_good_messages(body: bytes) -> None:
    decoded = wakeup_decode(body)
    assert decoded is not None
    assert decoded == (json.loads(body)["queue"], json.loads(body).get("ids", []))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\xff\xfe\x00garbage", id="not_utf8"),
        pytest.param(b"{not json", id="not_json"),
        pytest.param(b'["mail", [1]]', id="a_list"),
        pytest.param(b'"mail"', id="a_string"),
        pytest.param(b"null", id="null"),
        pytest.param(b"42", id="a_number"),
        pytest.param(b'{"ids": [1]}', id="no_queue"),
        pytest.param(b'{"queue": 7, "ids": [1]}', id="queue_not_a_string"),
        pytest.param(b'{"queue": "", "ids": [1]}', id="empty_queue"),
        pytest.param(b'{"queue": "has space", "ids": [1]}', id="bad_queue_name"),
        pytest.param(b'{"queue": "../../etc", "ids": [1]}', id="queue_with_slash"),
        pytest.param(json.dumps({"queue": "q" * 129}).encode(), id="queue_too_long"),
        pytest.param(b'{"queue": "mail", "ids": "1,2"}', id="ids_not_a_list"),
        pytest.param(b'{"queue": "mail", "ids": {"1": 2}}', id="ids_a_dict"),
        pytest.param(b'{"queue": "mail", "ids": [1, "2"]}', id="id_a_string"),
        pytest.param(b'{"queue": "mail", "ids": [1.5]}', id="id_a_float"),
        pytest.param(b'{"queue": "mail", "ids": [null]}', id="id_null"),
        pytest.param(b'{"queue": "mail", "ids": [true]}', id="id_a_bool"),
        pytest.param(b'{"queue": "mail", "ids": [[1]]}', id="id_a_list"),
        pytest.param(
            json.dumps({"queue": "mail", "ids": list(range(MAX_IDS + 1))}).encode(),
            id="too_many_ids",
        ),
        pytest.param(
            json.dumps({"queue": "mail", "ids": [], "pad": "x" * MAX_MESSAGE_BYTES}).encode(),
            id="too_large",
        ),
        pytest.param(b" " * (MAX_MESSAGE_BYTES + 1), id="too_large_whitespace"),
    ],
)
def test_wakeup_decode_rejects_malformed_messages(body: bytes) -> None:
    assert wakeup_decode(body) is None


def test_a_cancel_wakeup_says_so_and_older_messages_read_as_ordinary_ones() -> None:
    cancel = wakeup_encode("mail", [4], cancel=True)
    assert json.loads(cancel) == {"queue": "mail", "ids": [4], "kind": "cancel"}
    assert wakeup_read(cancel) == Wakeup("mail", [4], cancel=True)
    assert wakeup_decode(cancel) == ("mail", [4])  # an older reader: an ordinary wake-up
    # messages of older publishers (no kind), and kinds this version does not know
    assert wakeup_read(b'{"queue": "mail", "ids": [1]}') == Wakeup("mail", [1], cancel=False)
    assert wakeup_read(b'{"queue": "mail", "kind": "later"}') == Wakeup("mail", [], cancel=False)
    assert wakeup_read(b'{"queue": "mail", "kind": 1}') is None  # not a kind: malformed


def test_wakeup_decode_never_raises_on_deep_nesting() -> None:
    deep = b"[" * 5000 + b"]" * 5000  # under the size limit, deeper than the recursion limit
    assert len(deep) <= MAX_MESSAGE_BYTES
    assert wakeup_decode(deep) is None


# ----------------------------------------------------------------------------- configuration


def test_notifier_for_url() -> None:
    assert isinstance(notifier_for_url(None), NullNotifier)
    assert isinstance(notifier_for_url(""), NullNotifier)
    with pytest.raises(ConfigurationError, match="broker_url") as info:
        notifier_for_url("http://x")
    assert "http://x" in str(info.value) or "'x'" in str(info.value)
    with pytest.raises(ConfigurationError, match="broker_url") as info:
        notifier_for_url("redis://user:s3cret@cache:6379/0")
    assert "s3cret" not in str(info.value)


async def test_app_broker_url_setting_and_environment(
    monkeypatch: pytest.MonkeyPatch, database: Path
) -> None:
    from txtasks.wakeup.amqp import AmqpNotifier

    monkeypatch.delenv("TXTASKS_BROKER_URL", raising=False)
    assert isinstance(App("none").notifier, NullNotifier)

    bad = App("bad", broker_url="http://x")
    with pytest.raises(ConfigurationError, match="broker_url"):
        bad.notifier  # noqa: B018 - the property builds the notifier

    configured = App("amqp", broker_url="amqp://app:app@127.0.0.1:1/")
    from_env = App("env")
    overridden = App("both", broker_url="http://ignored")
    try:
        assert isinstance(configured.notifier, AmqpNotifier)
        assert configured.notifier.url == "amqp://app:app@127.0.0.1:1/"
        # the environment applies when the application sets none; the code's setting beats it
        monkeypatch.setenv("TXTASKS_BROKER_URL", "amqp://env:env@127.0.0.1:2/")
        assert isinstance(from_env.notifier, AmqpNotifier)
        assert from_env.notifier.url == "amqp://env:env@127.0.0.1:2/"
        overridden.broker_url = "amqp://code:code@127.0.0.1:3/"
        assert overridden.notifier.url == "amqp://code:code@127.0.0.1:3/"  # type: ignore[attr-defined]
        # nothing connects before the first hint: building the notifier is free
        assert configured.notifier.stats == WakeupStats()
    finally:
        for app in (configured, from_env, overridden):
            await app.aclose()


async def test_the_null_notifier_does_nothing_and_never_fails() -> None:
    notifier: Notifier = NullNotifier()
    notifier.notify("mail", [1])
    notifier.notify("not even a valid queue name")
    await notifier.subscribe(["mail"], lambda queue, **_: None)
    await notifier.close()
    assert notifier.stats == WakeupStats()
