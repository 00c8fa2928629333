"""``dstl demo``: the flights landing day by day while the plane-statistics job runs
on Spark, then checked against a Spark SQL batch query over the same files, key by
key, for the job's output and for the state restored from its latest checkpoint.

Layout below the base path (an fsspec URL)::

    <base>/landing/      the producer's day files and _SUCCESS (dstltree.demo.producer)
    <base>/sink/         the job's exactly-once output (FileSink, Parquet)
    <base>/checkpoints/  checkpoint_dir: <base>/checkpoints/plane-stats/ holds the job's
                         checkpoints, changelog and snapshots

Steps of :func:`run_demo`: clear those folders (``fresh``), start the producer, run
the job until the source is finished (:func:`run_job`; with ``rescale_to``, first a
run stopped after ``rescale_after_s`` seconds, then a run with ``rescale_to`` tasks
resuming from its final checkpoint), then the checks (dstltree.demo.checks) and the
report.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstltree.demo.checks import batch_stats, compare, sink_summary
from dstltree.demo.flights import SINK_SCHEMA, PlaneStats, has_distance
from dstltree.demo.producer import FlightsProducer, Pace
from dstltree.demo.report import run_figures
from dstltree.sparkplug import FileSink, FileSource, StreamingJob
from dstltree.sparkplug.keygroups import DEFAULT_MAX_PARALLELISM
from dstltree.storage.store import ObjectStore

JOB_NAME = "plane-stats"
FOLDERS = ("landing", "sink", "checkpoints")

#: restore_all(store, checkpoint, max_parallelism) -> state name -> key -> value
RestoreAll = Callable[[ObjectStore, Any, int], dict[str, dict[Any, Any]]]
#: (records in the latest checkpoint, records to land, driver's coordinator statistics)
Progress = Callable[[int, int, Any], None]


@dataclass(frozen=True)
class DemoOptions:
    """Flags of ``dstl demo``. Times in seconds.

    ``tasks``: parallelism; ``kill_task_after`` > 0 kills the last task hard after that
    many checkpoints in the first attempt (a crash drill); ``producer_seconds``: the
    whole input lands over about this long unless ``records_per_second`` > 0 sets the
    rate (both 0: as fast as possible); ``source_rate``: records per second each task
    reads at most (0: unlimited); ``limit_records``: the first N flights only;
    ``rescale_to`` > 0: stop after ``rescale_after_s`` and resume with that many tasks;
    ``dfs_faults``: a fault spec for the checkpoint directory only
    (dstltree.storage.targets.with_faults); ``fresh``: delete the three folders first."""

    base_path: str
    topology: Path | None = Path("deploy/local.yaml")
    master: str = "local[4]"
    tasks: int = 4
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    checkpoint_interval: float = 0.3
    materialization_interval: float = 3.0
    kill_task_after: int = 8
    storage_options: dict[str, Any] = field(default_factory=dict)
    metrics_port: int | None = None
    limit_records: int | None = None
    producer_seconds: float = 75.0
    records_per_second: float = 0.0
    source_rate: float = 0.0
    rescale_to: int = 0
    rescale_after_s: float = 20.0
    dfs_faults: str = ""
    fresh: bool = True

    def url(self, folder: str) -> str:
        """``<base_path>/<folder>``; a local base path made absolute (Spark executors
        may run in another working directory)."""
        base = self.base_path.rstrip("/")
        if "://" not in base and "::" not in base:
            base = os.path.abspath(base)
        return base + "/" + folder

    def checkpoint_target(self) -> tuple[str, dict[str, Any]]:
        """(checkpoint_dir URL, its storage options), behind ``faulty::`` with
        ``dfs_faults``. Raises ValueError for a bad fault spec."""
        url = self.url("checkpoints")
        if not self.dfs_faults:
            return url, dict(self.storage_options)
        from dstltree.storage.targets import with_faults

        return with_faults(url, self.storage_options, self.dfs_faults)


def clear(opts: DemoOptions) -> None:
    """Delete every file below the landing, sink and checkpoint folders (a fresh run).
    Raises StorageError."""
    for folder in FOLDERS:
        store = ObjectStore(opts.url(folder), opts.storage_options)
        store.delete(store.list_files(store.base_url))


def run_job(
    spark: Any,
    opts: DemoOptions,
    landing_url: str,
    sink_url: str,
    until: str | float | None,
    *,
    parallelism: int | None = None,
    drill: bool = False,
    progress: Callable[[Any], None] | None = None,
    stop: threading.Event | None = None,
) -> Any:
    """Build the plane-statistics job on the public API and run it until ``until``
    (``"end"``, seconds or None, as ``StreamingJob.run``); blocking. ``parallelism``
    overrides ``opts.tasks``; ``drill``: arm the crash drill (``kill_task_after``);
    ``progress``: the driver's progress hook; ``stop``: an Event that stops the job
    gracefully when set (a failed producer). Returns the ``JobResult``; raises what
    ``StreamingJob.run`` raises."""
    from dstltree.sparkplug import CrashDrill

    tasks = parallelism or opts.tasks
    checkpoint_dir, checkpoint_options = opts.checkpoint_target()
    options: dict[str, Any] = {
        "master": opts.master,
        "metrics_port": opts.metrics_port,
        "source_rate": opts.source_rate,
    }
    if drill and opts.kill_task_after > 0:
        options["crash_drill"] = CrashDrill(task=tasks - 1, after_checkpoints=opts.kill_task_after)
    if progress is not None:
        options["progress"] = progress
    job = StreamingJob(
        spark,
        name=JOB_NAME,
        checkpoint_dir=checkpoint_dir,
        storage_options=checkpoint_options,
        topology=opts.topology,
        parallelism=tasks,
        max_parallelism=opts.max_parallelism,
        checkpoint_interval=opts.checkpoint_interval,
        materialization_interval=opts.materialization_interval,
        **options,
    )
    (
        job.source(FileSource(landing_url, format="parquet", storage_options=opts.storage_options))
        .filter(has_distance)
        .key_by("tailnum")
        .process(PlaneStats())
        .sink(
            FileSink(
                sink_url, format="parquet", storage_options=opts.storage_options, schema=SINK_SCHEMA
            )
        )
    )
    with _stop_when_set(stop, job.stop):
        return job.run(until=until)


@contextlib.contextmanager
def _stop_when_set(event: threading.Event | None, stop: Callable[[], None]) -> Iterator[None]:
    """While the block runs, a daemon thread calls ``stop()`` once ``event`` is set."""
    if event is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.1):
            if event.is_set():
                stop()
                return

    t = threading.Thread(target=watch, name="demo-stop-watch", daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join(timeout=5)


def driver_progress(progress: Progress, total: int, every_s: float = 0.25) -> Callable[[Any], None]:
    """The driver's progress hook (called with its attempt driver, about every 50 ms)
    turned into ``progress(records, total, stats)`` at most every ``every_s`` seconds.
    Reads the driver's ``observed.records`` and ``coord.statistics()``; skips silently
    where those are missing (the hook must never fail the job)."""
    last = [0.0]

    def hook(driver: Any) -> None:
        now = time.monotonic()
        if now - last[0] < every_s:
            return
        last[0] = now
        try:
            records, stats = driver.observed.records, driver.coord.statistics()
        except AttributeError:
            return
        progress(records, total, stats)

    return hook


def run_jobs(
    spark: Any, opts: DemoOptions, producer: FlightsProducer, progress: Progress | None
) -> list[Any]:
    """The job's runs over the producer's landing URL (one, or two with a rescale);
    a producer failure stops the job and is raised (ProducerError) after it."""
    hook = None if progress is None else driver_progress(progress, producer.total_records)
    landing, sink = producer.url, opts.url("sink")
    common: dict[str, Any] = {"progress": hook, "stop": producer.failed}
    results = []
    if opts.rescale_to > 0:
        results.append(
            run_job(spark, opts, landing, sink, opts.rescale_after_s, drill=True, **common)
        )
        producer.raise_if_failed()
        results.append(
            run_job(spark, opts, landing, sink, "end", parallelism=opts.rescale_to, **common)
        )
    else:
        results.append(run_job(spark, opts, landing, sink, "end", drill=True, **common))
    producer.raise_if_failed()
    return results


def _restore_all() -> RestoreAll:
    from dstltree.sparkplug.restore import restore_all

    return restore_all


def run_demo(
    opts: DemoOptions,
    progress: Progress | None = None,
    restore: RestoreAll | None = None,
) -> dict[str, Any]:
    """Run the demo end to end (module docstring); returns the report (README, "What
    make demo does"). ``restore``: ``restore_all(store, checkpoint, max_parallelism)``
    (default: dstltree.sparkplug.restore's). Blocking. Raises ProducerError when the
    producer fails, and what the job raises (JobFailedError, RescaleError,
    StorageError)."""
    from dstltree.sparkplug.spark_session import spark_session

    restore_fn = restore or _restore_all()
    started = time.monotonic()
    if opts.fresh:
        clear(opts)
    producer = FlightsProducer(
        opts.url("landing"),
        opts.storage_options,
        Pace(opts.records_per_second, opts.producer_seconds),
        opts.limit_records,
    )
    spark = spark_session(opts.master)
    try:
        producer.start()
        results = run_jobs(spark, opts, producer, progress)
        checkpoint_dir, checkpoint_options = opts.checkpoint_target()
        store = ObjectStore(checkpoint_dir.rstrip("/") + "/" + JOB_NAME, checkpoint_options)
        restored = restore_fn(store, results[-1].run.latest, opts.max_parallelism)
        verdicts = compare(
            batch_stats(spark, producer.url, opts.storage_options),
            sink_summary(spark, opts.url("sink"), opts.storage_options),
            restored,
        )
    finally:
        producer.stop()
        producer.join(timeout=30)
        spark.stop()
    tasks = opts.rescale_to or opts.tasks
    return {
        **run_figures(results, tasks, opts.master, set(store.list_objects())),
        **verdicts,
        "base_path": opts.base_path,
        "metrics": results[-1].run.metrics,
        "wall_s": round(time.monotonic() - started, 1),
    }
