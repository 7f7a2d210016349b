"""`python -m cleaner APP ...` is `txtasks cleaner APP ...`."""

from __future__ import annotations

from cleaner.cli import cleaner

if __name__ == "__main__":
    cleaner.main(prog_name="python -m cleaner")
