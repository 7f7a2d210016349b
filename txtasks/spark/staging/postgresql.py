"""PostgreSQL staging: staged rows go in with COPY, as CSV that Arrow writes."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from txtasks.spark.staging import SqlStaging

#: Memory for the sorts of an atomic commit (its rows in staging or dedup key order), in its
#: transaction only: the default (4MB) sorts the rows of a 200,000-row write on disk.
COMMIT_WORK_MEM = "64MB"
#: Staged rows go in with COPY (of the batch's columns): no per-row work in Python.
COPY_STAGED = "COPY txtasks_staged ({}) FROM STDIN (FORMAT csv)"


def staged_csv(batch: Any) -> bytes:
    """An Arrow table of staged rows as COPY CSV. Payloads are `bytea` in escape format:
    their bytes as they are, backslashes doubled (a JSON object never starts with `\\x`)."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.compute as pc  # type: ignore[import-untyped]
    import pyarrow.csv as pa_csv  # type: ignore[import-untyped]

    where = batch.schema.get_field_index("payload")
    text = pc.replace_substring(batch.column(where).cast(pa.large_string()), "\\", "\\\\")
    out = pa.BufferOutputStream()
    options = pa_csv.WriteOptions(include_header=False, quoting_style="all_valid")
    pa_csv.write_csv(batch.set_column(where, "payload", text), out, options)
    return bytes(out.getvalue())


class PostgresStaging(SqlStaging):
    """COPY through psycopg; other DB-API drivers take the generic path."""

    def insert_batch(self, conn: Connection, batch: Any) -> None:
        raw: Any = conn.connection.driver_connection
        with raw.cursor() as cursor:
            if not hasattr(cursor, "copy"):  # not psycopg 3
                super().insert_batch(conn, batch)
                return
            with cursor.copy(COPY_STAGED.format(", ".join(batch.column_names))) as copy:
                copy.write(staged_csv(batch))

    def prepare_publish(self, conn: Connection) -> None:
        conn.exec_driver_sql(f"SET LOCAL work_mem = '{COMMIT_WORK_MEM}'")
