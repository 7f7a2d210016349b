"""docs/cli.md shows the real `--help` of every command, so it cannot go stale.

Each command of `txtasks` (groups and subcommands included) has a section in docs/cli.md whose
```text block follows a `<!-- help: txtasks NAME... -->` comment and equals what
`txtasks NAME... --help` prints, rendered by click's CliRunner at a fixed width of 80 columns.
After changing a command, rewrite the blocks with:

    python -m tests.docs.test_cli_reference
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from tests.docs.test_snippets import DOCS
from txtasks.cli.main import main as cli_main

PAGE = DOCS / "cli.md"
WIDTH = 80
#: A help block: the marker comment naming the command, then a ```text block.
BLOCK = re.compile(r"^<!-- help: (txtasks[\w -]*?) -->\n```text\n(.*?)^```$", re.S | re.M)


def commands(
    command: click.Command = cli_main, path: tuple[str, ...] = ("txtasks",)
) -> Iterator[str]:
    """`txtasks`, `txtasks migrate`, ..., `txtasks dlq list`: every visible command."""
    yield " ".join(path)
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):  # lazily imported commands too
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from commands(sub, (*path, name))


def help_text(command_line: str) -> str:
    """What `COMMAND_LINE --help` prints, without any TXTASKS_* variable of the environment."""
    args = command_line.split()[1:]
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("TXTASKS_")}
    runner = CliRunner(env={**unset, "COLUMNS": str(WIDTH)})
    result = runner.invoke(
        cli_main, [*args, "--help"], prog_name="txtasks", terminal_width=WIDTH, color=False
    )
    assert result.exit_code == 0, result.output
    return result.output


def page_blocks() -> dict[str, str]:
    """{command line: block body} of the help blocks of docs/cli.md."""
    found: dict[str, str] = {}
    for match in BLOCK.finditer(PAGE.read_text()):
        assert match.group(1) not in found, f"cli.md shows {match.group(1)!r} twice"
        found[match.group(1)] = match.group(2)
    return found


def test_every_command_is_shown() -> None:
    shown = set(page_blocks())
    expected = set(commands())
    assert expected - shown == set(), "commands cli.md does not show"
    assert shown - expected == set(), "cli.md shows commands that do not exist"


@pytest.mark.parametrize("command_line", list(commands()))
def test_help_is_verbatim(command_line: str) -> None:
    shown = page_blocks().get(command_line)
    assert shown is not None, f"cli.md has no help block for {command_line!r}"
    assert shown == help_text(command_line), (
        f"cli.md shows stale help for {command_line!r}; "
        "rewrite it with: python -m tests.docs.test_cli_reference"
    )


def rewrite() -> int:
    """Replace the body of every help block of docs/cli.md by the current help."""
    text = PAGE.read_text()

    def current(match: re.Match[str]) -> str:
        return f"<!-- help: {match.group(1)} -->\n```text\n{help_text(match.group(1))}```"

    new = BLOCK.sub(current, text)
    missing = set(commands()) - set(page_blocks())
    if new != text:
        PAGE.write_text(new)
        print(f"rewrote {PAGE}")
    for line in sorted(missing):
        print(f"cli.md has no section for {line!r}: add one with a help block", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(rewrite())
