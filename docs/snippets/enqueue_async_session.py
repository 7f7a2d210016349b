"""Enqueue on an AsyncSession: the ORM object and its task commit in one transaction."""

import asyncio
import os
import tempfile

from sqlalchemy import String
from sqlalchemy.ext.asyncio import async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from txtasks import App, TaskState, create_async_engine
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)


class Base(DeclarativeBase):
    pass


class Upload(Base):
    __tablename__ = "uploads"

    id: Mapped[int] = mapped_column(primary_key=True)
    filename: Mapped[str] = mapped_column(String(255))
    scanned: Mapped[bool] = mapped_column(default=False)


engine = create_async_engine(DATABASE_URL)
Sessions = async_sessionmaker(engine, expire_on_commit=False)

app = App("uploads", database_url=DATABASE_URL)


@app.task
async def scan_upload(payload: dict) -> None:
    async with Sessions() as session, session.begin():
        upload = await session.get(Upload, payload["upload_id"])
        assert upload is not None
        upload.scanned = True


async def main() -> None:
    await app.amigrate()
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)

    async with Sessions() as session, session.begin():
        upload = Upload(filename="report.pdf")
        session.add(upload)
        await session.flush()  # assigns upload.id inside the transaction
        task_id = await scan_upload.aenqueue_tx(session, {"upload_id": upload.id})

    await run_until_empty(app)
    row = await app.driver.tasks.task_get(task_id)
    assert row is not None and row.state is TaskState.COMPLETED
    async with Sessions() as session:
        assert (await session.get(Upload, upload.id)).scanned

    await app.aclose()
    await engine.dispose()


asyncio.run(main())
