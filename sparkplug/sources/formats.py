"""Reading one file as records from an offset, with pyarrow, batch by batch.

- parquet (``pyarrow.parquet``): row groups wholly before the offset are not read (the
  footer gives each group's row count); the first group read is trimmed to the offset.
- csv (``pyarrow.csv.open_csv``, header row = column names) and json lines
  (``pyarrow.json.open_json``): streamed in blocks of
  ``BLOCK_BYTES``; a record cannot be found without parsing the ones before it, so
  records before the offset are parsed but never converted to Python. Compressed
  files (``.gz``, ``.bz2``, ``.zst``, ...) are decompressed by name (fsspec). A file of
  zero bytes holds zero records. Column types are inferred from the first block unless
  ``schema`` gives them (some or all columns): a column that is null throughout the
  first block and holds values later fails with a SourceError naming the row; pass its
  type in ``schema``.

No file is loaded whole. Records are dicts with plain values
(dstltree.sparkplug.sources.values). A failure raises SourceError naming the file and
the row (0-based record index) where it is known: the row pyarrow names for json, the
offending line for a csv row with a wrong column count or a value that does not parse,
the first row of the failing batch otherwise, none for an unreadable parquet footer.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from contextlib import ExitStack
from typing import IO, Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem
from fsspec.utils import infer_compression

from dstltree.sparkplug.sources.base import Record, SourceError
from dstltree.sparkplug.sources.values import plain

FORMATS = ("parquet", "csv", "json")
#: bytes per csv/json block (one record batch each)
BLOCK_BYTES = 1 << 20
#: rows per parquet record batch
PARQUET_BATCH_ROWS = 8192

Batches = Iterator[pa.RecordBatch]
#: pyarrow's messages for a file of zero bytes
_EMPTY = ("Empty CSV file", "Empty JSON stream")


class _Progress:
    """How far reading got: ``row`` = index of the first row of the next batch; None
    while a parquet footer is being read."""

    row: int | None = None


def read_file(
    fs: AbstractFileSystem, path: str, fmt: str, offset: int, schema: pa.Schema | None = None
) -> Iterator[Record]:
    """Records ``offset, offset + 1, ...`` of the file ``path`` on ``fs`` in format
    ``fmt`` (one of :data:`FORMATS`); ``schema``: column types for csv and json (unused
    for parquet, whose files carry theirs). Raises SourceError (file, row) for unreadable
    content and for an offset past the file's last record; ValueError for an unknown
    format or a negative offset."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {FORMATS}")
    if offset < 0:
        raise ValueError(f"offset {offset} < 0")
    progress = _Progress()
    with ExitStack() as stack:
        try:
            batches = _open(stack, fs, path, fmt, schema, offset, progress)
            for batch in batches:
                yield from _records(batch)
                progress.row = (progress.row or 0) + batch.num_rows
        except (pa.ArrowException, OSError, EOFError) as e:
            raise _error(fs, path, fmt, progress.row, e) from e


def _open(
    stack: ExitStack,
    fs: AbstractFileSystem,
    path: str,
    fmt: str,
    schema: pa.Schema | None,
    offset: int,
    p: _Progress,
) -> Batches:
    """The batches of ``path`` from ``offset`` on; the file is closed with ``stack``."""
    if fmt == "parquet":
        f = stack.enter_context(fs.open(path, "rb"))
        return _parquet(f, offset, path, p)
    f = stack.enter_context(fs.open(path, "rb", compression=infer_compression(path)))
    p.row = 0
    try:
        reader: Any = _text_reader(f, fmt, schema)
    except pa.ArrowInvalid as e:
        if not str(e).startswith(_EMPTY):
            raise
        reader = ()  # an empty file holds no records
    return _trim(iter(reader), offset, path, p)


def _text_reader(f: IO[bytes], fmt: str, schema: pa.Schema | None) -> Any:
    if fmt == "csv":
        types = {n: schema.field(n).type for n in schema.names} if schema else None
        return pa_csv.open_csv(
            f,
            read_options=pa_csv.ReadOptions(block_size=BLOCK_BYTES),
            convert_options=pa_csv.ConvertOptions(column_types=types),
        )
    return pa_json.open_json(
        f,
        read_options=pa_json.ReadOptions(block_size=BLOCK_BYTES),
        parse_options=pa_json.ParseOptions(explicit_schema=schema),
    )


def _parquet(f: IO[bytes], offset: int, path: str, p: _Progress) -> Batches:
    pf = pq.ParquetFile(f)
    meta = pf.metadata
    start, first = 0, 0
    while first < meta.num_row_groups and start + meta.row_group(first).num_rows <= offset:
        start += meta.row_group(first).num_rows
        first += 1
    if first == meta.num_row_groups:
        _check_end(path, start, offset)
        return iter(())
    p.row = start
    groups = list(range(first, meta.num_row_groups))
    batches = pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=groups)
    return _trim(batches, offset, path, p)


def _trim(batches: Batches, offset: int, path: str, p: _Progress) -> Batches:
    """The batches from row ``p.row`` on, without the rows before ``offset``;
    ``p.row`` follows the batches skipped whole. Raises SourceError if the rows end
    before ``offset``."""
    row = p.row or 0
    for batch in batches:
        end = row + batch.num_rows
        if end <= offset:
            row = p.row = end
            continue
        p.row = max(row, offset)
        yield batch.slice(p.row - row)
        break
    else:
        _check_end(path, row, offset)
        return
    yield from batches


def _check_end(path: str, rows: int, offset: int) -> None:
    if offset > rows:
        raise SourceError(path, f"offset {offset} is past the end ({rows} records)")


def _records(batch: pa.RecordBatch) -> list[Record]:
    names = batch.schema.names
    columns = [_column(col) for col in batch.columns]
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def _column(col: pa.Array) -> list[Any]:
    values = col.to_pylist()
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_boolean(t):
        return values
    return [plain(v) for v in values]


def _error(
    fs: AbstractFileSystem, path: str, fmt: str, row: int | None, e: Exception
) -> SourceError:
    """The SourceError for ``e`` raised while reading rows from ``row`` on (None: no
    row was reached)."""
    detail = f"{type(e).__name__}: {e}"
    if row is None:
        return SourceError(path, detail)
    found = _JSON_ROW.search(str(e)) if fmt == "json" else None
    if found:
        return SourceError(path, detail, row + int(found.group(1)))
    if fmt == "csv" and isinstance(e, pa.ArrowInvalid):
        text = fs.open(path, "rt", compression=infer_compression(path), newline="")
        located = _locate_csv_row(text, row, str(e))
        return SourceError(path, detail, row if located is None else located)
    return SourceError(path, detail, row)


_JSON_ROW = re.compile(r"in row (\d+)")
_CSV_COLUMNS = re.compile(r"Expected (\d+) columns, got (\d+)")
_CSV_VALUE = re.compile(r"column #(\d+): CSV conversion error to \w+: invalid value '(.*)'$")


def _locate_csv_row(text: IO[str], start: int, message: str) -> int | None:
    """The index of the first record at or after ``start`` that pyarrow's ``message``
    describes: a wrong column count, or the invalid value in the named column. None if
    no record matches (or the message names neither)."""
    columns = _CSV_COLUMNS.search(message)
    value = _CSV_VALUE.search(message)
    with text:
        rows = csv.reader(text)
        width = len(next(rows, []))
        for i, fields in enumerate(rows):
            if i < start:
                continue
            if columns and len(fields) != width:
                return i
            k = int(value.group(1)) if value else -1
            if value and k < len(fields) and fields[k] == value.group(2):
                return i
    return None
