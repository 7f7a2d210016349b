"""The same reads from synchronous code: inspect one task, list tasks."""

import os
import tempfile

from txtasks import App, TaskState, migrate

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

app = App("control", database_url=DATABASE_URL)


@app.task(queue="reports")
def report(payload: dict) -> None: ...


migrate(DATABASE_URL)
first = report.enqueue({"month": "2030-01"}, key="customer:42")
second = report.enqueue({"month": "2030-02"}, key="customer:42")
app.control.cancel(first)

row = app.control.inspect(second)  # live or archived, by id
assert row is not None and row.state is TaskState.PENDING
assert app.control.inspect(10**9) is None  # no such task

waiting = app.control.task_list(queue="reports", key="customer:42")  # live tasks by default
assert [t.id for t in waiting] == [second]
done = app.control.task_list(states=["cancelled"], task=report)  # from the archive
assert [t.id for t in done] == [first]
