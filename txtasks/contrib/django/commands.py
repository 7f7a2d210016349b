"""`manage.py txtasks_*`: the `txtasks` commands, on the Django project's database and App."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from txtasks.contrib.django import database_url
from txtasks.errors import TxtasksError


def cli_args(command: str, args: list[str], *, with_app: bool) -> list[str]:
    """The `txtasks` command line: the command, the App of TXTASKS_APP, the Django database's
    URL (unless `--database-url` is given), then the arguments as given."""
    from django.conf import settings

    line = [command]
    if with_app:
        path = getattr(settings, "TXTASKS_APP", None)
        if not path:
            raise CommandError(
                'TXTASKS_APP: not set; add TXTASKS_APP = "yourmodule:app" to the Django settings'
            )
        line.append(str(path))
    if not any(a == "--database-url" or a.startswith("--database-url=") for a in args):
        line += ["--database-url", database_url()]
    return line + args


class CliCommand(BaseCommand):
    """Runs one `txtasks` command; every option after the command's name is passed on."""

    cli_command = ""
    with_app = True

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> Any:
        """A parser that hands the options it does not know on to `txtasks` (call_command)."""
        parser = super().create_parser(prog_name, subcommand, **kwargs)

        def parse_args(args: Any = None, namespace: Any = None) -> Any:
            parsed, others = parser.parse_known_args(args, namespace)
            parsed.cli_args = others  # in their order, values included
            return parsed

        parser.parse_args = parse_args
        return parser

    def run_from_argv(self, argv: list[str]) -> None:
        """Pass the options on as they are (Django's parser would refuse them); an error is
        one line on stderr and exit status 1, as Django's commands do."""
        help_only = any(a in ("-h", "--help") for a in argv[2:])
        try:
            self.run_cli(argv[2:], help_only=help_only)
        except CommandError as exc:
            self.stderr.write(f"{type(exc).__name__}: {exc}")
            sys.exit(exc.returncode)

    def handle(self, *args: Any, **options: Any) -> None:
        self.run_cli(list(options.get("cli_args") or []))

    def run_cli(self, args: list[str], *, help_only: bool = False) -> None:
        import click

        from txtasks.cli.main import main

        line = [self.cli_command, *args] if help_only else None
        try:
            line = line or cli_args(self.cli_command, args, with_app=self.with_app)
        except click.ClickException as exc:  # a bad option or value: click's one line
            raise CommandError(exc.format_message()) from exc
        except TxtasksError as exc:
            raise CommandError(str(exc)) from exc
        try:
            main(line, prog_name=f"{sys.argv[0]} txtasks_{self.cli_command}", standalone_mode=False)
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
        except click.ClickException as exc:  # a bad option or value: click's one line
            raise CommandError(exc.format_message()) from exc
        except TxtasksError as exc:
            raise CommandError(str(exc)) from exc
