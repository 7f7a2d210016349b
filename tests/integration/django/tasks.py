"""The txtasks App of the Django test project (TXTASKS_APP)."""

from __future__ import annotations

from typing import Any

from tests.recording import Recording
from txtasks import App

recording = Recording()
app = App("django-test", notifier=recording)  # type: ignore[arg-type]
sent: list[Any] = []


@app.task(name="send", queue="emails")
def send(payload: Any) -> None:
    sent.append(payload)
