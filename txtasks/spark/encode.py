"""Spark data to staged rows (Arrow tables of `STAGED_COLUMNS`, and of `STAGED_OPTIONAL` those
the write's options name: `run_at`, `dedup`, `key`).

The Arrow path (`staged_from_arrow`) builds each payload column by column with Arrow compute:
numbers, booleans and strings become JSON text without a Python object per value; other types
(dates, timestamps, decimals, arrays, maps, structs) go through Python, one column at a time.
The row path (`staged_from_rows`) serves writers that get Spark `Row`s. Both give the same
JSON values: a payload is a JSON object of the row's payload columns, in their order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    FloatType,
    MapType,
    NullType,
    StringType,
    StructType,
    TimestampType,
)

from txtasks.errors import ConfigurationError, PayloadError
from txtasks.payload import DEFAULT_MAX_PAYLOAD_BYTES
from txtasks.spark.options import INTEGRAL, MAX_KEY_BYTES, WriteOptions
from txtasks.spark.staging import STAGED_COLUMNS, STAGED_OPTIONAL

TEXT = pa.large_string()
TIMESTAMP = pa.timestamp("us")
#: Characters a JSON string escapes with a short escape (json.dumps's choice).
SHORT_ESCAPES = (
    ("\\", "\\\\"),
    ('"', '\\"'),
    ("\n", "\\n"),
    ("\r", "\\r"),
    ("\t", "\\t"),
    ("\b", "\\b"),
    ("\f", "\\f"),
)


def _join(*parts: Any) -> Any:
    """Concatenate string arrays and literals element-wise (as large strings)."""
    return pc.binary_join_element_wise(
        *[pa.scalar(p, TEXT) if isinstance(p, str) else p for p in parts], pa.scalar("", TEXT)
    )


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        raise PayloadError(f"txtasks write: value {value!r}: {exc}") from None


# -- the Arrow path -----------------------------------------------------------------------------


def staged_from_arrow(batch: pa.RecordBatch, options: WriteOptions) -> pa.Table:
    """One Arrow record batch of the DataFrame as staged rows."""
    types = {f.name: f.dataType for f in options.schema.fields}
    parts: list[Any] = []
    for i, name in enumerate(options.payload):
        parts += ["{" if i == 0 else ",", _dumps(name) + ":"]
        parts.append(_json_text(batch.column(name), types[name], name))
    parts.append("}" if parts else "{}")
    if len(parts) == 1:  # no payload columns: an empty object each
        parts.insert(0, pa.repeat(pa.scalar("", TEXT), batch.num_rows))
    payload = _join(*parts)

    def column(name: str | None) -> Any:
        return None if name is None else batch.column(name)

    special = (
        column(options.priority),
        column(options.run_at),
        column(options.dedup),
        column(options.key),
    )
    return _staged(batch.num_rows, payload, special, options)


def _staged(
    count: int, payload: Any, special: tuple[Any, Any, Any, Any], options: WriteOptions
) -> pa.Table:
    """The staged table; `special` holds the priority, run_at, dedup and key columns (or
    None: the write has none). A null run_at stays null (due when published), as does a
    null dedup key (none) or task key (no key)."""
    payload = payload.cast(pa.large_binary())
    _check_sizes(payload)
    rank, due, unique, key = special
    priority = pa.repeat(pa.scalar(0, pa.int32()), count)
    if rank is not None:
        priority = rank.cast(pa.int32()).fill_null(0)
    columns = {"payload": payload, "priority": priority}
    if due is not None:  # TIMESTAMP values are UTC instants: the cast keeps UTC
        columns["run_at"] = due.cast(TIMESTAMP)
    if unique is not None:
        columns["dedup_key"] = unique.cast(TEXT)
        _check_keys(columns["dedup_key"], "dedup", limit=options.dedup_bytes)
    if key is not None:  # a keyed write
        columns["partition_key"] = key.cast(TEXT)
        _check_keys(columns["partition_key"], "key", task_key=True)
    names = [c for c in (*STAGED_COLUMNS, *STAGED_OPTIONAL) if c in columns]
    return pa.table([columns[c] for c in names], names=names)


def _check_sizes(payload: Any) -> None:
    longest = pc.max(pc.binary_length(payload)).as_py() or 0
    if longest > DEFAULT_MAX_PAYLOAD_BYTES:
        raise PayloadError(
            f"txtasks write: a payload of {longest} bytes exceeds the limit of "
            f"{DEFAULT_MAX_PAYLOAD_BYTES}"
        )


def _check_keys(
    values: Any, option: str, *, limit: int = MAX_KEY_BYTES, task_key: bool = False
) -> None:
    """Refuse a value of the `option` column that the hot table cannot hold: one longer than
    `limit` bytes (a topic's dedup keys leave room for the group), or for a task key (as
    `txtasks._checks.check_key`) an empty one or one with NUL."""
    lengths = pc.binary_length(values)
    rule = f"at most {limit} bytes"
    if task_key:
        rule = f"a key is 1-{limit} bytes of UTF-8 without NUL"
    checks = [(pc.greater(lengths, limit), "is too long")]
    if task_key:
        checks += [
            (pc.equal(lengths, 0), "is empty"),
            (pc.match_substring(values, "\x00"), "holds a NUL character"),
        ]
    for bad, problem in checks:
        if pc.any(bad).as_py():
            value = values.filter(bad)[0].as_py()
            raise ConfigurationError(
                f"txtasks write: option '{option}': value {value!r} {problem} ({rule})"
            )


def _json_text(column: Any, kind: DataType, name: str) -> Any:
    """The JSON text of each value of a column ("null" for nulls), as Arrow large strings."""
    if isinstance(kind, INTEGRAL):
        text = column.cast(TEXT)
    elif isinstance(kind, BooleanType):
        text = pc.if_else(column, "true", "false").cast(TEXT)
    elif isinstance(kind, (FloatType, DoubleType)):
        text = _float_text(column, name)
    elif isinstance(kind, StringType):
        text = _string_text(column)
    elif isinstance(kind, NullType):
        return pa.repeat(pa.scalar("null", TEXT), len(column))
    else:
        text = _python_text(column, kind)
    return text.fill_null("null")


def _float_text(column: Any, name: str) -> Any:
    """Shortest round-trip text; integral values keep a ".0" (as json.dumps writes them)."""
    column = column.cast(pa.float64())
    finite = pc.is_finite(column)
    if not pc.all(finite).as_py():
        value = column.filter(pc.invert(finite))[0].as_py()
        raise PayloadError(
            f"txtasks write: column {name!r}: {value!r} is not a JSON number "
            "(NaN and infinities are refused)"
        )
    text = column.cast(TEXT)
    fraction = _join(text, ".0")
    return pc.if_else(pc.match_substring_regex(text, "[.en]"), text, fraction)


def _string_text(column: Any) -> Any:
    """JSON string literals, escaped as json.dumps(ensure_ascii=False) escapes them."""
    text = column.cast(TEXT)
    if pc.any(pc.match_substring_regex(text, '["\\\\\\x00-\\x1f]')).as_py():
        for char, escaped in SHORT_ESCAPES:
            text = pc.replace_substring(text, char, escaped)
        if pc.any(pc.match_substring_regex(text, "[\\x00-\\x1f]")).as_py():
            return pa.array([None if v is None else _dumps(v) for v in column.to_pylist()], TEXT)
    return _join('"', text, '"')


def _python_text(column: Any, kind: DataType) -> Any:
    convert = _converter(kind)
    texts = [None if v is None else _dumps(convert(v)) for v in column.to_pylist()]
    return pa.array(texts, TEXT)


def _converter(kind: DataType) -> Callable[[Any], Any]:
    """Arrow's Python value of a `kind` column -> the JSON data the row path writes for it."""
    if isinstance(kind, ArrayType):
        item = _converter(kind.elementType)
        return lambda v: None if v is None else [item(x) for x in v]
    if isinstance(kind, MapType):
        value = _converter(kind.valueType)
        return lambda v: None if v is None else {k: value(x) for k, x in v}
    if isinstance(kind, StructType):
        fields = [(f.name, _converter(f.dataType)) for f in kind.fields]
        return lambda v: None if v is None else {n: c(v.get(n)) for n, c in fields}
    if isinstance(kind, TimestampType):  # as Spark hands it to Python: naive local time
        return lambda v: None if v is None else v.astimezone().replace(tzinfo=None).isoformat()
    return _jsonable


# -- the row path -------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """A Spark value as JSON data: dates and timestamps as ISO text, decimals as text."""
    if isinstance(value, Row):
        return {k: _jsonable(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def _utc(value: datetime, kind: str) -> datetime:
    """A Spark timestamp as naive UTC: TIMESTAMP_NTZ values are taken as UTC already, and
    TIMESTAMP values arrive as naive datetimes in the Python worker's local time."""
    if kind == "ntz" and value.tzinfo is None:
        return value
    return value.astimezone(timezone.utc).replace(tzinfo=None)


def staged_from_rows(rows: Iterable[Row], options: WriteOptions) -> pa.Table:
    """Spark rows as staged rows (one Python pass per row)."""
    where = {name: i for i, name in enumerate(options.columns)}
    payload = [(c, where[c], c not in options.native) for c in options.payload]
    roles = [options.priority, options.run_at, options.dedup, options.key]
    found: list[list[Any]] = [[], [], [], []]
    texts = []
    for row in rows:
        data = {c: _jsonable(row[i]) if convert else row[i] for c, i, convert in payload}
        texts.append(_dumps(data))
        for role, values in zip(roles, found, strict=True):
            if role is not None:
                values.append(row[where[role]])
    kind = options.timestamps.get(options.run_at or "", "ltz")
    rank, due, unique, key = found
    special = (
        None if options.priority is None else pa.array(rank, pa.int64()),
        None
        if options.run_at is None
        else pa.array([_utc_or_none(v, kind) for v in due], TIMESTAMP),
        None if options.dedup is None else pa.array([_text_or_none(v) for v in unique], TEXT),
        None if options.key is None else pa.array([_text_or_none(v) for v in key], TEXT),
    )
    return _staged(len(texts), pa.array(texts, TEXT), special, options)


def _utc_or_none(value: datetime | None, kind: str) -> datetime | None:
    return None if value is None else _utc(value, kind)


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
