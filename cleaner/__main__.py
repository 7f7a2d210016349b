"""`python -m cleaner APP ...` is `txtasks cleaner APP ...`."""

from __future__ import annotations

import sys

from txtasks.cli.main import main

if __name__ == "__main__":
    main(args=["cleaner", *sys.argv[1:]], prog_name="python -m cleaner")
