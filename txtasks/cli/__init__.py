"""The `txtasks` command line."""
