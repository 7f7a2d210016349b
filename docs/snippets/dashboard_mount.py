"""Mount the dashboard under /tasks of an ASGI application of your own."""

import asyncio
import os
import tempfile

import httpx
from starlette.applications import Starlette
from starlette.routing import Mount

import txtasks
from txtasks import App
from txtasks.web import create_app

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)
txtasks.migrate(DATABASE_URL)

app = App("shop", database_url=DATABASE_URL)


@app.task(queue="emails")
def send(payload: str) -> None: ...


send.enqueue("welcome")

# your own application, with the dashboard under /tasks (read-only here: no action is shown)
web = Starlette(routes=[Mount("/tasks", create_app(app, read_only=True))])


async def main() -> None:  # serve `web` with uvicorn; here a request goes to it directly
    transport = httpx.ASGITransport(app=web)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        page = await client.get("/tasks/")
    assert page.status_code == 200
    assert 'data-queue="emails"' in page.text
    await app.aclose()


asyncio.run(main())
