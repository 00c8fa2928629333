"""Exactly-once file sinks for keyed stateful jobs (two-phase commit, after Flink's
FileSink in flink-connector-files): :class:`FileSink` describes the output,
:class:`SinkWriter` stages one task's rows per checkpoint, :class:`SinkCommitter` makes
them visible when the checkpoint completes (docs/design.md, "sink commit" and the
invariant "Output becomes visible only when its checkpoint completes").

Modules: ``sink.py`` (the description), ``writer.py`` (task side), ``committer.py``
(driver side and its contract with the coordinator), ``layout.py`` (names and the
committable), ``formats.py``, ``rows.py`` (row checks, Arrow batches), ``files.py``
(what is atomic on which store), ``multipart.py`` (S3: staging as an open multipart
upload at the final key, committed by completing it), ``read.py``, ``errors.py``.
"""

from dstltree.sparkplug.sinks.committer import SinkCommitter
from dstltree.sparkplug.sinks.errors import (
    SinkCommitError,
    SinkError,
    SinkRowError,
    SinkSchemaError,
)
from dstltree.sparkplug.sinks.layout import Committable
from dstltree.sparkplug.sinks.read import committed_files, read_committed
from dstltree.sparkplug.sinks.sink import FileSink
from dstltree.sparkplug.sinks.writer import SinkWriter

__all__ = [
    "Committable",
    "FileSink",
    "SinkCommitError",
    "SinkCommitter",
    "SinkError",
    "SinkRowError",
    "SinkSchemaError",
    "SinkWriter",
    "committed_files",
    "read_committed",
]
