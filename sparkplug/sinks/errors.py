"""Errors of the file sink (sparkplug/sinks). Storage failures leave as
:class:`dstltree.storage.errors.StorageError` (translated by
:func:`dstltree.storage.store.translate`, the cause chained); everything here derives
from :class:`SinkError`."""

from __future__ import annotations

from dstltree.storage.errors import DstlError


class SinkError(DstlError):
    """Base class of the sink's own errors."""


class SinkRowError(SinkError, TypeError):
    """A row handed to :meth:`SinkWriter.write` cannot be written: ``column`` names the
    column, the message says why (a value that msgpack cannot encode, a column name that
    is not a string, or a value the format cannot hold). The row is not buffered; the
    writer stays usable."""

    def __init__(self, column: str, detail: str) -> None:
        super().__init__(f"column {column!r}: {detail}")
        self.column = column


class SinkSchemaError(SinkError):
    """A batch of rows does not fit the writer's schema (a new column, or a value of
    another type than the column's): ``column`` names the column. The writer is failed
    afterwards (its buffered rows cannot be written): the task must restart from its
    last checkpoint. Give ``FileSink(schema=...)`` to fix the types up front."""

    def __init__(self, column: str, detail: str) -> None:
        super().__init__(f"column {column!r}: {detail}")
        self.column = column


class SinkCommitError(SinkError):
    """A committable cannot be committed: it names a path outside the sink's staging
    area (or fails :meth:`Committable.validate`), it is a multipart upload on a store
    without them, its staged output (file, or open multipart upload) is gone while its
    final file is missing (its rows are lost), or a final file of another size already
    holds its name."""
