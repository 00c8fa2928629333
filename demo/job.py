"""``dstl demo``: the flights landing day by day while the plane-statistics job runs
on Spark, then checked against a Spark SQL batch query over the same files, key by
key, for the job's output and for the state restored from its latest checkpoint.

Each run lives under its own prefix ``<base>/<run-id>/`` (the base path an fsspec URL,
the run id a new ``run-YYYYmmdd-HHMMSS`` per run unless given), so runs never share or
delete each other's files::

    <base>/<run-id>/landing/      the producer's day files and _SUCCESS
                                  (dstltree.demo.producer)
    <base>/<run-id>/sink/         the job's exactly-once output (FileSink, Parquet)
    <base>/<run-id>/checkpoints/  checkpoint_dir: its plane-stats/ holds the job's
                                  checkpoints, changelog and snapshots

A run refuses to start over files already under its prefix (RunExistsError) unless
``fresh``, which deletes that prefix, and only that prefix, first.

Steps of :func:`run_demo`: check or clear the run's prefix (``fresh``), start the producer, run
the job until the source is finished (:func:`run_job`; with ``rescale_to``, first a
run stopped ``rescale_after_s`` seconds after its first checkpoint, then a run with
``rescale_to`` tasks resuming from its final checkpoint), then the checks
(dstltree.demo.checks) and the report.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstltree.coordinator.state import DEFAULT_MAX_CONCURRENT_CHECKPOINTS
from dstltree.demo.chaos import ChaosMonkey, compose, plan_chaos
from dstltree.demo.checks import batch_stats, compare, sink_summary
from dstltree.demo.flights import SINK_SCHEMA, PlaneStats, has_distance
from dstltree.demo.node_kill import NodeKill
from dstltree.demo.producer import FlightsProducer, Pace
from dstltree.demo.report import run_figures
from dstltree.sparkplug import FileSink, FileSource, StreamingJob
from dstltree.sparkplug.keygroups import DEFAULT_MAX_PARALLELISM
from dstltree.storage.store import ObjectStore

JOB_NAME = "plane-stats"
FOLDERS = ("landing", "sink", "checkpoints")
#: a run id: one path segment of letters, digits, ``.``, ``_``, ``-`` (not only dots)
RUN_ID = re.compile(r"(?!\.+$)[A-Za-z0-9._-]{1,128}")


class RunExistsError(RuntimeError):
    """The run's prefix already holds files and ``fresh`` was not asked for."""


def new_run_id(now: datetime.datetime | None = None) -> str:
    """``run-YYYYmmdd-HHMMSS`` of ``now`` (default: the current UTC time)."""
    now = now or datetime.datetime.now(datetime.UTC)
    return now.strftime("run-%Y%m%d-%H%M%S")


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
    ``rescale_to`` > 0: stop ``rescale_after_s`` after the first run's first completed
    checkpoint (:class:`RescaleStop`) and resume with that many tasks;
    ``dfs_faults``: a fault spec for the checkpoint directory only
    (dstltree.storage.targets.with_faults); ``chaos``: kill that many random tasks and
    nodes hard during the main job (dstltree.demo.chaos; ``chaos_seed`` draws them);
    ``kill_node_after`` > 0 kills one node below the root hard after that many
    checkpoints of the first run (dstltree.demo.node_kill);
    ``compression``: the codec of the changelog segments (None: off; "zstd");
    ``max_concurrent_checkpoints``: checkpoints in flight at most;
    ``checkpointing``, ``aligned_checkpoint_timeout``: aligned or unaligned
    checkpoints (FLIP-76; StreamingJob's options of the same names);
    ``run_id``: this run's folder below the
    base path (default: :func:`new_run_id`); ``fresh``: delete this run's folder
    ``<base>/<run_id>/`` first (nothing else, ever). Raises ValueError for a run id
    that is not one path segment (RUN_ID)."""

    base_path: str
    topology: Path | None = Path("local")  # a shipped topology or a file
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
    fresh: bool = False
    chaos: int = 0
    chaos_seed: int = 0
    kill_node_after: int = 0
    run_id: str = field(default_factory=new_run_id)
    compression: str | None = None
    max_concurrent_checkpoints: int = DEFAULT_MAX_CONCURRENT_CHECKPOINTS
    checkpointing: str = "aligned"
    aligned_checkpoint_timeout: float = 0.0

    def __post_init__(self) -> None:
        if not RUN_ID.fullmatch(self.run_id):
            raise ValueError(
                f"run id {self.run_id!r} must be one path segment of letters, digits, "
                "'.', '_' or '-' (at most 128)"
            )

    def prefix(self) -> str:
        """``<base_path>/<run_id>``, this run's own folder; a local base path made
        absolute (Spark executors may run in another working directory)."""
        base = self.base_path.rstrip("/")
        if "://" not in base and "::" not in base:
            base = os.path.abspath(base)
        return base + "/" + self.run_id

    def url(self, folder: str) -> str:
        """``<base_path>/<run_id>/<folder>``."""
        return self.prefix() + "/" + folder

    def checkpoint_target(self) -> tuple[str, dict[str, Any]]:
        """(checkpoint_dir URL, its storage options), behind ``faulty::`` with
        ``dfs_faults``. Raises ValueError for a bad fault spec."""
        return self.faulty_target("checkpoints")

    def faulty_target(self, folder: str) -> tuple[str, dict[str, Any]]:
        """(``<base_path>/<run_id>/<folder>``, its storage options), behind ``faulty::``
        with ``dfs_faults``. Raises ValueError for a bad fault spec."""
        url = self.url(folder)
        if not self.dfs_faults:
            return url, dict(self.storage_options)
        from dstltree.storage.targets import with_faults

        return with_faults(url, self.storage_options, self.dfs_faults)


def _run_files(opts: DemoOptions) -> tuple[ObjectStore, list[str]]:
    """The store at the run's prefix and every file below it (URLs)."""
    store = ObjectStore(opts.prefix(), opts.storage_options)
    return store, store.list_files(store.base_url)


def clear(opts: DemoOptions) -> int:
    """Delete every file below ``<base>/<run_id>/``, this run's prefix, and nothing
    else: a listed file outside it (a store that lists too much) is refused with
    ValueError before anything is deleted. Returns the files deleted. Raises
    StorageError."""
    store, files = _run_files(opts)
    root = store.base_url.rstrip("/") + "/"
    outside = [f for f in files if not f.startswith(root) or "/../" in f[len(root) - 1 :]]
    if outside:
        raise ValueError(f"refusing to delete {outside[0]}: not below the run's prefix {root}")
    return len(store.delete(files))


def check_new_run(opts: DemoOptions) -> None:
    """Raise RunExistsError when ``<base>/<run_id>/`` already holds files (a run id
    used before) and ``fresh`` is off; with ``fresh`` clear that prefix. Raises
    StorageError."""
    if opts.fresh:
        clear(opts)
        return
    store, files = _run_files(opts)
    if files:
        raise RunExistsError(
            f"{store.base_url} already holds {len(files)} files of an earlier run "
            f"{opts.run_id!r}: choose another --run-id, or --fresh to delete that run's "
            "files first"
        )


class RescaleStop:
    """When the first run of a rescale stops: ``seconds`` after its first completed
    checkpoint, so Spark's start-up (well over 10 s on a busy machine) never eats the
    run, or at once when ``failed`` (the producer's) is set. Duck-types the stop Event
    of :func:`run_job` (``is_set``); :meth:`hook` is a driver progress hook."""

    def __init__(
        self, seconds: float, failed: threading.Event, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.seconds, self.failed, self.clock = seconds, failed, clock
        self.first_checkpoint_at: float | None = None

    def hook(self, driver: Any) -> None:
        """Note when the first checkpoint completed (skips a driver without statistics)."""
        if self.first_checkpoint_at is not None:
            return
        try:
            completed = driver.coord.statistics().checkpoints_completed
        except AttributeError:
            return
        if completed >= 1:
            self.first_checkpoint_at = self.clock()

    def is_set(self) -> bool:
        first = self.first_checkpoint_at
        due = first is not None and self.clock() - first >= self.seconds
        return due or self.failed.is_set()


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
    stop: threading.Event | RescaleStop | None = None,
    monkey: ChaosMonkey | None = None,
    node_kill: NodeKill | None = None,
) -> Any:
    """Build the plane-statistics job on the public API and run it until ``until``
    (``"end"``, seconds or None, as ``StreamingJob.run``); blocking. ``parallelism``
    overrides ``opts.tasks``; ``drill``: arm the crash drill (``kill_task_after``);
    ``progress``: the driver's progress hook; ``stop``: an Event that stops the job
    gracefully when set (a failed producer, or a :class:`RescaleStop`); ``monkey``:
    chaos in this run (its task kills armed after the drill, its hook after
    ``progress``); ``node_kill``: its hook joins the progress hooks when ``drill`` is
    set. Returns the ``JobResult``; raises what ``StreamingJob.run`` raises."""
    from dstltree.sparkplug import CrashDrill

    tasks = parallelism or opts.tasks
    checkpoint_dir, checkpoint_options = opts.checkpoint_target()
    options: dict[str, Any] = {
        "master": opts.master,
        "metrics_port": opts.metrics_port,
        "source_rate": opts.source_rate,
        "compression": opts.compression,
        "max_concurrent_checkpoints": opts.max_concurrent_checkpoints,
        "checkpointing": opts.checkpointing,
        "aligned_checkpoint_timeout": opts.aligned_checkpoint_timeout,
    }
    drills = []
    if drill and opts.kill_task_after > 0:
        drills.append(CrashDrill(task=tasks - 1, after_checkpoints=opts.kill_task_after))
    if drill and node_kill is not None:
        progress = compose(progress, node_kill.hook)
    if monkey is not None:
        monkey.first = drills
        drills = monkey.drills()
        progress = compose(progress, monkey.hook)
        options["max_attempts"] = len(drills) + 3  # every kill costs an attempt
    if drills:
        options["crash_drill"] = drills[0] if len(drills) == 1 else tuple(drills)
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
def _stop_when_set(
    event: threading.Event | RescaleStop | None, stop: Callable[[], None]
) -> Iterator[None]:
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


def make_monkey(opts: DemoOptions, records: int) -> ChaosMonkey | None:
    """The chaos of ``opts.chaos`` kills (None for 0) for a main job over ``records``
    records: its expected length from the landing pace and the read rate, at least 10 s."""
    if opts.chaos <= 0:
        return None
    landing = records / opts.records_per_second if opts.records_per_second else 0.0
    landing = landing or opts.producer_seconds
    tasks = opts.rescale_to or opts.tasks
    reading = records / (tasks * opts.source_rate) if opts.source_rate else 0.0
    expected = max(landing, reading, 10.0)
    plan = plan_chaos(opts.chaos, tasks, expected, opts.chaos_seed)
    return ChaosMonkey(plan, seed=opts.chaos_seed)


def run_jobs(
    spark: Any,
    opts: DemoOptions,
    producer: FlightsProducer,
    progress: Progress | None,
    monkey: ChaosMonkey | None = None,
    node_kill: NodeKill | None = None,
) -> list[Any]:
    """The job's runs over the producer's landing URL (one, or two with a rescale);
    ``monkey`` brings chaos into the run that goes to the end. A producer failure stops
    the job and is raised (ProducerError) after it."""
    hook = None if progress is None else driver_progress(progress, producer.total_records)
    landing, sink = producer.url, opts.url("sink")
    common: dict[str, Any] = {"progress": hook, "stop": producer.failed, "node_kill": node_kill}
    if monkey is not None:
        common["monkey"] = monkey
    results = []
    if opts.rescale_to > 0:
        rescale = RescaleStop(opts.rescale_after_s, producer.failed)
        first = {**common, "monkey": None, "stop": rescale, "progress": compose(hook, rescale.hook)}
        results.append(run_job(spark, opts, landing, sink, None, drill=True, **first))
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
    check_new_run(opts)
    producer = FlightsProducer(
        opts.url("landing"),
        opts.storage_options,
        Pace(opts.records_per_second, opts.producer_seconds),
        opts.limit_records,
    )
    monkey = make_monkey(opts, producer.total_records)
    node_kill = NodeKill(opts.kill_node_after) if opts.kill_node_after > 0 else None
    spark = spark_session(opts.master)
    try:
        producer.start()
        results = run_jobs(spark, opts, producer, progress, monkey, node_kill)
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
        **store_figures(opts),
        "chaos": None if monkey is None else monkey.report(),
        "node_kill": None if node_kill is None else node_kill.report(),
        "base_path": opts.base_path,
        "run_id": opts.run_id,
        "run_prefix": opts.prefix(),
        "checkpointing": opts.checkpointing,
        "metrics": results[-1].run.metrics,
        "wall_s": round(time.monotonic() - started, 1),
    }


def store_figures(opts: DemoOptions) -> dict[str, Any]:
    """What ``dstl inspect`` sees of the job's checkpoint directory after the run
    (without injected faults): ``orphans`` (data files no retained checkpoint
    references, coordinator/cleanup.py ``find_orphans``), ``missing`` (referenced
    files absent), counts, and the first ``orphan_paths``. Raises StorageError."""
    from dstltree.coordinator.cleanup import find_orphans, list_data_files, normalize
    from dstltree.coordinator.store import CheckpointStore

    store = ObjectStore(opts.url("checkpoints") + "/" + JOB_NAME, opts.storage_options)
    referenced = {
        normalize(store, p)
        for c in CheckpointStore(store).list_retained()
        for p in c.referenced_paths()
    }
    orphans = find_orphans(store, referenced)
    present = {normalize(store, p) for p in list_data_files(store)}
    return {
        "orphans": len(orphans),
        "orphan_paths": orphans[:20],
        "missing": len(referenced - present),
    }
