"""Rows of a file sink: the check of one row at ``write`` (msgpack-encodable values,
what the format can hold) and the conversion of a batch of rows to an Arrow record
batch with a fixed schema. A row is a ``dict[str, value]``; values are what msgpack
encodes without extensions: None, bool, int in [-2**63, 2**64), float, str, bytes, and
lists/tuples and str-keyed dicts of those."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from dstltree.sparkplug.sinks.errors import SinkRowError, SinkSchemaError

_SCALARS = (type(None), bool, int, float, str, bytes)
_INT_RANGE = range(-(2**63), 2**64)
_MAX_DEPTH = 32


def _value_problem(value: Any, fmt: str, depth: int = 0) -> str | None:
    """Why ``value`` cannot be written in ``fmt`` (None if it can)."""
    if depth > _MAX_DEPTH:
        return f"nested deeper than {_MAX_DEPTH} levels"
    if isinstance(value, _SCALARS):
        if isinstance(value, int) and not isinstance(value, bool) and value not in _INT_RANGE:
            return f"integer {value} does not fit 64 bits"
        if fmt != "parquet" and isinstance(value, bytes):
            return f"bytes cannot be written as {fmt.upper()} (decode or base64-encode them)"
        return None
    if isinstance(value, list | tuple | dict) and fmt == "csv":
        return f"{type(value).__name__} cannot be written as CSV (scalars only)"
    if isinstance(value, list | tuple):
        return next((p for v in value if (p := _value_problem(v, fmt, depth + 1))), None)
    if isinstance(value, dict):
        if any(not isinstance(k, str) for k in value):
            return "a nested dict has a key that is not a string"
        return next((p for v in value.values() if (p := _value_problem(v, fmt, depth + 1))), None)
    return f"{type(value).__name__} value {value!r:.60} is not msgpack-encodable"


def check_row(row: Mapping[str, Any], fmt: str) -> None:
    """Raise :class:`SinkRowError` naming the first column whose name or value cannot
    be written in format ``fmt`` (``parquet``, ``csv`` or ``json``)."""
    if not isinstance(row, Mapping):
        raise SinkRowError("<row>", f"a row must be a dict, got {type(row).__name__}")
    for column, value in row.items():
        if not isinstance(column, str):
            raise SinkRowError(str(column), "column names must be strings")
        if type(value) in _SCALARS and type(value) is not int and type(value) is not bytes:
            continue  # the common case, without a call
        problem = _value_problem(value, fmt)
        if problem is not None:
            raise SinkRowError(column, problem)


def _columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every column of ``rows``, in first-seen order."""
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return list(seen)


def _array(column: str, values: list[Any], type_: pa.DataType | None) -> pa.Array:
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        want = f"type {type_}" if type_ is not None else "one Arrow type"
        raise SinkSchemaError(column, f"values do not fit {want}: {e}") from e


def to_record_batch(rows: Sequence[Mapping[str, Any]], schema: pa.Schema | None) -> pa.RecordBatch:
    """The rows as one record batch: with ``schema``, every column of the schema (missing
    values null); without, the columns of these rows with inferred types (then fix the
    schema to the returned batch's). Raises :class:`SinkSchemaError` naming a column
    that is not in ``schema`` or whose values do not fit its type."""
    if schema is None:
        names = _columns(rows)
        arrays = [_array(c, [r.get(c) for r in rows], None) for c in names]
        return pa.RecordBatch.from_arrays(arrays, names=names)
    unknown = [c for c in _columns(rows) if schema.get_field_index(c) < 0]
    if unknown:
        raise SinkSchemaError(unknown[0], f"not a column of the schema {schema.names}")
    arrays = [_array(f.name, [r.get(f.name) for r in rows], f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
