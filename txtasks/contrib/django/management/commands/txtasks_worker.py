"""`manage.py txtasks_worker [OPTIONS]`: Run the tasks of TXTASKS_APP (`txtasks worker`) on the Django database."""

from txtasks.contrib.django.commands import CliCommand


class Command(CliCommand):
    help = "Run the tasks of TXTASKS_APP (`txtasks worker`) on the Django database. Options as `txtasks worker --help` lists them."
    cli_command = "worker"
    with_app = True
