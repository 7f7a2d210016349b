"""`python -m txtasks` is the `txtasks` command."""

from txtasks.cli.main import main

if __name__ == "__main__":
    main()
