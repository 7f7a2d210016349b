"""`manage.py txtasks_migrate [OPTIONS]`: Create or upgrade the txtasks tables in the Django database (`txtasks migrate`)."""

from txtasks.contrib.django.commands import CliCommand


class Command(CliCommand):
    help = "Create or upgrade the txtasks tables in the Django database (`txtasks migrate`). Options as `txtasks migrate --help` lists them."
    cli_command = "migrate"
    with_app = False
