"""A small inline SVG chart: tasks enqueued and finished per minute over the last hour, or per
bucket of minutes over a day or a week."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup


def sparkline(
    done: Sequence[int],
    failed: Sequence[int],
    arrived: Sequence[int] = (),
    *,
    width: int = 240,
    height: int = 36,
    span: str = "last hour",
    per: str = "min",
) -> Markup:
    """Bars per minute (or per bucket: `per`), oldest left: completed in green, failed or dead
    on top in red; the tasks enqueued in each as a line over them."""
    count = max(len(done), 1)
    peak = max([d + f for d, f in zip(done, failed, strict=True)] + [*arrived, 1])
    step = width / count
    bars = []
    for i, (d, f) in enumerate(zip(done, failed, strict=True)):
        x = i * step
        ok_h = height * d / peak
        bad_h = height * f / peak
        if d:
            bars.append(
                f'<rect class="ok" x="{x:.1f}" y="{height - ok_h:.1f}" '
                f'width="{max(step - 1, 1):.1f}" height="{ok_h:.1f}"/>'
            )
        if f:
            bars.append(
                f'<rect class="bad" x="{x:.1f}" y="{height - ok_h - bad_h:.1f}" '
                f'width="{max(step - 1, 1):.1f}" height="{bad_h:.1f}"/>'
            )
    if arrived:
        points = " ".join(
            f"{(i + 0.5) * step:.1f},{height - height * a / peak:.1f}"
            for i, a in enumerate(arrived)
        )
        bars.append(f'<polyline class="arrived" points="{points}"/>')
    title = (
        f"{span}: {sum(arrived)} enqueued, {sum(done)} completed, {sum(failed)} failed or dead;"
        f" peak {peak}/{per}"
    )
    return Markup(
        f'<svg class="chart" width="{width}" height="{height}" role="img" '
        f'viewBox="0 0 {width} {height}"><title>{title}</title>'
        f'<line x1="0" y1="{height}" x2="{width}" y2="{height}"/>{"".join(bars)}</svg>'
    )
