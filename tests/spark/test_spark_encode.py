"""The Arrow path and the row path turn the same Spark data into the same staged rows, and
awkward strings survive each database's bulk path byte for byte."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from tests.spark.test_spark_write import live_rows, staged_count, writer
from txtasks.driver.urls import url_sync
from txtasks.schema.tables import tasks

AWKWARD = [
    'quote " and backslash \\ and slash /',
    "apostrophe ' and sql '' doubled",
    "new\nline, tab\t, return\r, bell \x07, escape \x1b, unit \x1f",
    "unicode é 漢字 🎉 \u2028",
    "",
    "\\x41 looks like bytea hex",
]

RICH_QUERY = """
SELECT id AS n,
       CASE WHEN id % 5 = 0 THEN NULL ELSE element_at(array({strings}), int(id % {count}) + 1) END AS s,
       CASE WHEN id % 7 = 0 THEN NULL ELSE id * double(1.5) END AS d,
       CAST(id AS float) / 3 AS f,
       CAST(id * 1e15 AS double) AS big,
       id % 2 = 0 AS b,
       CAST(NULL AS string) AS nothing,
       date_add(DATE'2026-01-01', int(id)) AS day,
       TIMESTAMP'2026-01-01 12:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) AS at,
       TIMESTAMP_NTZ'2026-01-01 12:00:00' + make_interval(0, 0, 0, 0, 0, int(id), 0) AS local_at,
       CAST(id / 7 AS decimal(10, 4)) AS money,
       array(id, id + 1) AS pair,
       map('k', CAST(id AS string), 'q"', NULL) AS tags,
       named_struct('x', id, 'when', DATE'2026-01-01', 'items', array(double(1.5), double(2))) AS nested,
       CAST(id % 3 AS int) AS rank
  FROM range(40)
"""


def rich(spark: Any) -> Any:
    strings = ", ".join("'{}'".format(s.replace("\\", "\\\\").replace("'", "\\'")) for s in AWKWARD)
    return spark.sql(RICH_QUERY.format(strings=strings, count=len(AWKWARD)))


def test_the_arrow_and_row_paths_stage_the_same_rows(spark: Any) -> None:
    from txtasks.spark import WriteOptions
    from txtasks.spark.encode import staged_from_arrow, staged_from_rows

    df = rich(spark)
    options = WriteOptions.parse(
        {"url": "sqlite://", "task": "t", "dedup": "s", "priority": "rank", "run_at": "at"},
        df.schema,
    )
    arrow = [staged_from_arrow(b, options) for b in df.toArrow().to_batches()]
    by_arrow = [r for table in arrow for r in table.to_pylist()]
    by_rows = staged_from_rows(df.collect(), options).to_pylist()

    assert len(by_arrow) == len(by_rows) == 40
    for ours, theirs in zip(by_arrow, by_rows, strict=True):
        assert json.loads(ours.pop("payload")) == json.loads(theirs.pop("payload"))
        assert ours == theirs
    first = json.loads(
        staged_from_arrow(df.toArrow().to_batches()[0], options)["payload"][1].as_py().decode()
    )
    assert first["big"] == 1e15 and isinstance(first["big"], float)
    assert first["d"] == 1.5 and first["money"] == "0.1429" and first["day"] == "2026-01-02"
    assert first["tags"] == {"k": "1", 'q"': None} and first["nested"]["items"] == [1.5, 2.0]
    assert first["local_at"] == "2026-01-01T12:01:00"


def test_awkward_strings_survive_the_database_bulk_path(spark: Any, database_url: str) -> None:
    df = spark.createDataFrame([(s, i) for i, s in enumerate(AWKWARD)], "s STRING, i LONG")
    writer(df, database_url, dedup="s").save()

    rows = live_rows(database_url)
    assert staged_count(database_url) == 0
    assert sorted(r["dedup_key"] for r in rows) == sorted(AWKWARD)
    assert sorted(json.loads(r["payload"])["s"] for r in rows) == sorted(AWKWARD)
    engine = create_engine(url_sync(database_url))
    try:
        with engine.connect() as conn:
            payloads = conn.execute(select(tasks.c.payload)).scalars().all()
    finally:
        engine.dispose()
    expected = {
        json.dumps({"s": s, "i": i}, ensure_ascii=False, separators=(",", ":")).encode()
        for i, s in enumerate(AWKWARD)
    }
    assert set(payloads) == expected  # byte for byte what json.dumps writes


def test_a_dedup_value_too_long_fails_the_write(spark: Any, database_url: str) -> None:
    df = spark.createDataFrame([("x" * 256, 1)], "s STRING, i LONG")
    with pytest.raises(Exception, match="is too long \\(at most 255 bytes\\)"):
        writer(df, database_url, dedup="s").save()
    assert live_rows(database_url) == [] and staged_count(database_url) == 0


# -- the key option (no Spark session needed) ---------------------------------------------------


def keyed_options(key_type: Any, **options: str) -> Any:
    from pyspark.sql.types import LongType, StructField, StructType

    from txtasks.spark import WriteOptions

    schema = StructType([StructField("n", LongType()), StructField("customer", key_type)])
    return WriteOptions.parse({"url": "sqlite://", "task": "t", **options}, schema)


def keyed_batch(customers: list[Any], kind: Any) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array(range(len(customers)), pa.int64()), pa.array(customers, kind)],
        names=["n", "customer"],
    )


def as_rows(batch: Any) -> list[tuple[Any, ...]]:
    """A record batch as the row path gets it (values by position)."""
    return [tuple(row.values()) for row in batch.to_pylist()]


def test_the_key_option_names_a_string_or_integer_column() -> None:
    from pyspark.sql.types import DoubleType, IntegerType, StringType

    from txtasks.errors import ConfigurationError

    assert keyed_options(StringType(), key="customer").key == "customer"
    assert keyed_options(IntegerType(), key="customer").key == "customer"
    assert keyed_options(StringType()).key is None
    with pytest.raises(ConfigurationError, match="option 'key': no column 'nope'"):
        keyed_options(StringType(), key="nope")
    with pytest.raises(
        ConfigurationError, match="key column 'customer' must be a string or integer, not double"
    ):
        keyed_options(DoubleType(), key="customer")


def test_key_values_are_staged_as_text_and_nulls_as_no_key() -> None:
    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType

    from txtasks.spark.encode import staged_from_arrow, staged_from_rows

    options = keyed_options(StringType(), key="customer")
    batch = keyed_batch(["c1", None, "é 漢"], pa.string())
    by_arrow = staged_from_arrow(batch, options)
    assert by_arrow["partition_key"].to_pylist() == ["c1", None, "é 漢"]
    assert json.loads(by_arrow["payload"][0].as_py()) == {"n": 0, "customer": "c1"}  # kept
    rows = staged_from_rows(as_rows(batch), options)
    assert rows.to_pylist() == by_arrow.to_pylist()

    numbers = keyed_options(LongType(), key="customer", payload="n")
    staged = staged_from_arrow(keyed_batch([42, None], pa.int64()), numbers)
    assert staged["partition_key"].to_pylist() == ["42", None]
    unkeyed = staged_from_arrow(batch, keyed_options(StringType()))
    assert "partition_key" not in unkeyed.column_names


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("x" * 256, "is too long"),
        ("é" * 128, "is too long"),  # 256 bytes
        ("", "is empty"),
        ("a\x00b", "holds a NUL character"),
    ],
)
def test_a_key_value_the_tasks_table_cannot_hold_is_refused(value: str, problem: str) -> None:
    import pyarrow as pa
    from pyspark.sql.types import StringType

    from txtasks.errors import ConfigurationError
    from txtasks.spark.encode import staged_from_arrow, staged_from_rows

    options = keyed_options(StringType(), key="customer")
    batch = keyed_batch(["fine", value, None], pa.string())
    expected = re.escape(
        f"txtasks write: option 'key': value {value!r} {problem} "
        "(a key is 1-255 bytes of UTF-8 without NUL)"
    )
    with pytest.raises(ConfigurationError, match=expected):
        staged_from_arrow(batch, options)
    with pytest.raises(ConfigurationError, match=expected):
        staged_from_rows(as_rows(batch), options)


def test_a_write_stages_only_the_columns_its_options_name_and_a_null_time_stays_null() -> None:
    """No run_at, dedup or key option: each row stages its payload and priority alone (the
    commit gives it its time); a null in the run_at column stays null (due when published)."""
    import pyarrow as pa
    from pyspark.sql.types import StringType, TimestampNTZType

    from txtasks.spark.encode import staged_from_arrow, staged_from_rows

    plain = staged_from_arrow(keyed_batch(["a", "b"], pa.string()), keyed_options(StringType()))
    assert plain.column_names == ["payload", "priority"]

    due = datetime(2030, 1, 2, 3, 4, 5, 6)
    batch = keyed_batch([due, None], pa.timestamp("us"))
    options = keyed_options(TimestampNTZType(), run_at="customer", payload="n")
    by_arrow = staged_from_arrow(batch, options)
    assert by_arrow.column_names == ["payload", "priority", "run_at"]
    assert by_arrow["run_at"].to_pylist() == [due, None]
    assert staged_from_rows(as_rows(batch), options).to_pylist() == by_arrow.to_pylist()
