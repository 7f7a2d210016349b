"""OpenTelemetry: one trace from the span that enqueued a task to the worker's span around
its handler, with the SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from txtasks import App, AttemptEnd, Middleware, TaskContext
from txtasks.driver import MemoryDriver
from txtasks.payload import headers_decode
from txtasks.testing import enqueued, run_until_empty

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> Iterator[None]:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(tracer_provider)
    yield


@pytest.fixture(autouse=True)
def clean() -> None:
    EXPORTER.clear()


def make_app(seen: dict[str, Any]) -> App:
    app = App("traced", driver=MemoryDriver())

    @app.task(name="traced.async")
    async def run_async(payload: Any) -> None:
        seen["async"] = trace.get_current_span().get_span_context()

    @app.task(name="traced.sync")
    def run_sync(payload: Any) -> None:  # in the worker's thread pool
        seen["sync"] = trace.get_current_span().get_span_context()

    @app.task(name="traced.fails", max_attempts=1)
    async def fails(payload: Any) -> None:
        raise ValueError("no stock")

    return app


async def test_the_worker_span_continues_the_enqueuers_trace() -> None:
    seen: dict[str, Any] = {}
    app = make_app(seen)
    tracer = trace.get_tracer("shop")
    with tracer.start_as_current_span("POST /orders") as request:
        await app.aenqueue("traced.async", {"order": 1})
        app.enqueue("traced.sync", {"order": 1})
    headers = headers_decode(enqueued(app)[0].headers)
    assert headers["traceparent"].split("-")[1] == format(
        request.get_span_context().trace_id, "032x"
    )

    await run_until_empty(app)

    spans = {s.name: s for s in EXPORTER.get_finished_spans()}
    origin = spans["POST /orders"].context
    for name in ("async", "sync"):
        span = spans[f"txtasks run traced.{name}"]
        assert span.kind is SpanKind.CONSUMER
        assert span.parent is not None and span.parent.span_id == origin.span_id
        assert span.context.trace_id == origin.trace_id
        assert seen[name].span_id == span.context.span_id  # the handler runs inside it
        assert span.attributes is not None
        assert span.attributes["messaging.destination.name"] == "default"
        assert span.attributes["txtasks.task.attempt"] == 1


async def test_a_failed_attempt_marks_its_span_and_untraced_enqueues_carry_nothing() -> None:
    app = make_app({})
    await app.aenqueue("traced.fails")  # no span is active: nothing to carry
    assert enqueued(app)[0].headers is None

    await run_until_empty(app)

    [span] = [s for s in EXPORTER.get_finished_spans() if s.name == "txtasks run traced.fails"]
    assert span.parent is None
    assert span.status.status_code is StatusCode.ERROR
    assert "no stock" in (span.status.description or "")
    assert [e.name for e in span.events] == ["exception"]


async def test_a_callers_own_traceparent_header_wins() -> None:
    app = make_app({})
    own = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    with trace.get_tracer("shop").start_as_current_span("request"):
        await app.aenqueue("traced.async", None, headers={"traceparent": own})
    assert headers_decode(enqueued(app)[0].headers)["traceparent"] == own


async def test_tracing_is_the_first_middleware_of_every_attempt() -> None:
    """The attempt's span is current in the application's middleware and ends after them; the
    handler's worker leaves no trace context behind for the next attempt."""
    seen: dict[str, Any] = {}

    class Spy(Middleware):
        def before_attempt(self, ctx: TaskContext) -> None:
            seen.setdefault("before", []).append(trace.get_current_span().get_span_context())

        def after_attempt(self, ctx: TaskContext, end: AttemptEnd) -> None:
            seen.setdefault("after", []).append(trace.get_current_span().get_span_context())

    app = make_app(seen)
    app.middleware(Spy())
    await app.aenqueue("traced.async", {"order": 1})
    await app.aenqueue("traced.fails")

    await run_until_empty(app)

    spans = {s.name: s.context for s in EXPORTER.get_finished_spans()}
    attempts = [spans["txtasks run traced.async"], spans["txtasks run traced.fails"]]
    assert [c.span_id for c in seen["before"]] == [c.span_id for c in attempts]
    assert [c.span_id for c in seen["after"]] == [c.span_id for c in attempts]
    assert seen["async"].span_id == attempts[0].span_id
    assert not trace.get_current_span().get_span_context().is_valid
