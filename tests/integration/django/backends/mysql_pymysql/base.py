"""Django's mysql backend on PyMySQL, as `pymysql.install_as_MySQLdb()` makes it (without
replacing mysqlclient's `MySQLdb` for the rest of the process)."""

import pymysql

from tests.integration.django.backends import backend_copy

DatabaseWrapper = backend_copy("django.db.backends.mysql", {"MySQLdb": pymysql}).DatabaseWrapper
