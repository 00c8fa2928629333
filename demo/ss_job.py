"""``dstl demo --engine structured-streaming``: the demo's per-plane statistics as an
unmodified Spark Structured Streaming query (dstltree.demo.ss_query) whose state
store (RocksDB, changelog checkpointing) checkpoints through the tree, its driver
killed hard during the stream and restarted from its checkpoint, then checked.

Steps of :func:`run_ss_demo`:

1. check or clear the run's prefix (as the default engine, dstltree.demo.job), start
   the producer (the same landing files);
2. start the topology's nodes and one bridge here
   (``dstltree.structured_streaming.configure.start_local``, what ``configure(builder,
   topology=...)`` starts for a local master), objects under ``<run>/tree/``. They
   are the host's services and outlive the driver, as on a cluster;
3. run the query in a child process (its own driver JVM, ``configure(builder,
   socket=...)``), trigger every ``checkpoint_interval`` s; once ``kill_task_after``
   batches are committed, SIGKILL its process group (the Python driver and its JVM),
   as a user loses a driver; start it again from the checkpoint in a new process,
   which runs until the producer is done and finishes with ``availableNow``;
4. in a new session: the batch answer (Spark SQL over the landing files), the sink's
   latest row per plane and the state read back with the ``statestore`` data source
   (dstltree.demo.ss_checks), compared key by key; then stop the nodes and the bridge
   (the bridge writes its last manifest) and count files and objects.

Layout below ``<base>/<run-id>/``: ``landing/``, ``sink/`` (``batch-<id>.parquet``, one
per batch), ``checkpoints/plane-stats/`` (the query's checkpoint location with
``location="files"``; with ``dstl`` it is ``dstl://<run id>-plane-stats/`` and no
folder: every file of it is in the tree), ``tree/`` (the tree's objects and the
bridge's manifests; with ``dfs_faults`` behind ``faulty::``, e.g. on the FLIP-158 S3
model), ``logs/`` (each driver's output and progress events).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dstltree.demo.checks import batch_stats, sink_summary
from dstltree.demo.job import DemoOptions, check_new_run
from dstltree.demo.producer import FlightsProducer, Pace
from dstltree.demo.ss_checks import (
    CheckpointLocation,
    checkpoint_figures,
    committed_batches,
    planned_batches,
    progress_figures,
    read_progress,
    state_stats,
    tree_figures,
    verdicts,
)
from dstltree.structured_streaming.configure import TREE_SCHEME

ENGINE = "structured-streaming"
QUERY = "plane-stats"
MAX_FILES_PER_TRIGGER = 8  # landing files (days) one batch reads at most
POLL_S = 0.05  # seconds between looks at the checkpoint directory
MID_BATCH_WAIT_S = 5.0  # seconds to wait for a batch to be in flight at the kill
KILL_WAIT_S = 30.0  # seconds for a killed driver's processes to be gone
RUN_MARGIN_S = 300.0  # seconds a query run may take beyond the landing's duration
#: what the main job's defaults are, for the options this engine does not take
DEFAULTS = DemoOptions(base_path="")
UNSUPPORTED = (
    "rescale_to",
    "chaos",
    "kill_node_after",
    "dfs_faults",
    "metrics_port",
    "compression",
    "source_rate",
)
#: where the query's checkpoint location is: ``files`` a folder of the run
#: (``checkpoints/plane-stats/``: the metadata logs plain files, the state files in the
#: tree), ``dstl`` a ``dstl://`` location (every file in the tree; the tree's objects
#: may then be put on a latency model with ``dfs_faults``)
LOCATIONS = ("files", "dstl")

#: progress(message): one line per step
Progress = Callable[[str], None]


class QueryFailedError(RuntimeError):
    """A query process exited with an error or did not finish in time; the message
    holds the end of its output."""


def unsupported(opts: DemoOptions, location: str = "files") -> list[str]:
    """The options set in ``opts`` that this engine does not take with checkpoint
    ``location`` (:data:`LOCATIONS`) (attribute names; empty when none), and
    ``base_path`` when it is not a local folder (Spark reads the landing files and
    writes the sink itself, without an S3 connector). ``dfs_faults`` is taken with a
    ``dstl`` location: it applies to the tree's objects, which then hold every file of
    the checkpoint location."""
    allowed = {"dfs_faults"} if location == "dstl" else set()
    bad = [n for n in UNSUPPORTED if n not in allowed and getattr(opts, n) != getattr(DEFAULTS, n)]
    if "://" in opts.base_path.removeprefix("file://"):
        bad.append("base_path")
    return bad


def passed(r: dict[str, Any]) -> bool:
    """The verdict: state and sink equal the batch answer, no duplicate row, no
    ``*.changelog`` nor ``*.delta`` file under the checkpoint directory."""
    return bool(
        r["state_matches_batch"]
        and r["sink_matches_batch"]
        and r["sink_duplicate_rows"] == 0
        and r["state_files_ok"]
    )


def run_ss_demo(
    opts: DemoOptions,
    shuffle_partitions: int = 4,
    *,
    max_files_per_trigger: int = MAX_FILES_PER_TRIGGER,
    progress: Progress | None = None,
    hosts: int = 0,
    location: str = "files",
) -> dict[str, Any]:
    """Run the demo on this engine end to end (module docstring); returns the report.
    ``location``: ``files`` or ``dstl`` (:data:`LOCATIONS`).
    Uses from ``opts``: the base path (a local folder), run id, ``fresh``, topology,
    master, ``checkpoint_interval`` (the trigger, s), ``kill_task_after`` (kill the
    driver after that many committed batches; 0: never), the producer's pace and
    ``limit_records``. ``hosts`` > 0: the query's executors on that many worker hosts of
    a standalone cluster here, each with its own bridge (dstltree.demo.ss_hosts).
    Blocking. Raises ValueError for options it does not take
    (:func:`unsupported`), RunExistsError, QueryFailedError, ProducerError,
    BridgeStartError, JarBuildError."""
    from dstltree.demo.ss_hosts import demo_services

    if location not in LOCATIONS:
        raise ValueError(f"checkpoint location {location!r}: one of {', '.join(LOCATIONS)}")
    bad = unsupported(opts, location)
    if bad:
        raise ValueError(f"not with --engine {ENGINE}: {', '.join(bad)}")
    say = progress or (lambda _: None)
    started = time.monotonic()
    check_new_run(opts)
    producer = FlightsProducer(
        opts.url("landing"),
        opts.storage_options,
        Pace(opts.records_per_second, opts.producer_seconds),
        opts.limit_records,
    )
    if opts.topology is None:
        raise ValueError("this engine needs a topology")
    logs = Path(opts.url("logs"))
    logs.mkdir(parents=True, exist_ok=True)
    tree_url, tree_options = opts.faulty_target("tree")  # the location's store with dstl
    with demo_services(opts.topology, tree_url, hosts, logs / "hosts", tree_options) as (
        services,
        master,
    ):
        say(f"{services.nodes.count} nodes and a bridge on {services.socket}")
        if master is not None:
            say(f"{hosts} worker hosts, each with its own bridge: {master}")
        checkpoint = checkpoint_location(opts, location, services.socket)
        say(f"checkpoint location {checkpoint.url}")
        return _run_and_check(
            opts,
            producer,
            services,
            checkpoint,
            master,
            shuffle_partitions,
            max_files_per_trigger,
            say,
        ) | {"hosts": hosts, "wall_s": round(time.monotonic() - started, 1)}
    raise AssertionError("unreachable")  # the context manager does not swallow


def checkpoint_location(opts: DemoOptions, location: str, socket: Path) -> CheckpointLocation:
    """The query's checkpoint location: ``<run>/checkpoints/plane-stats`` for
    ``files``; for ``dstl``, ``dstl://<run id>-plane-stats`` (the run id lower-cased,
    characters other than letters, digits and ``-`` as ``-``: a URI's authority), read
    through the bridge on ``socket``."""
    if location == "files":
        return CheckpointLocation(opts.url("checkpoints") + "/" + QUERY)
    name = re.sub(r"[^a-z0-9-]", "-", opts.run_id.lower())
    return CheckpointLocation(f"{TREE_SCHEME}://{name}-{QUERY}", socket)


def _run_and_check(
    opts: DemoOptions,
    producer: FlightsProducer,
    services: Any,
    checkpoint: CheckpointLocation,
    master: str | None,
    shuffle_partitions: int,
    max_files_per_trigger: int,
    say: Progress,
) -> dict[str, Any]:
    """Steps 3 and 4 of the module docstring with the services up: the report."""
    logs = Path(opts.url("logs"))
    try:
        producer.start()
        runs = _run_query(
            opts,
            producer,
            services.socket,
            checkpoint,
            shuffle_partitions,
            max_files_per_trigger,
            logs,
            say,
            master,
        )
        producer.join(timeout=30)
        producer.raise_if_failed()
        say("checking: batch answer, sink, state read back with the statestore source")
        checks = _check(opts, services.socket, checkpoint, shuffle_partitions)
        figures = checkpoint_figures(checkpoint)  # a dstl:// location: from the bridge
    finally:
        checkpoint.close()
        producer.stop()
        producer.join(timeout=30)
        services.stop()
    events = read_progress(logs / f"progress-{i}.jsonl" for i in range(len(runs["drivers"])))
    return {
        "engine": ENGINE,
        "records": checks.pop("records"),
        "source_files": producer.total_files,
        "master": master or opts.master,
        "shuffle_partitions": shuffle_partitions,
        "nodes": services.nodes.count,
        "trigger_interval_s": opts.checkpoint_interval,
        "max_files_per_trigger": max_files_per_trigger,
        "checkpoints_completed": figures["batches_completed"],
        "dfs_faults": opts.dfs_faults or None,
        **_renamed(progress_figures(events)),
        **figures,
        **tree_figures(opts.url("tree"), figures["batches_completed"]),
        "recoveries": len(runs["drivers"]) - 1,
        "killed": runs["killed"],
        **checks,
        "base_path": opts.base_path,
        "run_id": opts.run_id,
        "run_prefix": opts.prefix(),
    }


def _renamed(figures: dict[str, Any]) -> dict[str, Any]:
    """Progress figures under the default engine's names too (a batch is a checkpoint)."""
    return {
        **figures,
        "checkpoint_duration_ms": figures["batch_duration_ms"],
        "checkpoint_interval_ms": figures["batch_interval_ms"],
    }


def _run_query(
    opts: DemoOptions,
    producer: FlightsProducer,
    socket: Path,
    checkpoint: CheckpointLocation,
    shuffle_partitions: int,
    max_files_per_trigger: int,
    logs: Path,
    say: Progress,
    master: str | None = None,
) -> dict[str, Any]:
    """The query's driver processes (on ``master``, default ``opts.master``): the first
    killed after ``kill_task_after`` committed batches (unless it finished first), the
    next one run to the end.
    Returns ``drivers`` (PIDs in order) and ``killed`` (None, or pid,
    ``after_batches`` and ``mid_batch``: a batch was planned but not committed).
    Raises QueryFailedError."""
    rate = Pace(opts.records_per_second, opts.producer_seconds).rate(producer.total_records)
    timeout = (producer.total_records / rate if rate > 0 else 0.0) + RUN_MARGIN_S
    args = [
        "--landing",
        producer.url,
        "--checkpoint",
        checkpoint.url,
        "--sink",
        opts.url("sink"),
        "--socket",
        str(socket),
        "--master",
        master or opts.master,
        "--shuffle-partitions",
        str(shuffle_partitions),
        "--trigger",
        str(opts.checkpoint_interval),
        "--max-files-per-trigger",
        str(max_files_per_trigger),
        "--timeout",
        str(timeout),
    ]
    drivers: list[int] = []
    killed = None
    while True:
        n = len(drivers)
        scratch = logs / f"local-{n}"  # what a killed driver leaves behind is deleted
        own = ["--progress", str(logs / f"progress-{n}.jsonl"), "--local-dir", str(scratch)]
        proc = _spawn([*args, *own], logs / f"driver-{n}.log")
        drivers.append(proc.pid)
        say(f"query driver {n} started (pid {proc.pid})")
        if n == 0 and opts.kill_task_after > 0:
            if not _wait_to_kill(proc, checkpoint, opts.kill_task_after, timeout):
                kill_driver(proc)
                shutil.rmtree(scratch, ignore_errors=True)
                batches = committed_batches(checkpoint)
                mid = planned_batches(checkpoint) > batches
                killed = {"pid": proc.pid, "after_batches": batches, "mid_batch": mid}
                say(
                    f"killed driver {n} (pid {proc.pid}) after {batches} batches"
                    + (", a batch in flight" if mid else "")
                )
                continue
        else:
            _wait_exit(proc, timeout)
        shutil.rmtree(scratch, ignore_errors=True)
        _check_exit(proc, logs / f"driver-{n}.log")
        say(f"query driver {n} finished: every landing file processed")
        return {"drivers": drivers, "killed": killed}


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``python -m dstltree.demo.ss_query ARGS`` in its own process group (its
    JVM joins it), output to ``log``."""
    cmd = [sys.executable, "-m", "dstltree.demo.ss_query", *args]
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True
        )


def _wait_to_kill(
    proc: subprocess.Popen[bytes], checkpoint: CheckpointLocation, batches: int, timeout: float
) -> bool:
    """Wait until ``batches`` batches are committed and the next one is planned (its
    offsets written: the kill then lands during a batch; at most MID_BATCH_WAIT_S s for
    that second part), False; True when the driver exits first. Raises
    QueryFailedError after ``timeout`` s (the driver killed)."""
    deadline = time.monotonic() + timeout
    while committed_batches(checkpoint) < batches:
        if proc.poll() is not None:
            return True
        if time.monotonic() > deadline:
            kill_driver(proc)
            raise QueryFailedError(f"fewer than {batches} batches within {timeout:.0f} s")
        time.sleep(POLL_S)  # polling the checkpoint directory, bounded by the deadline
    mid_batch = time.monotonic() + MID_BATCH_WAIT_S
    while planned_batches(checkpoint) <= committed_batches(checkpoint):
        if proc.poll() is not None:
            return True
        if time.monotonic() > mid_batch:
            break
        time.sleep(POLL_S / 5)  # a batch is planned every trigger interval
    return False


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait for the driver to exit; kill it and raise QueryFailedError after
    ``timeout`` s."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        kill_driver(proc)
        raise QueryFailedError(f"the query did not finish within {timeout:.0f} s") from e


def _check_exit(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Raise QueryFailedError with the end of the driver's log unless it exited 0."""
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise QueryFailedError(f"query driver exited with {proc.returncode}:\n{tail}")


def kill_driver(proc: subprocess.Popen[bytes], timeout: float = KILL_WAIT_S) -> None:
    """SIGKILL the process group led by ``proc`` (started with its own session: the
    Python driver and its JVM), then wait up to ``timeout`` s until every member is
    gone (a zombie left to a parent that does not reap counts as gone)."""
    import psutil

    try:
        members = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        members = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in members) and time.monotonic() < deadline:
        time.sleep(POLL_S)  # the JVM exits once the kernel has torn it down


def _alive(p: Any) -> bool:
    import psutil

    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _check(
    opts: DemoOptions, socket: Path, checkpoint: CheckpointLocation, shuffle_partitions: int
) -> dict[str, Any]:
    """The verdicts (dstltree.demo.ss_checks.verdicts) plus ``records`` (flights the
    query counts), in a new session configured for the tree (the state is read through
    the bridge). Raises what Spark raises."""
    from dstltree.demo.ss_query import session

    spark = session(opts.master, shuffle_partitions, socket)
    try:
        batch = batch_stats(spark, opts.url("landing"), None)
        sink = sink_summary(spark, opts.url("sink"), None)
        state = state_stats(spark, checkpoint.url)
    finally:
        spark.stop()
    return {**verdicts(batch, sink, state), "records": batch.records}
