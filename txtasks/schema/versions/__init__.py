"""Versioned schema migrations, applied in order by `txtasks migrate`.

Each module is frozen once released: it defines `VERSION`, `NAME` and `upgrade(op)`, where `op` is
an alembic `Operations` bound to the target database (or to an SQL script in offline mode).
"""
