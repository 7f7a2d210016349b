"""Django's postgresql backend on psycopg2 (Django takes psycopg 3 when it is installed)."""

from tests.integration.django.backends import backend_copy

DatabaseWrapper = backend_copy("django.db.backends.postgresql", {"psycopg": None}).DatabaseWrapper
