"""The public API of a keyed stateful job on Spark (after Flink's DataStream API)::

    job = StreamingJob(spark, name="plane-stats", checkpoint_dir=URL, topology=PATH,
                       parallelism=4)
    (job.source(FileSource(URL, format="parquet"))
        .filter(lambda r: r["distance"] > 0)
        .key_by("tailnum")
        .process(PlaneStats())
        .sink(FileSink(URL, format="parquet")))
    result = job.run(until="end")

Exactly once: after any failure the tasks restore the latest completed checkpoint (state,
split offsets) and the sink makes output visible only when its checkpoint completes
(docs/user-guide.md).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dstltree.client.segment import CODECS
from dstltree.sparkplug.keygroups import DEFAULT_MAX_PARALLELISM
from dstltree.sparkplug.pipeline import KeyedProcessFunction, KeySelector, Pipeline
from dstltree.sparkplug.sources.base import Record, Source

if TYPE_CHECKING:
    from dstltree.sparkplug.job import JobRun
    from dstltree.sparkplug.sinks.sink import FileSink

Until = str | float | None


@dataclass(frozen=True)
class CrashDrill:
    """Kill task ``task`` hard (SIGKILL of its process) once, in the run's first attempt,
    when checkpoint ``after_checkpoints + 1`` reaches it: a recovery drill.

    ``with_channel_state``: kill it instead, after at least ``after_checkpoints``
    barriers, as soon as it learns that the checkpoint it last acknowledged is complete
    and holds in-flight records of its own (unaligned checkpoints, FLIP-76): no later
    checkpoint can complete without the task, so the recovery restores that channel
    state."""

    task: int
    after_checkpoints: int
    with_channel_state: bool = False


class DataStream:
    """Records from a source through stateless steps; :meth:`key_by` makes it keyed."""

    def __init__(self, job: StreamingJob, pipeline: Pipeline) -> None:
        self._job, self._pipeline = job, pipeline

    def filter(self, fn: Callable[[Record], bool]) -> DataStream:
        """Keep the records for which ``fn(record)`` is true."""
        self._pipeline.steps.append(("filter", fn))
        return self

    def map(self, fn: Callable[[Record], Record]) -> DataStream:
        """Replace each record by ``fn(record)`` (a dict)."""
        self._pipeline.steps.append(("map", fn))
        return self

    def key_by(self, key: KeySelector) -> KeyedStream:
        """Key the records by a column name or by ``key(record)``; keys are None, bool,
        int, str, bytes or tuples of them (a null key is a key)."""
        self._pipeline.key_by = key
        return KeyedStream(self._job, self._pipeline)


class KeyedStream:
    """A keyed stream: :meth:`process` adds the stateful function."""

    def __init__(self, job: StreamingJob, pipeline: Pipeline) -> None:
        self._job, self._pipeline = job, pipeline

    def process(self, function: KeyedProcessFunction) -> ProcessedStream:
        """Run ``function`` on every record, in the task that owns the key's key group."""
        if not isinstance(function, KeyedProcessFunction):
            raise TypeError("process() takes a KeyedProcessFunction")
        self._pipeline.function = function
        return ProcessedStream(self._pipeline)


class ProcessedStream:
    """The keyed function's output: :meth:`sink` names where its rows go."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline = pipeline

    def sink(self, sink: FileSink) -> None:
        """Write every emitted row to ``sink`` exactly once (two-phase commit)."""
        self._pipeline.sink = sink


@dataclass(frozen=True)
class JobResult:
    """What one :meth:`StreamingJob.run` did. ``records``: records the keyed function
    processed in this run (each once, across recoveries); ``recoveries``: failed
    attempts restarted; ``finished``: the run ended with a final checkpoint;
    ``rescaled_from``: the parallelism of the checkpoint this run restored from, where
    it differed (None otherwise); ``run``: everything else the driver saw."""

    checkpoints_completed: int
    checkpoints_aborted: int
    recoveries: int
    records: int
    finished: bool
    rescaled_from: int | None
    source_files: int
    run: JobRun


class StreamingJob:
    """A keyed stateful job on Spark. ``checkpoint_dir`` (an fsspec URL) holds the job's
    checkpoints and changelog below ``<checkpoint_dir>/<name>``; a job with the same
    ``name`` and ``checkpoint_dir`` as an earlier run resumes from its latest completed
    checkpoint with the ``parallelism`` given now (same ``max_parallelism``, otherwise
    RescaleError). ``topology``: the aggregator nodes' YAML (None: tasks write their
    changelog straight to the DFS). Intervals in seconds. Keyword options: ``master``
    (default: the session's), ``max_attempts``, ``retained_checkpoints``,
    ``metrics_port``, ``crash_drill`` (a :class:`CrashDrill`), ``source_rate``
    (records per second per task's reader, 0 = unlimited), ``batch_records``,
    ``checkpoint_timeout``, ``max_concurrent_checkpoints`` (checkpoints in flight at
    most, Flink's ``maxConcurrentCheckpoints``: triggers follow
    ``checkpoint_interval`` while earlier checkpoints complete, in order; default
    ``DEFAULT_MAX_CONCURRENT_CHECKPOINTS``), ``persist_changelog``
    (False: the minimal changelog, for benchmarks: state changes are not logged and
    checkpoints hold only offsets and output, so state is NOT recoverable), ``auth``
    (default True: CURVE on every socket, per-job keys made here and shipped to the
    tasks; False = plaintext, an explicit choice; see docs/deploy.md), ``compression``
    (None, default: segments stored as they are; ``"zstd"``: each changelog segment
    compressed, named in its header so readers need no setting; as Flink's changelog,
    off by default). Raises ValueError for an unknown codec."""

    def __init__(
        self,
        spark: Any,
        name: str,
        checkpoint_dir: str,
        storage_options: dict[str, Any] | None = None,
        topology: str | Path | None = None,
        parallelism: int = 4,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        checkpoint_interval: float = 0.3,
        materialization_interval: float = 3.0,
        **options: Any,
    ) -> None:
        from dstltree.sparkplug.job import RunOptions

        if not name or "/" in name:
            raise ValueError(f"job name {name!r} must be non-empty, without '/'")
        self.spark = spark
        self.name = name
        self.options = RunOptions(
            name=name,
            base_path=absolute_url(checkpoint_dir).rstrip("/") + "/" + name,
            storage_options=dict(storage_options or {}),
            topology=None if topology is None else Path(topology),
            parallelism=parallelism,
            max_parallelism=max_parallelism,
            checkpoint_interval=checkpoint_interval,
            materialization_interval=materialization_interval,
            **options,
        )
        if self.options.compression not in (None, *CODECS):
            raise ValueError(f"compression {self.options.compression!r}: known {CODECS}")
        self._pipeline: Pipeline | None = None
        self._stop = threading.Event()

    def source(self, source: Source) -> DataStream:
        """The job's input (one source per job)."""
        if self._pipeline is not None:
            raise ValueError("the job has a source already")
        self._pipeline = Pipeline(source)
        return DataStream(self, self._pipeline)

    def run(self, until: Until = "end") -> JobResult:
        """Run the job; blocking. ``until``: ``"end"`` (the source is finished and a
        final checkpoint completed), seconds (then a graceful stop), or None (until
        :meth:`stop` or SIGTERM). Every graceful stop ends with a final checkpoint, so a
        later run resumes exactly there. Raises ValueError for an incomplete job,
        RescaleError for a changed max_parallelism, JobFailedError when a record cannot
        be used or the attempts are exhausted."""
        from dstltree.sparkplug.job import run_pipeline

        if self._pipeline is None:
            raise ValueError("the job has no source(...)")
        self._pipeline.check()
        _absolute_locations(self._pipeline)
        if until is not None and until != "end" and not isinstance(until, int | float):
            raise ValueError(f"until must be 'end', seconds or None, got {until!r}")
        self._stop.clear()
        restore = _on_sigterm(self.stop)
        try:
            run = run_pipeline(self.spark, self._pipeline, self.options, until, self._stop)
        finally:
            restore()
        return JobResult(
            checkpoints_completed=run.stats.checkpoints_completed,
            checkpoints_aborted=run.stats.checkpoints_aborted,
            recoveries=run.recoveries,
            records=run.records,
            finished=run.finished,
            rescaled_from=run.rescaled_from,
            source_files=run.source_files,
            run=run,
        )

    def stop(self) -> None:
        """Ask a running :meth:`run` to stop gracefully (a final checkpoint, then
        return). Thread-safe; harmless when not running."""
        self._stop.set()


def absolute_url(url: str) -> str:
    """``url`` with a local relative path made absolute on the driver (executors run in
    other working directories); URLs with a scheme are returned as they are."""
    if "://" in url or "::" in url:
        return url
    return os.path.abspath(url)


def _absolute_locations(pipeline: Pipeline) -> None:
    """Make the source's and the sink's local relative URLs absolute."""
    source = pipeline.source
    if isinstance(getattr(source, "url", None), str):
        source.url = absolute_url(source.url)  # type: ignore[attr-defined]
    if pipeline.sink is not None:
        pipeline.sink = replace(pipeline.sink, url=absolute_url(pipeline.sink.url))


def _on_sigterm(handler: Callable[[], None]) -> Callable[[], None]:
    """Make SIGTERM call ``handler`` while the job runs (main thread only); returns the
    function that restores the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: handler())

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore
