"""OpenTelemetry: a task continues the trace of the code that enqueued it.

With `pip install "txtasks[otel]"` (the OpenTelemetry API) and a tracer provider configured by
the application, enqueueing records the current trace context in the task's headers
(`traceparent`, `tracestate`: W3C Trace Context), and the worker runs each attempt inside a
`CONSUMER` span that is a child of it (`TracingMiddleware`, which workers put first in every
attempt's chain while a provider is configured). Without the API installed, or without a
provider, this module does nothing.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from txtasks.middleware import AttemptEnd, Middleware

if TYPE_CHECKING:
    from txtasks.types import TaskRow
    from txtasks.worker.context import TaskContext


def _api() -> tuple[ModuleType, ModuleType] | None:
    """OpenTelemetry's `trace` and `propagate`, if the application imported the API: a tracer
    provider can only have been set by code that did. Nothing is imported otherwise."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    try:
        from opentelemetry import propagate, trace
    except ImportError:  # pragma: no cover - a partial install
        return None
    return trace, propagate


TRACER = "txtasks"


def enabled() -> bool:
    """True when the application configured a tracer provider (the API alone does nothing).

    Asked per task: the API keeps the global provider in `_TRACER_PROVIDER` (None until set);
    reading it costs nothing, unlike `get_tracer_provider()`.
    """
    api = _api()
    if api is None:
        return False
    trace = api[0]
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:  # an API without that attribute: ask it properly
        provider = trace.get_tracer_provider()
    return provider is not None and type(provider) not in (
        trace.ProxyTracerProvider,
        trace.NoOpTracerProvider,
    )


_UNKNOWN = object()


def headers_with_trace(headers: dict[str, str] | None) -> dict[str, str] | None:
    """`headers` plus the current trace context, when there is one to carry."""
    api = _api()
    if api is None or not enabled():
        return headers
    carrier: dict[str, str] = {}
    api[1].inject(carrier)
    if not carrier:
        return headers
    return {**carrier, **(headers or {})}


@contextlib.contextmanager
def attempt_span(row: TaskRow, headers: dict[str, str]) -> Iterator[Any]:
    """A span around one attempt, a child of the enqueuer's span when the task carries one."""
    api = _api()
    if api is None:
        yield None
        return
    trace, propagate = api
    from opentelemetry.trace import SpanKind

    parent = propagate.extract(headers)
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span(
        f"txtasks run {row.task_name}",
        context=parent,
        kind=SpanKind.CONSUMER,
        record_exception=False,
        set_status_on_exception=False,
        attributes={
            "messaging.system": "txtasks",
            "messaging.destination.name": row.queue,
            "messaging.operation.type": "process",
            "txtasks.task.id": row.id,
            "txtasks.task.name": row.task_name,
            "txtasks.task.attempt": row.attempt,
        },
    ) as span:
        yield span


def span_failed(span: Any, exc: BaseException) -> None:
    """Mark the attempt's span failed with the handler's exception."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


#: Where `TracingMiddleware` keeps an attempt's span in `ctx.extra`.
SPAN_KEY = "txtasks.span"


class TracingMiddleware(Middleware):
    """Runs each attempt in `attempt_span`: the span is current from `before_attempt` to
    `after_attempt`, so the hooks after it, the handler (sync ones in their thread too) and
    what they trace are inside it; it is marked failed with what the handler raised."""

    def before_attempt(self, ctx: TaskContext) -> None:
        api = _api()
        if api is None:
            return
        try:
            headers = ctx.headers
        except ValueError:
            headers = {}
        span_cm = attempt_span(ctx.row, headers)
        ctx.extra[SPAN_KEY] = (span_cm, span_cm.__enter__())

    def after_attempt(self, ctx: TaskContext, end: AttemptEnd) -> None:
        found = ctx.extra.pop(SPAN_KEY, None) if ctx._extra else None
        if found is None:
            return
        span_cm, span = found
        if end.exception is not None:
            span_failed(span, end.exception)
        span_cm.__exit__(None, None, None)


#: The one instance workers use.
TRACING = TracingMiddleware()
