"""The three part-file formats of a file sink. A :class:`PartFormat` turns a batch of
rows into a payload on the caller's thread (where schema errors belong) and writes
payloads to one part file (a binary file object) on the writer's I/O thread:

- ``parquet``: one Parquet file per part, one row group per batch (pyarrow
  ``ParquetWriter``), the schema fixed by the sink or by the writer's first batch;
- ``csv``: a header line then the rows (pyarrow ``CSVWriter``), scalars only;
- ``json``: JSON Lines, one object per row (what ``spark.read.json`` and
  ``pyarrow.json.read_json`` read), no bytes.
"""

from __future__ import annotations

import json
from typing import IO, Any, Protocol

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from dstltree.sparkplug.sinks.rows import to_record_batch

FORMATS = ("parquet", "csv", "json")


class PartFile(Protocol):
    """One open part file: ``write`` payloads in order, then ``finish`` (writes the
    format's trailer; the file object stays open for the caller to sync and close)."""

    def write(self, payload: Any) -> None: ...

    def finish(self) -> None: ...


class _ArrowPart:
    def __init__(self, f: IO[bytes], kind: str) -> None:
        self._f = f
        self._kind = kind
        self._writer: pq.ParquetWriter | pa_csv.CSVWriter | None = None

    def write(self, payload: pa.RecordBatch) -> None:
        if self._writer is None:
            cls = pq.ParquetWriter if self._kind == "parquet" else pa_csv.CSVWriter
            self._writer = cls(self._f, payload.schema)
        self._writer.write_batch(payload)

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.close()


class _JsonPart:
    def __init__(self, f: IO[bytes]) -> None:
        self._f = f

    def write(self, payload: bytes) -> None:
        self._f.write(payload)

    def finish(self) -> None:
        self._f.flush()


class PartFormat:
    """One writer's format state: ``name`` (``parquet``/``csv``/``json``) and, for the
    Arrow formats, the schema (given, or fixed by the first batch). Raises ValueError
    for an unknown format."""

    def __init__(self, name: str, schema: pa.Schema | None = None) -> None:
        if name not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {name!r}")
        self.name = name
        self.schema = schema

    def payload(self, rows: list[dict[str, Any]]) -> Any:
        """The rows encoded for :meth:`PartFile.write`. Raises SinkSchemaError."""
        if self.name == "json":
            lines = (json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in rows)
            return ("\n".join(lines) + "\n").encode()
        batch = to_record_batch(rows, self.schema)
        self.schema = batch.schema
        return batch

    def open(self, f: IO[bytes]) -> PartFile:
        """A part file writing to ``f``."""
        return _JsonPart(f) if self.name == "json" else _ArrowPart(f, self.name)
