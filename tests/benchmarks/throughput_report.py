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
    #: CPU microseconds per task of the worker processes, start-up left out.
    cpus: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else float("nan")


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


def fmt_range(values: Sequence[float]) -> str:
    return f"{fmt_rate(min(values))}-{fmt_rate(max(values))}" if values else "-"


def ratio(series: dict[str, Series], a: str, b: str) -> float | None:
    if a in series and b in series and series[a].rates and series[b].rates:
        return series[a].median / series[b].median
    return None


def report(
    series: dict[str, Series],
    runs: int,
    info: dict[str, str],
    argv: Sequence[str],
    chart: Path | None,
) -> str:
    lines = ["## Burn-down (tasks/s, median of runs)", ""]
    lines += [
        "| backend | system | N | runs | tasks/s median | min-max | worker CPU us/task | commits/task | rows written/task | WAL bytes/task |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in series.values():
        if "/enqueue/" in s.key:
            continue
        if s.error:
            lines.append(f"| {LABELS[s.backend]} | {s.label} | | | failed: {s.error} | | | | | |")
            continue
        cost = ["-", "-", "-"]
        if s.costs:
            cost = [f"{statistics.median(c[i] for c in s.costs):.2f}" for i in range(2)]
            cost.append(f"{statistics.median(c[2] for c in s.costs):,.0f}")
        cpu = f"{statistics.median(s.cpus):.1f}" if s.cpus else "-"
        lines.append(
            f"| {LABELS[s.backend]} | {s.label} | {s.n:,} | {len(s.rates)} | "
            f"{fmt_rate(s.median)} | {fmt_range(s.rates)} | {cpu} | {' | '.join(cost)} |"
        )
    lines += ["", "## Enqueue (tasks/s, median of runs)", ""]
    lines += [
        "| backend | path | tasks per run | tasks/s median | min-max |",
        "|---|---|---:|---:|---:|",
    ]
    for s in series.values():
        if "/enqueue/" not in s.key:
            continue
        value = f"failed: {s.error}" if s.error else fmt_rate(s.median)
        lines.append(
            f"| {LABELS[s.backend]} | {s.label} | {s.n:,} | {value} | {fmt_range(s.rates)} |"
        )
    lines += ["", "## Against the targets (PostgreSQL, ratios of medians in this run)", ""]
    checks = [
        (
            "burn-down, txtasks tuned / PGQueuer tuned",
            "postgresql/txtasks/tuned",
            "postgresql/pgqueuer/tuned",
            2.0,
        ),
        ("burn-down, txtasks tuned / raw limit", "postgresql/txtasks/tuned", "postgresql/raw", 0.5),
        (
            "burn-down, txtasks tuned without archive / raw limit",
            "postgresql/txtasks/tuned-no-archive",
            "postgresql/raw",
            0.5,
        ),
        (
            "burn-down, txtasks defaults / PGQueuer defaults",
            "postgresql/txtasks/defaults",
            "postgresql/pgqueuer/defaults",
            1.0,
        ),
        (
            "enqueue, one per transaction / the same INSERT by hand in the same transaction",
            "postgresql/enqueue/single",
            "postgresql/enqueue/single-raw-sa",
            0.9,
        ),
        (
            "enqueue, one per transaction / raw asyncpg",
            "postgresql/enqueue/single",
            "postgresql/enqueue/single-raw",
            0.9,
        ),
        (
            "enqueue, bulk / raw executemany",
            "postgresql/enqueue/bulk",
            "postgresql/enqueue/bulk-raw",
            1.0,
        ),
    ]
    for what, a, b, target in checks:
        value = ratio(series, a, b)
        if value is None:
            continue
        verdict = "met" if value >= target else "NOT met"
        lines.append(f"- {what}: **{value:.2f}x** (target >= {target:g}x: {verdict})")
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
