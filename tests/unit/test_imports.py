"""Starting a worker or a command imports only what it needs: migrations' alembic is loaded
by `txtasks migrate` alone."""

from __future__ import annotations

import subprocess
import sys


def test_a_worker_and_the_schema_check_do_not_import_alembic() -> None:
    code = (
        "import sys, txtasks, txtasks.cli.main, txtasks.worker\n"
        "from txtasks.schema.migrate import latest_version\n"
        "latest_version()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'mako')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
