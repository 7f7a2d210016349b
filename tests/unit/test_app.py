import logging
from datetime import datetime, timedelta, timezone

import pytest

from txtasks import App, ConfigurationError, MemoryDriver, PayloadError, Rate, UnknownTaskError
from txtasks.driver.urls import url_async, url_parse, url_sync

NOW = datetime(2030, 1, 1, 12, 0, 0)


def make_app(**options: object) -> App:
    return App(driver=MemoryDriver(), clock=lambda: NOW, **options)  # type: ignore[arg-type]


def test_decorator_forms_and_defaults() -> None:
    app = make_app()

    @app.task
    def plain(payload: object) -> None: ...

    @app.task(name="custom", queue="mail", max_attempts=2, priority=5, timeout=timedelta(seconds=3))
    async def with_ctx(payload: object, ctx: object) -> None: ...

    assert plain.name.endswith("test_decorator_forms_and_defaults.<locals>.plain")
    assert (plain.options.queue, plain.is_async, plain.wants_context) == ("default", False, False)
    assert with_ctx.options.queue == "mail"
    assert with_ctx.options.timeout == 3.0
    assert (with_ctx.is_async, with_ctx.wants_context) == (True, True)
    assert app.queues == ["default", "mail"]
    assert app.get_task("custom") is with_ctx


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": "no spaces"}, "queue"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"timeout": -1}, "timeout"),
        ({"ack_policy": "sometimes"}, "ack_policy"),
        ({"name": ""}, "task name"),
        ({"retires": 3}, r"unknown setting\(s\) \['retires'\]; known: ack_policy, deadline"),
        ({"key": "customer"}, "key must be a function of the payload"),
        ({"key_limits": {"concurrency": 1}}, "expected KeyLimits"),
    ],
)
def test_bad_task_options_name_the_setting(options: dict[str, object], message: str) -> None:
    app = make_app()
    with pytest.raises(ConfigurationError, match=message):
        app.task(**options)(lambda payload: None)  # type: ignore[call-overload]


def test_duplicate_names_and_unknown_tasks() -> None:
    app = make_app()
    app.task(name="one")(lambda payload: None)
    with pytest.raises(ConfigurationError, match="already registered"):
        app.task(name="one")(lambda payload: None)
    with pytest.raises(UnknownTaskError, match="'two'"):
        app.get_task("two")


def test_new_task_options() -> None:
    app = make_app()
    task = app.task(name="t", priority=3, deadline=60)(lambda payload: None)
    row = task.new({"a": 1}, delay=5, dedup_key="k", headers={"h": "v"})
    assert row.run_at == NOW + timedelta(seconds=5)
    assert (row.priority, row.dedup_key, row.headers) == (3, "k", '{"h":"v"}')
    assert row.expires_at == row.run_at + timedelta(seconds=60)  # counted from when it is due
    aware = datetime(2030, 1, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    assert task.new(None, run_at=aware, priority=-1).run_at == NOW
    assert task.new(None, queue="other").queue == "other"


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"delay": 1, "run_at": NOW}, ConfigurationError, "not both"),
        ({"delay": -1}, ConfigurationError, "delay"),
        ({"dedup_key": "x" * 256}, ConfigurationError, "dedup_key"),
        ({"priority": "high"}, ConfigurationError, "priority"),
        ({"queue": "a b"}, ConfigurationError, "queue"),
        ({"headers": {"a": 1}}, PayloadError, "headers"),
        ({"key": ""}, ConfigurationError, "enqueue: key"),
        ({"dealy": 5}, ConfigurationError, r"enqueue: unknown option\(s\) \['dealy'\]; known: "),
    ],
)
def test_bad_enqueue_options(options: dict[str, object], error: type, message: str) -> None:
    app = make_app()
    task = app.task(name="t")(lambda payload: None)
    with pytest.raises(error, match=message):
        task.new(None, **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": "other"}, "publish: queue is not an option of a publish"),
        ({"dedup_key": "x" * 127}, "publish: dedup_key must be 1-126 bytes"),
        ({"delay": 1, "run_at": NOW}, "publish: give delay or run_at, not both"),
        ({"key": ""}, "publish: key"),
        ({"prio": 1}, r"publish: unknown option\(s\) \['prio'\]"),
    ],
)
def test_bad_publish_options_name_the_option(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        make_app().topics.new_publish("orders.created", None, **options)  # type: ignore[arg-type]


def test_oversized_payload_is_refused_with_the_limit() -> None:
    app = make_app(max_payload_bytes=16)
    task = app.task(name="t")(lambda payload: None)
    with pytest.raises(PayloadError, match="16 bytes"):
        task.enqueue("x" * 100)
    assert app.driver.store.live == {}  # type: ignore[attr-defined]


def test_database_url_precedence(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The flag, then the code, then the environment; one line when code and environment
    name different databases, never a silent switch."""
    app = App(database_url="postgresql://app:secret@db/app")
    monkeypatch.delenv("TXTASKS_DATABASE_URL", raising=False)
    assert app.resolve_database_url() == "postgresql://app:secret@db/app"
    monkeypatch.setenv("TXTASKS_DATABASE_URL", "sqlite:///env.db")
    with caplog.at_level(logging.WARNING, "txtasks"):
        assert app.resolve_database_url() == "postgresql://app:secret@db/app"
        assert app.resolve_database_url() == "postgresql://app:secret@db/app"
    told = [r.getMessage() for r in caplog.records]
    assert len(told) == 1, told  # once, not at every use
    assert "postgresql://app:***@db/app given in code is used" in told[0]
    assert "TXTASKS_DATABASE_URL=sqlite:///env.db" in told[0] and "secret" not in told[0]
    assert App().resolve_database_url() == "sqlite:///env.db"
    assert app.resolve_database_url("sqlite:///flag.db") == "sqlite:///flag.db"


def test_missing_database_url_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TXTASKS_DATABASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="database_url: not set"):
        App().driver  # noqa: B018


def test_urls_pick_drivers_and_reject_unknown_schemes() -> None:
    assert url_async("postgres://u@h/db").drivername == "postgresql+asyncpg"
    assert url_sync("postgresql+asyncpg://u@h/db").drivername == "postgresql+psycopg"
    assert url_async("mariadb://u@h/db").drivername == "mysql+aiomysql"
    assert url_sync("sqlite:///x.db").drivername == "sqlite+pysqlite"
    with pytest.raises(ConfigurationError, match="database_url: unsupported database 'oracle'"):
        url_parse("oracle://u:secret@h/db")
    with pytest.raises(ConfigurationError, match="database_url: cannot parse"):
        url_parse("not a url")


def test_a_queue_rate_is_declared_once_per_queue() -> None:
    app = make_app()
    app.queue_rate("webhooks", Rate(100, per=60))
    app.queue_rate("webhooks", Rate(100, per=60))  # the same again is fine
    assert dict(app.declared_queue_rates) == {"webhooks": Rate(100, per=60)}
    with pytest.raises(ConfigurationError, match="already has Rate"):
        app.queue_rate("webhooks", Rate(10))
    with pytest.raises(ConfigurationError, match="queue_rate: expected a Rate, got '10/s'"):
        app.queue_rate("other", "10/s")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="queue_rate: queue"):
        app.queue_rate("", Rate(10))


def test_a_group_of_a_topic_is_one_task() -> None:
    app = make_app()
    app.task(name="audit", subscribe=["order.created"])(lambda payload: None)
    app.task(name="mail", subscribe=["order.created"], group="notify")(lambda payload: None)
    with pytest.raises(
        ConfigurationError, match=r"group 'notify' of topic 'order\.created' is already task mail's"
    ):
        app.task(name="sms", subscribe=["order.created"], group="notify")(lambda payload: None)
    app.task(name="push", subscribe=["order.paid"], group="notify")(lambda payload: None)
    assert [(s.topic, s.group, s.task_name) for s in app.subscriptions] == [
        ("order.created", "audit", "audit"),
        ("order.created", "notify", "mail"),
        ("order.paid", "notify", "push"),
    ]


MOVED_TO_TOPICS = [
    "asubscribe",
    "aunsubscribe",
    "new_publish",
    "publish_tx",
    "apublish_tx",
    "publish_many_tx",
    "apublish_many_tx",
    "publish",
    "apublish",
    "publish_many",
    "apublish_many",
]


@pytest.mark.parametrize("name", MOVED_TO_TOPICS)
def test_topic_methods_on_app_forward_to_app_topics_with_a_warning(name: str) -> None:
    app = make_app()
    with pytest.warns(
        DeprecationWarning, match=rf"App\.{name} is deprecated; use app\.topics\.{name}$"
    ):
        moved = getattr(app, name)
    assert moved == getattr(app.topics, name)


async def test_a_publish_through_an_old_name_is_the_same_publish(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app()
    app.task(name="audit", subscribe=["order.created"])(lambda payload: None)
    assert await app.topics.asubscribe() == app.subscriptions
    with pytest.warns(DeprecationWarning, match=r"app\.topics\.apublish$"):
        [old] = await app.apublish("order.created", {"id": 1})
    [new] = await app.topics.apublish("order.created", {"id": 2})
    assert sorted(r.id for r in await app.driver.tasks.task_list()) == [old, new]
    with caplog.at_level("WARNING", logger="txtasks.topics"):
        for _ in range(2):
            assert app.topics.publish("nobody.listens", 1) == []
    assert [r.getMessage() for r in caplog.records] == [
        "topic nobody.listens has no subscriber: its publishes are dropped and counted "
        "(txtasks topics)"
    ]
