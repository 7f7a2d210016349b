"""The tables commands print (`status`, `topics`, `tasks`, `dlq list`).

On a terminal a table fits its width: whole when it can; else its text columns fold (never
below `FOLD_MIN` characters); when the numbers still do not fit, its columns are shared out
among several tables, each repeating the first column, so that every value stays on one row
with its name. Piped to a file or a program, a table is as wide as its values need: nothing
is cut or folded.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

#: The narrowest a text column folds to on a narrow terminal.
FOLD_MIN = 12
#: What a table adds to its columns: a space each side of each one and a line between two.
_PER_COLUMN = 3


@dataclass(frozen=True)
class Grid:
    """A table to show: a title, headers, rows. The first column names the row; it and the
    columns named in `text` hold text (left-aligned, folded when short of room), the others
    numbers or short values (right-aligned, never folded)."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    text: frozenset[str] = frozenset()

    def is_text(self, column: int) -> bool:
        return column == 0 or self.headers[column] in self.text

    def widths(self) -> list[int]:
        """Each column's natural width: its longest value or header."""
        return [max([len(h), *(len(r[i]) for r in self.rows)]) for i, h in enumerate(self.headers)]

    def width_needed(self, columns: Sequence[int] | None = None, *, folded: bool = False) -> int:
        """Columns a table of these `columns` (default all) takes, its text folded or not."""
        widths = self.widths()
        chosen = range(len(self.headers)) if columns is None else columns
        total = sum(
            min(widths[i], FOLD_MIN) if folded and self.is_text(i) else widths[i] for i in chosen
        )
        return total + _PER_COLUMN * (len(chosen) - 1)

    def parts(self, width: int) -> list[list[int]]:
        """The columns of each table at `width`: all in one when they fit (their text folded
        if need be); else the first column and as many of the next as fit, in order, each
        table keeping its text whole when the first column and one more fit that way."""
        everything = list(range(len(self.headers)))
        if self.width_needed(everything, folded=True) <= width:
            return [everything]
        folded = any(self.width_needed([0, i]) > width for i in everything[1:])
        parts, current = [], [0]
        for column in everything[1:]:
            if len(current) > 1 and self.width_needed([*current, column], folded=folded) > width:
                parts.append(current)
                current = [0]
            current.append(column)
        parts.append(current)
        return parts

    def render(self, width: int) -> list[Any]:
        """What shows this grid at `width` columns: each table after its title, a line of its
        own (a table's own title would wrap at the table's width, not the terminal's)."""
        from rich import box
        from rich.table import Table
        from rich.text import Text

        widths = self.widths()
        tables = []
        for n, columns in enumerate(self.parts(width)):
            title = self.title if n == 0 else f"{self.title} (continued)"
            table = Table(
                box=box.SIMPLE_HEAD,
                show_edge=False,
                pad_edge=False,
            )
            for i in columns:
                if self.is_text(i):
                    table.add_column(
                        self.headers[i], overflow="fold", min_width=min(widths[i], FOLD_MIN)
                    )
                else:
                    table.add_column(self.headers[i], justify="right", no_wrap=True)
            for row in self.rows:
                table.add_row(*(row[i] for i in columns))
            tables.extend([Text(title, style="bold"), table])
        return tables


def console_for(grids: Iterable[Grid]) -> Console:
    """The terminal's width on a terminal (or COLUMNS when set); else as wide as the widest
    table needs, unfolded, so that output piped to a file or a pager is never cut."""
    from rich.console import Console

    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS"):
        return console
    widest = max((grid.width_needed() for grid in grids), default=80)
    return Console(width=max(widest, 80))


def grids_print(grids: Sequence[Grid], console: Console | None = None) -> Console:
    """Print the tables at the console's width (see `console_for`)."""
    console = console or console_for(grids)
    for grid in grids:
        for table in grid.render(console.width):
            console.print(table)
    return console
