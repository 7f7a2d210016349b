"""A task's handler runs in a span that continues the trace of the code that enqueued it."""

import asyncio
import os
import tempfile

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from txtasks import App
from txtasks.testing import run_until_empty

DATABASE_URL = os.environ.get(
    "TXTASKS_DATABASE_URL", f"sqlite:///{tempfile.mkdtemp()}/example.sqlite3"
)

# Your application configures OpenTelemetry as usual; an in-memory exporter here.
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("shop")

app = App("shop", database_url=DATABASE_URL)


@app.task(name="orders.ship")
async def ship(payload: dict) -> None:
    with tracer.start_as_current_span("call the carrier"):  # a child of the task's span
        ...


async def main() -> None:
    await app.amigrate()
    with tracer.start_as_current_span("POST /orders"):
        await ship.aenqueue({"order": 7})  # the trace context goes into the task's headers
    await run_until_empty(app)  # the worker (usually another process) continues the trace
    await app.aclose()

    spans = {s.name: s for s in exporter.get_finished_spans()}
    request, run, carrier = (
        spans["POST /orders"],
        spans["txtasks run orders.ship"],
        spans["call the carrier"],
    )
    assert run.context.trace_id == request.context.trace_id
    assert run.parent.span_id == request.context.span_id
    assert carrier.parent.span_id == run.context.span_id


asyncio.run(main())
