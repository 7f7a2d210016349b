"""MariaDB / MySQL staging: multi-row INSERTs whose values Arrow writes as SQL literals, or on a
connection opened with `local_infile` (the data source's option `local_infile`), `LOAD DATA
LOCAL INFILE` of a file of tab-separated values Arrow writes."""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, exists, insert, select
from sqlalchemy.exc import DBAPIError

from txtasks.driver.mysql import lock_wait_timed_out
from txtasks.errors import TxtasksError
from txtasks.schema.tables import subscriptions, tasks
from txtasks.spark.staging import LOCK_WAIT_TIMEOUT, SqlStaging, StageTarget, TopicTarget

#: Staged rows go in as multi-row INSERTs (of the batch's columns) whose values Arrow writes as
#: SQL literals.
INSERT_STAGED = "INSERT INTO txtasks_staged ({}) VALUES "
#: The most bytes of row literals per INSERT statement (under the default max_allowed_packet).
STATEMENT_BYTES = 4 * 1024 * 1024
#: PyMySQL's SERVER_STATUS_NO_BACKSLASH_ESCAPES bit.
NO_BACKSLASH_ESCAPES = 512
#: The session's and the server's lock wait bounds (seconds).
LOCK_WAIT_SETTINGS = "SELECT @@SESSION.innodb_lock_wait_timeout, @@GLOBAL.innodb_lock_wait_timeout"
#: ER_DUP_ENTRY: the one warning of INSERT IGNORE that the commit lets by.
DUPLICATE_KEY = 1062
#: Staged rows as tab-separated values in LOAD DATA's default format (its FIELDS and LINES
#: defaults: a tab between fields, a newline after each row, `\` escapes, `\N` a NULL).
LOAD_STAGED = "LOAD DATA LOCAL INFILE %s INTO TABLE txtasks_staged CHARACTER SET binary ({})"
#: What LOAD DATA's default format escapes in a value.
LOAD_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\0", "\\0"))


def staged_values(batch: Any, backslash_escapes: bool = True) -> list[str]:
    """An Arrow table of staged rows as the VALUES lists of INSERT statements: strings quoted
    and escaped as PyMySQL does, NULL for nulls, every value built column-wise by Arrow."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    text_type = pa.large_string()
    quote, comma, empty = (pa.scalar(c, text_type) for c in ("'", ",", ""))
    parts: list[Any] = [pa.scalar("(", text_type)]
    for column in batch.columns:
        text = column.cast(text_type)
        if not pa.types.is_integer(column.type):
            if backslash_escapes:
                for char, escaped in (("\\", "\\\\"), ("'", "\\'"), ("\0", "\\0")):
                    text = pc.replace_substring(text, char, escaped)
            else:
                text = pc.replace_substring(text, "'", "''")
            text = pc.binary_join_element_wise(quote, text, quote, empty)
        parts += [text.fill_null("NULL"), comma]
    parts[-1] = pa.scalar(")", text_type)
    rows = pc.binary_join_element_wise(*parts, empty)
    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks()
    longest = pc.max(pc.binary_length(rows)).as_py() or 1
    step = max(1, STATEMENT_BYTES // (longest + 1))
    statements = []
    for start in range(0, len(rows), step):
        bounds = pa.array([start, min(start + step, len(rows))], pa.int64())
        statements.append(
            pc.binary_join(pa.LargeListArray.from_arrays(bounds, rows), comma)[0].as_py()
        )
    return statements


def staged_text(batch: Any) -> bytes:
    """An Arrow table of staged rows as LOAD DATA's default text format, built column-wise by
    Arrow: values escaped, `\\N` for nulls, a tab between fields, a newline after each row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text_type = pa.large_string()
    tab, newline, empty = (pa.scalar(c, text_type) for c in ("\t", "\n", ""))
    parts: list[Any] = []
    for column in batch.columns:
        text = column.cast(text_type)
        if not pa.types.is_integer(column.type):
            for char, escaped in LOAD_ESCAPES:
                text = pc.replace_substring(text, char, escaped)
        parts += [text.fill_null("\\N"), tab]
    parts[-1] = newline
    rows = pc.binary_join_element_wise(*parts, empty)
    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks()
    bounds = pa.array([0, len(rows)], pa.int64())
    joined = pc.binary_join(pa.LargeListArray.from_arrays(bounds, rows), empty)[0]
    return str(joined.as_py()).encode()


class MySQLStaging(SqlStaging):
    """Multi-row INSERTs of literals built by Arrow, sent without per-value escaping; on a
    connection opened with `local_infile`, LOAD DATA LOCAL INFILE of a file Arrow writes."""

    def insert_batch(self, conn: Connection, batch: Any) -> None:
        raw: Any = conn.connection.driver_connection
        if getattr(raw, "_local_infile", False):
            load_batch(raw, batch)
            return
        backslash = not getattr(raw, "server_status", 0) & NO_BACKSLASH_ESCAPES
        head = INSERT_STAGED.format(", ".join(batch.column_names))
        with raw.cursor() as cursor:
            for values in staged_values(batch, backslash):
                cursor.execute(head + values)

    @contextlib.contextmanager
    def lock_waits(self, conn: Connection, seconds: float | None) -> Iterator[float | None]:
        """`innodb_lock_wait_timeout` of the session set to the bound (whole seconds: the
        given ones rounded up, or `LOCK_WAIT_TIMEOUT`, or the server's global setting when it
        is longer), and the socket's read timeout (PyMySQL's, the command timeout) made as much
        longer; both put back after the block, when the connection goes back to its pool."""
        session, server = conn.exec_driver_sql(LOCK_WAIT_SETTINGS).one()
        bound = max(1, math.ceil(seconds)) if seconds else max(LOCK_WAIT_TIMEOUT, int(server))
        conn.exec_driver_sql(f"SET SESSION innodb_lock_wait_timeout = {bound:d}")
        conn.commit()
        raw: Any = conn.connection.driver_connection
        read = getattr(raw, "_read_timeout", None)
        if read is not None:
            raw._read_timeout = read + bound
        try:
            yield bound
        finally:
            if read is not None:
                raw._read_timeout = read
            with contextlib.suppress(DBAPIError):
                conn.exec_driver_sql(f"SET SESSION innodb_lock_wait_timeout = {int(session):d}")
                conn.commit()

    def lock_timed_out(self, exc: DBAPIError) -> bool:
        return lock_wait_timed_out(exc.orig)

    def lock_probe(self, conn: Connection) -> None:
        """No wait on MariaDB (0); MySQL takes 0 as its least, one second."""
        conn.exec_driver_sql("SET SESSION innodb_lock_wait_timeout = 0")

    def keys_probe(
        self,
        conn: Connection,
        rows_of: Any,
        keys: Sequence[str],
        target: StageTarget | TopicTarget,
        now: datetime,
    ) -> None:
        """A locking read of the hot table's rows of `keys` (a topic's: each group's), along
        the dedup key's unique index: it waits for a transaction that inserted one of them and
        has not committed, and for nothing else (the publish itself may read other rows with
        locks, whose waits would name a key that is not held)."""
        held = list(keys)
        if isinstance(target, TopicTarget):
            s = subscriptions.c
            groups = conn.execute(select(s.group_name).where(s.topic == target.topic)).scalars()
            held = [f"{group}/{key}" for group in groups for key in keys]
        read = select(tasks.c.dedup_key).where(tasks.c.dedup_key.in_(held))
        conn.execute(read.with_for_update(read=True)).all()

    def insert_tasks(self, conn: Connection, columns: Sequence[str], rows: Any, dedup: bool) -> int:
        """With `dedup`, rows whose key a committed task holds are left out by the SELECT, and
        INSERT IGNORE skips those of a transaction committing meanwhile (a duplicate key is a
        warning then); any other warning (an error IGNORE turned into one) fails the commit."""
        if not dedup:
            return super().insert_tasks(conn, columns, rows, dedup)
        key = rows.selected_columns[list(columns).index("dedup_key")]
        rows = rows.where(~exists().where(tasks.c.dedup_key == key))
        stmt = insert(tasks).prefix_with("IGNORE").from_select(columns, rows)
        count = int(conn.execute(stmt.execution_options(preserve_rowcount=True)).rowcount)
        warned = int(conn.exec_driver_sql("SHOW COUNT(*) WARNINGS").scalar_one())
        if warned:
            shown = conn.exec_driver_sql("SHOW WARNINGS").all()
            other = [w for w in shown if int(w[1]) != DUPLICATE_KEY]
            if other or len(shown) < warned:
                first = f"{other[0][1]} {other[0][2]}" if other else "not all shown"
                raise PublishWarning(
                    f"txtasks commit: inserting the staged rows gave {warned} warnings, not only "
                    f"duplicate dedup keys (first: {first}); nothing was published"
                )
        return count


def load_batch(raw: Any, batch: Any) -> None:
    """LOAD DATA LOCAL INFILE of one staged batch (a temporary file the server reads through
    this connection); a row it left out or changed (a warning) fails the batch."""
    with tempfile.NamedTemporaryFile(prefix="txtasks-staged-", suffix=".tsv") as file:
        file.write(staged_text(batch))
        file.flush()
        with raw.cursor() as cursor:
            loaded = cursor.execute(LOAD_STAGED.format(", ".join(batch.column_names)), (file.name,))
            cursor.execute("SHOW WARNINGS LIMIT 1")
            warned = cursor.fetchall()
    if loaded != batch.num_rows or warned:
        first = f"{warned[0][1]} {warned[0][2]}" if warned else "none"
        raise StagingWarning(
            f"txtasks staging: LOAD DATA loaded {loaded} of {batch.num_rows} rows (first "
            f"warning: {first}); the batch was not staged"
        )


class StagingWarning(TxtasksError):
    """MariaDB / MySQL: LOAD DATA left out or changed a staged row: the batch is rolled
    back."""


class PublishWarning(TxtasksError):
    """MariaDB / MySQL: the commit's INSERT IGNORE warned of something besides a duplicate
    key (a value it would have changed): the commit is rolled back."""
