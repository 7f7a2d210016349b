"""Testing code that enqueues inside its own transaction, on a throwaway SQLite file."""

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, insert
from sqlalchemy.exc import IntegrityError

from txtasks import App, create_engine, driver_for_url
from txtasks.testing import run_until_empty

# The application under test; normally imported from your package.
metadata = MetaData()
users = Table(
    "users",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("email", String(255), nullable=False, unique=True),
)
app = App("accounts", database_url="postgresql://db.internal/accounts")
welcomed: list[str] = []


@app.task(name="emails.welcome")
def send_welcome(payload: dict) -> None:
    welcomed.append(payload["email"])


def sign_up(engine: Engine, email: str) -> None:
    """Code under test: the user and the welcome e-mail commit together."""
    with engine.begin() as conn:
        send_welcome.enqueue_tx(conn, {"email": email})
        conn.execute(insert(users).values(email=email))


@pytest_asyncio.fixture
async def engine(tmp_path) -> AsyncIterator[Engine]:
    url = f"sqlite:///{tmp_path / 'test.sqlite3'}"
    app.use_driver(driver_for_url(url))  # the worker reads tasks from the test database
    await app.amigrate()  # the txtasks tables
    engine = create_engine(url)  # SQLAlchemy's, set up for SQLite as txtasks needs
    metadata.create_all(engine)
    welcomed.clear()
    yield engine
    engine.dispose()
    await app.aclose()


@pytest.mark.asyncio
async def test_sign_up_sends_a_welcome(engine: Engine) -> None:
    sign_up(engine, "ada@example.com")

    stats = await run_until_empty(app)

    assert stats.outcomes == {"completed": 1}
    assert welcomed == ["ada@example.com"]


@pytest.mark.asyncio
async def test_failed_sign_up_sends_nothing(engine: Engine) -> None:
    sign_up(engine, "ada@example.com")
    with pytest.raises(IntegrityError):
        sign_up(engine, "ada@example.com")  # duplicate e-mail: the transaction rolls back

    stats = await run_until_empty(app)

    assert stats.claimed == 1  # only the first sign-up's task ever existed
    assert welcomed == ["ada@example.com"]
