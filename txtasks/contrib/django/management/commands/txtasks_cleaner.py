"""`manage.py txtasks_cleaner [OPTIONS]`: Run the cleaner of TXTASKS_APP (`txtasks cleaner`) on the Django database."""

from txtasks.contrib.django.commands import CliCommand


class Command(CliCommand):
    help = "Run the cleaner of TXTASKS_APP (`txtasks cleaner`) on the Django database. Options as `txtasks cleaner --help` lists them."
    cli_command = "cleaner"
    with_app = True
