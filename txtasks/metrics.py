"""Prometheus metrics of workers and the cleaner, served on an optional port.

    txtasks worker APP --metrics-port 9100
    txtasks cleaner APP --metrics-port 9101

Workers count claims and outcomes per queue and task, time handlers, and export their
wake-up counters; the cleaner counts sweep passes and what they changed, and exports queue
depth, the ready backlog, the age of the oldest ready task and the rates of arrival and
completion per queue (refreshed by its `stats` sweep): what an autoscaler reads. Each process has
its own `Metrics` on its own registry, so two in one process never collide.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from txtasks.errors import cannot_listen
from txtasks.middleware import AttemptEnd, Middleware
from txtasks.types import KeyStats, OutcomeKind, Progress, QueueRates, QueueStats
from txtasks.wakeup import WakeupStats

if TYPE_CHECKING:
    from txtasks.worker.context import TaskContext

log = logging.getLogger("txtasks.metrics")

_RELEASE = OutcomeKind.RELEASE
#: Handler duration buckets, in seconds.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class WakeupCollector(Collector):
    """Reads a notifier's counters at scrape time."""

    def __init__(self, stats: WakeupStats) -> None:
        self.stats = stats

    def collect(self) -> Iterable[Any]:
        stats = self.stats
        for name, value, text in (
            ("txtasks_wakeups_received", stats.received, "Wake-ups received"),
            ("txtasks_wakeups_published", stats.published, "Wake-ups published"),
            ("txtasks_wakeups_dropped", stats.dropped, "Wake-ups dropped (buffer full)"),
            ("txtasks_wakeups_malformed", stats.malformed, "Malformed wake-ups ignored"),
        ):
            yield CounterMetricFamily(name, text, value=value)
        yield GaugeMetricFamily(
            "txtasks_broker_connected",
            "1 while the wake-up subscriber is connected to the broker",
            value=1 if stats.connected else 0,
        )


class MetricsMiddleware(Middleware):
    """Counts each attempt's outcome and times it (`txtasks_tasks_finished`,
    `txtasks_handler_seconds`): what a worker with metrics puts first in every attempt's
    chain. An attempt handed back at shutdown counts as `pending`, without a duration."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def after_attempt(self, ctx: TaskContext, end: AttemptEnd) -> None:
        kind = end.outcome.kind
        seconds = None if kind is _RELEASE else end.seconds
        row = ctx.row
        self.metrics.task_finished(row.queue, row.task_name, kind._value_, seconds)


class Metrics:
    """The metrics of one worker or cleaner process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.claimed = Counter(
            "txtasks_tasks_claimed", "Tasks claimed", ["queue", "task"], registry=r
        )
        self.finished = Counter(
            "txtasks_tasks_finished",
            "Attempts ended, by outcome (completed, retryable, dead, discarded, failed, pending)",
            ["queue", "task", "outcome"],
            registry=r,
        )
        self.concurrency = Gauge(
            "txtasks_worker_concurrency",
            "Tasks the worker allows itself to run at once now (its given concurrency, or what "
            "an adaptive worker has grown to with the backlog)",
            registry=r,
        )
        self.duration = Histogram(
            "txtasks_handler_seconds",
            "Handler run time",
            ["queue", "task"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.sweeps = Counter(
            "txtasks_sweep_passes", "Cleaner sweep passes", ["sweep", "ok"], registry=r
        )
        self.sweep_rows = Counter(
            "txtasks_sweep_changes",
            "What cleaner sweeps changed, by counter (retried, dead, fired, purged.completed, ...)",
            ["sweep", "counter"],
            registry=r,
        )
        self.depth = Gauge(
            "txtasks_queue_tasks", "Tasks per queue and state", ["queue", "state"], registry=r
        )
        self.oldest = Gauge(
            "txtasks_queue_oldest_ready_seconds",
            "Age of the oldest ready task per queue (0 when none is ready)",
            ["queue"],
            registry=r,
        )
        self.ready = Gauge(
            "txtasks_queue_ready_tasks",
            "Tasks ready to start now per queue (pending or retryable, and due): the backlog",
            ["queue"],
            registry=r,
        )
        self.paused = Gauge(
            "txtasks_queue_paused",
            "1 while the queue is paused (its ready tasks wait for a resume, not for workers)",
            ["queue"],
            registry=r,
        )
        self.enqueued_rate = Gauge(
            "txtasks_queue_enqueued_per_second",
            "Tasks enqueued per second per queue, over the stats sweep's window (60 s)",
            ["queue"],
            registry=r,
        )
        self.finished_rate = Gauge(
            "txtasks_queue_finished_per_second",
            "Tasks finished (archived) per second per queue and final state, over the window",
            ["queue", "state"],
            registry=r,
        )
        self.key_depth = Gauge(
            "txtasks_key_tasks",
            "Tasks waiting (due) and processing of the busiest keys (see `keys_seen`)",
            ["queue", "key", "state"],
            registry=r,
        )
        self.key_limited = Gauge(
            "txtasks_key_rate_limited",
            "1 while a busiest key waits for its rate to allow the next start",
            ["queue", "key"],
            registry=r,
        )
        self.progress_reports = Counter(
            "txtasks_progress_reports",
            "Progress reports of running attempts (ctx.progress)",
            ["queue", "task"],
            registry=r,
        )
        self.progress = Gauge(
            "txtasks_task_progress_ratio",
            "done / total of the latest progress report with a total, per task name",
            ["queue", "task"],
            registry=r,
        )
        self._children: dict[tuple[str, ...], Any] = {}
        self._seen: dict[str, set[tuple[str, ...]]] = {}
        self._port: int | None = None
        #: The middleware a worker runs every attempt in (`MetricsMiddleware`).
        self.middleware = MetricsMiddleware(self)

    # -- workers ------------------------------------------------------------------------------

    def task_claimed(self, queue: str, task: str) -> None:
        self._child(self.claimed, (queue, task)).inc()

    def task_finished(self, queue: str, task: str, outcome: str, seconds: float | None) -> None:
        self._child(self.finished, (queue, task, outcome)).inc()
        if seconds is not None:
            self._child(self.duration, (queue, task)).observe(seconds)

    def task_progress(self, queue: str, task: str, report: Progress) -> None:
        self._child(self.progress_reports, (queue, task)).inc()
        fraction = report.fraction
        if fraction is not None:
            self._child(self.progress, (queue, task)).set(fraction)

    def watch_wakeups(self, stats: WakeupStats) -> None:
        """Export a notifier's counters (once per process)."""
        self.registry.register(WakeupCollector(stats))

    # -- the cleaner --------------------------------------------------------------------------

    def sweep_passed(self, sweep: str, ok: bool, fields: Mapping[str, Any] | None) -> None:
        self._child(self.sweeps, (sweep, "true" if ok else "false")).inc()
        for counter, value in _flat(fields or {}):
            if value:
                self._child(self.sweep_rows, (sweep, counter)).inc(value)

    def queues_seen(self, stats: Iterable[QueueStats]) -> None:
        """Depth, backlog, oldest ready age and paused now; series not seen this time read 0."""
        depth: dict[tuple[str, ...], float] = {}
        per_queue: dict[tuple[str, ...], QueueStats] = {}
        for queue in stats:
            per_queue[(queue.queue,)] = queue
            for state, count in queue.counts.items():
                depth[(queue.queue, state)] = count
        self._gauge_set(self.depth, depth)
        self._gauge_set(self.ready, {k: q.ready for k, q in per_queue.items()})
        self._gauge_set(
            self.paused, {k: int(q.paused_at is not None) for k, q in per_queue.items()}
        )
        self._gauge_set(self.oldest, {k: q.oldest_ready_age or 0.0 for k, q in per_queue.items()})

    def rates_seen(self, rates: Iterable[QueueRates]) -> None:
        """Arrival and finish rates per queue over the window; series not seen read 0."""
        enqueued: dict[tuple[str, ...], float] = {}
        finished: dict[tuple[str, ...], float] = {}
        for r in rates:
            enqueued[(r.queue,)] = r.enqueued_per_second
            for state, count in r.finished.items():
                finished[(r.queue, state)] = count / r.window
        self._gauge_set(self.enqueued_rate, enqueued)
        self._gauge_set(self.finished_rate, finished)

    def keys_seen(self, stats: Iterable[KeyStats]) -> None:
        """The busiest keys now: series of keys no longer among them go (bounded labels)."""
        self.key_depth.clear()
        self.key_limited.clear()
        for k in stats:
            self.key_depth.labels(k.queue, k.key, "waiting").set(k.waiting)
            self.key_depth.labels(k.queue, k.key, "processing").set(k.processing)
            self.key_limited.labels(k.queue, k.key).set(int(k.rate_limited_until is not None))

    # -- serving ------------------------------------------------------------------------------

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Serve /metrics on `port` (0: any free port); returns the port."""
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:  # the port is taken, or the address is not this host's
            raise cannot_listen("metrics", host, port, "--metrics-port", exc) from exc
        self._port = int(server.server_address[1])
        log.info("metrics on http://%s:%d/metrics", host, self._port)
        return self._port

    def _gauge_set(self, gauge: Gauge, values: Mapping[tuple[str, ...], float]) -> None:
        """Set a gauge's series to `values`; those set before and missing now read 0 (never
        removed, so a scrape never sees a series vanish for a moment)."""
        seen = self._seen.setdefault(gauge._name, set())
        for labels in seen - values.keys():
            gauge.labels(*labels).set(0)
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
        seen.update(values)

    def _child(self, metric: Any, labels: tuple[str, ...]) -> Any:
        key = (metric._name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child


def _flat(fields: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, float]]:
    for key, value in fields.items():
        if isinstance(value, Mapping):
            yield from _flat(value, f"{prefix}{key}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield f"{prefix}{key}", float(value)
