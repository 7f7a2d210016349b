"""The throughput benchmark's report: the tables, the targets and the chart."""

from __future__ import annotations

import shlex
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.benchmarks.latency import machine_info, masked, versions

BACKENDS = ("postgresql", "mysql", "sqlite")
LABELS = {"postgresql": "PostgreSQL", "mysql": "MariaDB", "sqlite": "SQLite"}


def module_version(name: str) -> str | None:
    from importlib import metadata, util

    if util.find_spec(name) is None:
        return None
    return metadata.version(name)


@dataclass
class Series:
    """The measured runs of one case."""

    key: str
    label: str
    backend: str
    command: str = ""
    n: int = 0
    rates: list[float] = field(default_factory=list)
    costs: list[tuple[float, float, float]] = field(default_factory=list)
    #: CPU microseconds per task of the worker processes (start-up left out), or of the
    #: benchmark's own process for an enqueue.
    cpus: list[float] = field(default_factory=list)
    #: CPU microseconds per task of the database server's processes.
    server_cpus: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else float("nan")

    def add(
        self,
        rate: float,
        cpu: float | None,
        server_cpu: float | None,
        cost: tuple[float, float, float] | None = None,
    ) -> None:
        """One run's results."""
        self.rates.append(rate)
        if cpu is not None:
            self.cpus.append(cpu)
        if server_cpu is not None:
            self.server_cpus.append(server_cpu)
        if cost is not None:
            self.costs.append(cost)


@dataclass(frozen=True)
class Target:
    """A ratio of two cases' medians (keys `backend/a`, `backend/b`) against a bound."""

    backend: str
    what: str
    a: str
    b: str
    bound: float
    #: The ratio is of times per task (b's tasks/s over a's), which must stay at most `bound`;
    #: otherwise of tasks/s (a's over b's), which must reach at least `bound`.
    per_task_time: bool = False


#: The issue's targets for the burn-down.
BURN_TARGETS = (
    Target("postgresql", "txtasks defaults / raw limit", "txtasks/defaults", "raw", 0.5),
    Target("postgresql", "txtasks tuned / raw limit", "txtasks/tuned", "raw", 0.9),
    Target("postgresql", "txtasks tuned / PGQueuer tuned", "txtasks/tuned", "pgqueuer/tuned", 2.5),
    Target("mysql", "txtasks tuned / raw limit", "txtasks/tuned", "raw", 0.7),
    Target("sqlite", "txtasks tuned / raw limit", "txtasks/tuned", "raw", 0.7),
)
#: Ratios shown for the record, without a target (the bound is not used).
BURN_RECORD = (
    *(
        Target(
            b, "txtasks tuned without the archive / raw limit", "txtasks/tuned-no-archive", "raw", 0
        )
        for b in BACKENDS
    ),
    Target(
        "postgresql",
        "txtasks defaults / PGQueuer defaults",
        "txtasks/defaults",
        "pgqueuer/defaults",
        0,
    ),
)
#: Enqueue: one task per transaction, txtasks' time per task over the same INSERT by hand in
#: the same SQLAlchemy transaction's; bulk, txtasks' tasks/s over the driver's executemany's.
ENQUEUE_SINGLE = 1.3
ENQUEUE_BULK = 1.5


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


def fmt_range(values: Sequence[float]) -> str:
    return f"{fmt_rate(min(values))}-{fmt_rate(max(values))}" if values else "-"


def fmt_median(values: Sequence[float], digits: int = 1) -> str:
    return f"{statistics.median(values):,.{digits}f}" if values else "-"


def ratio(series: dict[str, Series], a: str, b: str) -> float | None:
    if a in series and b in series and series[a].rates and series[b].rates:
        return series[a].median / series[b].median
    return None


def target_ratio(series: dict[str, Series], target: Target) -> float | None:
    """The target's ratio of medians in `series`, None when a case is missing."""
    a, b = f"{target.backend}/{target.a}", f"{target.backend}/{target.b}"
    return ratio(series, b, a) if target.per_task_time else ratio(series, a, b)


def met(value: float, target: Target) -> str:
    """yes or NO, as latency.py's verdict says it."""
    ok = value <= target.bound if target.per_task_time else value >= target.bound
    return "yes" if ok else "NO"


def check(value: float, target: Target) -> str:
    sign = "≤" if target.per_task_time else "≥"
    return f"{target.what} {value:.2f}x {sign} {target.bound:g}x: {met(value, target)}"


def targets_block(series: dict[str, Series]) -> list[str]:
    """The burn-down targets, a line per backend, and the ratios kept for the record."""
    lines = []
    for backend in BACKENDS:
        checks = [
            check(value, t)
            for t in BURN_TARGETS
            if t.backend == backend and (value := target_ratio(series, t)) is not None
        ]
        if checks:
            lines.append(f"- {LABELS[backend]}, burn-down: " + "; ".join(checks))
    record = [
        f"{t.what}, {LABELS[t.backend]}: {value:.2f}x"
        for t in BURN_RECORD
        if (value := target_ratio(series, t)) is not None
    ]
    if record:
        lines.append("- For the record (no target): " + "; ".join(record))
    return lines


def enqueue_ratios(series: dict[str, Series]) -> list[str]:
    """The enqueue targets as a table, a row per backend."""
    rows = []
    for backend in BACKENDS:
        single = Target(
            backend, "single", "enqueue/single", "enqueue/single-raw-sa", ENQUEUE_SINGLE, True
        )
        bulk = Target(backend, "bulk", "enqueue/bulk", "enqueue/bulk-raw", ENQUEUE_BULK)
        cells = []
        for target in (single, bulk):
            value = target_ratio(series, target)
            cells += ["-", "-"] if value is None else [f"{value:.2f}x", met(value, target)]
        if cells != ["-"] * 4:
            rows.append(f"| {LABELS[backend]} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return [
        "| backend | one per transaction: txtasks / by hand, time per task "
        f"| ≤ {ENQUEUE_SINGLE:g}x | bulk: txtasks / executemany, tasks/s | ≥ {ENQUEUE_BULK:g}x |",
        "|---|---:|---|---:|---|",
        *rows,
    ]


def report(
    series: dict[str, Series],
    runs: int,
    info: dict[str, str],
    argv: Sequence[str],
    chart: Path | None,
) -> str:
    lines = ["## Burn-down (tasks/s, median of runs)", ""]
    lines += [
        "| backend | system | N | runs | tasks/s median | min-max | worker CPU us/task "
        "| server CPU us/task | commits/task | rows written/task | WAL bytes/task |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in series.values():
        if "/enqueue/" in s.key:
            continue
        if s.error:
            lines.append(f"| {LABELS[s.backend]} | {s.label} | | | failed: {s.error} | | | | | | |")
            continue
        cost = ["-", "-", "-"]
        if s.costs:
            cost = [fmt_median([c[i] for c in s.costs], 2) for i in range(2)]
            cost.append(fmt_median([c[2] for c in s.costs], 0))
        lines.append(
            f"| {LABELS[s.backend]} | {s.label} | {s.n:,} | {len(s.rates)} | "
            f"{fmt_rate(s.median)} | {fmt_range(s.rates)} | {fmt_median(s.cpus)} | "
            f"{fmt_median(s.server_cpus)} | {' | '.join(cost)} |"
        )
    lines += ["", "## Enqueue (tasks/s, median of runs)", ""]
    lines += [
        "| backend | path | tasks per run | tasks/s median | min-max | client CPU us/task "
        "| server CPU us/task |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for s in series.values():
        if "/enqueue/" not in s.key:
            continue
        value = f"failed: {s.error}" if s.error else fmt_rate(s.median)
        lines.append(
            f"| {LABELS[s.backend]} | {s.label} | {s.n:,} | {value} | {fmt_range(s.rates)} | "
            f"{fmt_median(s.cpus)} | {fmt_median(s.server_cpus)} |"
        )
    lines += ["", "## Targets (ratios of medians in this run)", ""]
    lines += targets_block(series)
    table = enqueue_ratios(series)
    if table:
        lines += ["", "Enqueue:", "", *table]
    single_pg = ratio(series, "postgresql/enqueue/single-raw", "postgresql/enqueue/single")
    if single_pg is not None:
        lines += [
            "",
            "For the record: one task per transaction, txtasks' time per task / asyncpg "
            f"alone's (BEGIN, INSERT, COMMIT) on PostgreSQL: {single_pg:.2f}x.",
        ]
    lines += ["", "## Commands", ""]
    for s in series.values():
        if s.command:
            lines.append(f"- {s.label}: `{masked(s.command)}`")
    lines += ["", "## Machine and versions", ""]
    lines += [f"- {line}" for line in machine_info()]
    lines += [f"- {name}: {value}" for name, value in {**versions(), **info}.items()]
    for extra in ("pgqueuer", "procrastinate", "psycopg", "uvloop"):
        version = module_version(extra)
        if version:
            lines.append(f"- {extra}: {version}")
    lines.append(f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    lines.append(
        f"- Command: `{masked(shlex.join(['python', '-m', 'tests.benchmarks.throughput', *argv]))}`"
    )
    if chart is not None:
        lines.append(f"- Chart: `{chart}`")
    return "\n".join(lines) + "\n"


def draw_chart(series: dict[str, Series], path: Path) -> None:
    """Two panels: burn-down and enqueue, medians with min-max whiskers (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    burn = [s for s in series.values() if "/enqueue/" not in s.key and s.rates]
    enq = [s for s in series.values() if "/enqueue/" in s.key and s.rates]
    fig, axes = plt.subplots(
        2,
        1,
        figsize=(10, 0.42 * (len(burn) + len(enq)) + 2.2),
        height_ratios=[len(burn) or 1, len(enq) or 1],
    )
    for ax, group, title in (
        (axes[0], burn, "Burn-down: no-op tasks/s"),
        (axes[1], enq, "Enqueue: tasks/s"),
    ):
        names = [f"{LABELS[s.backend]}: {s.label}" for s in group]
        medians = [s.median for s in group]
        low = [s.median - min(s.rates) for s in group]
        high = [max(s.rates) - s.median for s in group]
        colors = ["#1f77b4" if "txtasks" in s.label else "#999999" for s in group]
        ax.barh(range(len(group)), medians, xerr=[low, high], color=colors, capsize=3)
        ax.set_yticks(range(len(group)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")  # procrastinate and the raw limit are 100x apart
        if medians:
            ax.set_xlim(min(min(s.rates) for s in group) / 2, max(max(s.rates) for s in group) * 3)
        ax.set_title(title + " (log scale)", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        for i, value in enumerate(medians):
            ax.text(value, i, f" {value:,.0f}", va="center", fontsize=7)
    fig.suptitle(
        "txtasks throughput (median of runs, min-max whiskers); grey: other systems", fontsize=10
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
