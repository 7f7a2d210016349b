"""Integrations with other frameworks, each behind its extra (`pip install txtasks[django]`)."""
