"""The description of a file sink: what a job hands to the runtime. It is picklable
(it travels to the tasks) and creates the task-side writers and the driver-side
committer (sparkplug/sinks/writer.py, sparkplug/sinks/committer.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from dstltree.sparkplug.sinks.committer import SinkCommitter
from dstltree.sparkplug.sinks.formats import FORMATS
from dstltree.sparkplug.sinks.layout import EXTENSIONS
from dstltree.sparkplug.sinks.writer import SinkWriter
from dstltree.storage.store import ObjectStore


@dataclass(frozen=True)
class FileSink:
    """Exactly-once files under ``url`` (an fsspec URL: a local path, ``file://``,
    ``s3://bucket/prefix``, ...) in ``format`` ``parquet``, ``csv`` or ``json`` (JSON
    Lines). ``storage_options`` are fsspec's for the URL; ``schema`` fixes the column
    types (otherwise each writer infers them from its first batch); ``batch_rows`` rows
    make one record batch; at most ``max_pending_batches`` batches wait for the I/O
    thread; ``spill_dir`` is the local folder for part files of a remote sink (default:
    the system's temporary folder). One job per URL, and a job that starts without a
    checkpoint to restore needs an empty URL: final names restart at checkpoint 1,
    attempt 0. Raises ValueError for a bad format or count.

    Read the committed output with Spark (``spark.read.parquet(url)``), with
    ``pyarrow.dataset.dataset(url, format=...)`` / ``pandas.read_parquet(url)`` (both
    skip ``_staging``), or with :func:`dstltree.sparkplug.sinks.read_committed`
    (commit order)."""

    url: str
    format: str = "parquet"
    storage_options: dict[str, Any] | None = None
    schema: pa.Schema | None = None
    batch_rows: int = 8192
    max_pending_batches: int = 4
    spill_dir: str | None = None

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {self.format!r}")
        if self.batch_rows < 1 or self.max_pending_batches < 1:
            raise ValueError("batch_rows and max_pending_batches must be >= 1")

    @property
    def extension(self) -> str:
        return EXTENSIONS[self.format]

    def store(self) -> ObjectStore:
        """The store below the sink URL."""
        return ObjectStore(self.url, self.storage_options)

    def create_writer(self, task: int, attempt: int) -> SinkWriter:
        """The writer of task ``task`` in job attempt ``attempt`` (both >= 0)."""
        return SinkWriter(self, task, attempt)

    def create_committer(self) -> SinkCommitter:
        """The committer, on the driver."""
        return SinkCommitter(self)
