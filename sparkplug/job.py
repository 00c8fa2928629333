"""The driver side of a user's job: nodes beside the executors, the coordinator (with
the source's split enumerator and the sink's committer), and the stateful barrier stage,
restarted from the latest completed checkpoint after a failure (a new attempt)."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dstltree.coordinator.checkpoint import CompletedCheckpoint
from dstltree.coordinator.service import Coordinator, CoordinatorStatistics
from dstltree.coordinator.state import DEFAULT_MAX_CONCURRENT_CHECKPOINTS
from dstltree.coordinator.store import CheckpointStore
from dstltree.security.settings import JobSecurity, SecuritySettings, cluster_keys_for_nodes
from dstltree.sparkplug.barriers import MODES
from dstltree.sparkplug.keygroups import DEFAULT_MAX_PARALLELISM
from dstltree.sparkplug.nodes import NodePlacement, executor_nodes, local_nodes
from dstltree.sparkplug.pipeline import Pipeline
from dstltree.sparkplug.restore import RescaleError
from dstltree.sparkplug.sinks.read import committed_files
from dstltree.sparkplug.spark_session import driver_addresses, executor_count
from dstltree.sparkplug.task import TaskConfig, run_task
from dstltree.storage.store import CHANGELOG_DIR, ObjectStore
from dstltree.topology.catalog import topology_path
from dstltree.topology.config import TopologyConfig, load_topology

#: Seconds the driver waits for the coordinator's storage work (the closing sweep) at
#: the end of a run.
STOP_TIMEOUT_S = 60.0


class JobFailedError(RuntimeError):
    """The job cannot go on: a record or file it cannot use (the message names the file
    and row), or every attempt failed (the last failure is chained)."""


@dataclass(frozen=True)
class RunOptions:
    """How to run a job (see StreamingJob). Times in seconds. ``crash_drill``: a
    ``CrashDrill`` (one task killed hard once in the run's first attempt) or a tuple of
    them (the k-th armed in the run's k-th attempt);
    ``source_rate``: records per second each task's reader reads at most (0: as fast
    as it can). ``auth``: CURVE on every socket of the job (default); False =
    plaintext, for the coordinator, the exchange and the nodes the job starts (nodes
    started by hosts' supervisors follow the topology's ``security``). ``compression``:
    the codec of the tasks' changelog segments (None: off; ``"zstd"``).
    ``max_concurrent_checkpoints``: checkpoints in flight at most (Flink's
    ``maxConcurrentCheckpoints``); each task keeps as many persisting while it goes on.
    ``checkpointing``: ``"aligned"`` (default) or ``"unaligned"`` (FLIP-76: barriers
    overtake in-flight records, which are persisted with the checkpoint);
    ``aligned_checkpoint_timeout`` (seconds, 0: none; only with ``"unaligned"``, as
    Flink's ``aligned-checkpoint-timeout``): a checkpoint starts aligned and switches
    to unaligned once its alignment at a task takes longer; ``max_inflight_bytes``:
    bytes of in-flight records a task reads ahead of its processing for one unaligned
    checkpoint (beyond, it reads them as it processes them: never drops)."""

    name: str
    base_path: str
    topology: Path | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    parallelism: int = 4
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    checkpoint_interval: float = 0.3
    materialization_interval: float = 3.0
    checkpoint_timeout: float = 10.0
    master: str | None = None
    max_attempts: int = 4
    retained_checkpoints: int = 2
    metrics_port: int | None = None
    crash_drill: Any = None
    persist_changelog: bool = True
    batch_records: int = 256
    source_rate: float = 0.0
    progress: Callable[[Any], None] | None = None
    auth: bool = True
    compression: str | None = None
    max_concurrent_checkpoints: int = DEFAULT_MAX_CONCURRENT_CHECKPOINTS
    checkpointing: str = "aligned"
    aligned_checkpoint_timeout: float = 0.0
    max_inflight_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        check_checkpointing(
            self.checkpointing, self.aligned_checkpoint_timeout, self.max_inflight_bytes
        )
        if self.topology is not None:  # a shipped topology's short name, or a file
            object.__setattr__(self, "topology", topology_path(self.topology))


def check_checkpointing(mode: str, aligned_timeout: float, max_inflight_bytes: int) -> None:
    """Raise ValueError naming the option for a mode other than "aligned" or
    "unaligned", an aligned-checkpoint timeout below 0 or set with aligned
    checkpoints (Flink accepts it only with unaligned ones), or ``max_inflight_bytes``
    below 1."""
    if mode not in MODES:
        raise ValueError(f"checkpointing must be one of {MODES}, got {mode!r}")
    if aligned_timeout < 0 or (aligned_timeout > 0 and mode != "unaligned"):
        raise ValueError(
            f"aligned_checkpoint_timeout {aligned_timeout}: must be >= 0, and > 0 only "
            "with checkpointing='unaligned' (start aligned, switch after the timeout)"
        )
    if max_inflight_bytes < 1:
        raise ValueError(f"max_inflight_bytes must be >= 1, got {max_inflight_bytes}")


@dataclass
class Observed:
    """What the driver sees of completed checkpoints while the job runs; ``samples``:
    (seconds, monotonic, when seen; records in the checkpoint) per checkpoint;
    ``objects``, ``segments``: of the state changes and the in-flight records;
    ``writers``: the state changelog's log ids."""

    checkpoint_ids: set[int] = field(default_factory=set)
    objects: set[str] = field(default_factory=set)
    segments: set[tuple[str, int, int]] = field(default_factory=set)
    segment_bytes: int = 0
    writers: set[str] = field(default_factory=set)
    records: int = 0
    samples: list[tuple[float, int]] = field(default_factory=list)  # (monotonic s, records)

    def see(self, cp: CompletedCheckpoint | None) -> None:
        if cp is None or cp.checkpoint_id in self.checkpoint_ids:
            return
        self.checkpoint_ids.add(cp.checkpoint_id)
        self.records = sum(t.records for t in cp.tasks.values())
        self.samples.append((time.monotonic(), self.records))
        for t in cp.tasks.values():
            self.writers.update(h.log_id for h in t.changelog)
            for h in (*t.changelog, *t.channel_state):  # in-flight records: same objects
                for s in h.segments:
                    self.objects.add(s.path)
                    key = (s.path, s.offset, s.length)
                    if key not in self.segments:
                        self.segments.add(key)
                        self.segment_bytes += s.length


@dataclass
class JobRun:
    """What the driver saw of one run: recoveries (failed attempts), the coordinator's
    statistics and latest checkpoint, the checkpoints observed, records processed in
    this run, whether it ended with a final checkpoint, the parallelism restored from
    where it differed, source files (splits) finished, node count, metrics URLs, and
    what each task of the attempt that finished returned (``tasks``: records, the
    longest gap between two batches processed, materialization figures; see
    ``sparkplug.task.run_task``; empty when no attempt finished)."""

    recoveries: int
    stats: CoordinatorStatistics
    latest: CompletedCheckpoint | None
    observed: Observed
    nodes: int
    metrics: dict[str, Any] | None
    records: int = 0
    finished: bool = False
    rescaled_from: int | None = None
    source_files: int = 0
    tasks: list[dict[str, Any]] = field(default_factory=list)


def run_pipeline(
    spark: Any, pipeline: Pipeline, opts: RunOptions, until: Any, stop: threading.Event
) -> JobRun:
    """Run ``pipeline`` on ``opts.parallelism`` tasks until ``until`` ("end", seconds,
    None) or ``stop``; blocking. Raises RescaleError, ValueError (a fresh job over a
    sink URL holding output), JobFailedError."""
    store = ObjectStore(opts.base_path, opts.storage_options)
    start = _check_start(CheckpointStore(store).load_latest(), pipeline, opts)
    topo = _topology(opts)
    nodes = NodePlacement() if topo is None else _start_nodes(spark, opts, topo)
    security = JobSecurity.make(opts.auth, nodes.keys)
    bind, advertise = driver_addresses(spark)
    job_id = uuid.uuid4().hex[:8]  # this run's log namespace: <job_id>-t<task>-a<attempt>
    coord = Coordinator(
        store,
        opts.parallelism,
        opts.checkpoint_interval,
        opts.materialization_interval,
        opts.checkpoint_timeout,
        opts.retained_checkpoints,
        bind,
        advertise_host=advertise,
        metrics_port=opts.metrics_port,
        source=pipeline.source,
        sink=pipeline.sink,
        max_parallelism=opts.max_parallelism,
        finish_when_source_done=until == "end",
        security=security.job,
        extra_object_prefixes=_node_prefixes(opts, topo),
        log_namespace=job_id,
        max_concurrent_checkpoints=opts.max_concurrent_checkpoints,
    )
    observed = Observed()
    try:
        coord.start()
        driver = _Attempts(spark, pipeline, opts, coord, nodes, topo, observed, security, job_id)
        recoveries = driver.run(start, _deadline(until), stop)
        latest = coord.latest_checkpoint()
        observed.see(latest)
        stats, metrics = coord.statistics(), _metrics_urls(coord, nodes)
    finally:
        # the stage has ended: the closing sweep (coordinator/sweep.py) also finds what
        # tasks uploaded after the run's final sweep; on an object store it may take
        # seconds
        coord.stop(timeout=STOP_TIMEOUT_S)
        nodes.stop()
    before = 0 if start is None else sum(t.records for t in start.tasks.values())
    return JobRun(
        recoveries,
        stats,
        latest,
        observed,
        nodes.count,
        metrics,
        records=observed.records - before,
        finished=latest is not None and latest.final,
        rescaled_from=_rescaled_from(start, opts),
        source_files=0
        if latest is None or latest.enumerator is None
        else len(latest.enumerator.finished),
        tasks=driver.task_results,
    )


def _check_start(
    latest: CompletedCheckpoint | None, pipeline: Pipeline, opts: RunOptions
) -> CompletedCheckpoint | None:
    if latest is not None and latest.max_parallelism not in (0, opts.max_parallelism):
        raise RescaleError(
            f"checkpoint {latest.checkpoint_id} of job {opts.name!r} has max_parallelism "
            f"{latest.max_parallelism}, this run {opts.max_parallelism}: key groups cannot "
            "be redistributed; keep max_parallelism or start a new job"
        )
    if latest is None and pipeline.sink is not None and _has_output(pipeline):
        raise ValueError(
            f"sink {pipeline.sink.url} holds committed output but job {opts.name!r} has "
            "no checkpoint: use an empty sink URL for a new job"
        )
    return latest


def _rescaled_from(start: CompletedCheckpoint | None, opts: RunOptions) -> int | None:
    if start is None or start.parallelism in (0, opts.parallelism):
        return None
    return start.parallelism


def _deadline(until: Any) -> float | None:
    if until is None or until == "end":
        return None
    return time.monotonic() + float(until)


def _node_prefixes(opts: RunOptions, topo: TopologyConfig | None) -> list[str]:
    """Where nodes started by the hosts' supervisors put objects: their topology file's
    own ``<base_path>/changelog/`` (the job's coordinator accepts paths there too).
    Nodes the job starts itself write under the job's base path: no extra prefix."""
    if topo is None or opts.topology is None or not topo.host_nodes():
        return []
    own = load_topology(opts.topology)
    return [ObjectStore(own.base_path, own.storage_options).join(CHANGELOG_DIR)]


def _topology(opts: RunOptions) -> TopologyConfig | None:
    if opts.topology is None:
        return None
    return load_topology(
        opts.topology, base_path=opts.base_path, storage_options=opts.storage_options
    )


def _master(spark: Any, opts: RunOptions) -> str:
    return opts.master or str(spark.sparkContext.master)


def _start_nodes(spark: Any, opts: RunOptions, topo: TopologyConfig) -> NodePlacement:
    """Nodes for the job: by host (started by the hosts' supervisors: only looked up),
    a local tree in local mode, else one per executor from the barrier-stage
    launcher."""
    master = _master(spark, opts)
    assert opts.topology is not None
    by_host = topo.host_nodes()
    if by_host:  # their keys: the topology's key directory (TopologyError if none)
        settings = topo.security or SecuritySettings()
        keys = cluster_keys_for_nodes(settings, str(opts.topology), required=True)
        return NodePlacement(node_for_host=by_host, count=len(by_host), keys=keys)
    if master.startswith("local["):
        node_port = opts.metrics_port and opts.metrics_port + 1  # None or 0 stay
        return local_nodes(
            opts.topology,
            opts.parallelism,
            opts.base_path,
            opts.storage_options,
            node_port,
            curve=opts.auth,
        )
    sc = spark.sparkContext
    n = executor_count(master) if master.startswith("local-cluster[") else _executors(sc, opts)
    return executor_nodes(sc, topo, n, opts.base_path, opts.storage_options, curve=opts.auth)


def _executors(sc: Any, opts: RunOptions, timeout: float = 120.0) -> int:
    """Registered executors, once they offer ``opts.parallelism`` task slots (a barrier
    stage needs them all at once). Raises JobFailedError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        executors = int(sc._jsc.sc().getExecutorMemoryStatus().size()) - 1  # minus driver
        if executors > 0 and int(sc.defaultParallelism) >= opts.parallelism:
            return executors
        if time.monotonic() > deadline:
            raise JobFailedError(
                f"{executors} executors with {sc.defaultParallelism} task slots after "
                f"{timeout:.0f} s; a barrier stage of {opts.parallelism} tasks needs as many"
            )
        time.sleep(0.2)  # polling Spark's executor registry, bounded by the deadline


class _Attempts:
    """Runs the barrier stage attempt after attempt until one ends normally."""

    def __init__(
        self,
        spark: Any,
        pipeline: Pipeline,
        opts: RunOptions,
        coord: Coordinator,
        nodes: NodePlacement,
        topo: TopologyConfig | None,
        observed: Observed,
        security: JobSecurity | None = None,
        job_id: str | None = None,
    ) -> None:
        self.sc = spark.sparkContext
        self.security = security
        self.pipeline, self.opts, self.coord = pipeline, opts, coord
        self.nodes, self.topo, self.observed = nodes, topo, observed
        self.job_id = job_id or uuid.uuid4().hex[:8]  # the writers' log namespace
        self.master = _master(spark, opts)
        self._stop_sent = False
        self.task_results: list[dict[str, Any]] = []  # what the tasks of the last attempt returned

    def run(
        self, start: CompletedCheckpoint | None, deadline: float | None, stop: threading.Event
    ) -> int:
        """Returns the number of failed attempts; raises JobFailedError."""
        first = 0 if start is None else start.attempt + 1
        for n in range(self.opts.max_attempts):
            attempt = first + n
            restored = self.coord.begin_attempt(attempt, self.opts.parallelism)
            cfg = self._config(attempt, restored, _drill_of(self.opts.crash_drill, n))
            box: dict[str, Any] = {}
            t = threading.Thread(target=_collect, args=(self.sc, cfg, box), daemon=True)
            t.start()
            while t.is_alive():
                t.join(0.05)
                self._watch(deadline, stop)
            if "results" in box:
                self.task_results = list(box["results"])
                return n
            _raise_if_input_error(box["error"])
        raise JobFailedError(f"job failed in {self.opts.max_attempts} attempts") from box.get(
            "error"
        )

    def _watch(self, deadline: float | None, stop: threading.Event) -> None:
        self.observed.see(self.coord.latest_checkpoint())
        if self.opts.progress is not None:
            self.opts.progress(self)
        due = deadline is not None and time.monotonic() >= deadline
        if (due or stop.is_set()) and not self._stop_sent:
            self._stop_sent = True
            self.coord.request_stop()

    def _config(self, attempt: int, restored: CompletedCheckpoint | None, drill: Any) -> TaskConfig:
        o = self.opts
        return TaskConfig(
            pipeline=self.pipeline,
            job_id=self.job_id,
            attempt=attempt,
            parallelism=o.parallelism,
            base_path=o.base_path,
            coordinator=self.coord.address,
            restore_id=None if restored is None else restored.checkpoint_id,
            restore_from=_for_tasks(restored),
            storage_options=o.storage_options,
            node_for_task=self.nodes.node_for_task,
            node_for_executor=self.nodes.node_for_executor,
            node_for_host=self.nodes.node_for_host,
            ack_timeout=self._ack_timeout(),
            max_pending_acks=max(2, o.max_concurrent_checkpoints),
            max_parallelism=o.max_parallelism,
            batch_records=o.batch_records,
            persist_changelog=o.persist_changelog,
            source_rate=o.source_rate,
            kill_task=drill.task if drill is not None else None,
            kill_after_checkpoints=drill.after_checkpoints if drill is not None else 0,
            kill_with_channel_state=drill is not None and drill.with_channel_state,
            security=self.security,
            compression=o.compression,
            checkpointing=o.checkpointing,
            aligned_checkpoint_timeout=o.aligned_checkpoint_timeout,
            max_inflight_bytes=o.max_inflight_bytes,
            link={} if self.topo is None else self.topo.link_settings(),
        )

    def _ack_timeout(self) -> float:
        """A task waits for its node as a client of the deepest node would
        (``TopologyConfig.ack_timeout``): every task's node is at most that deep."""
        if self.topo is None:
            return 10.0
        return self.topo.ack_timeout(self.topo.tree(executor_count(self.master)).height() + 1)


def _drill_of(drills: Any, n: int) -> Any:
    """The crash drill armed in the run's attempt ``n`` (0-based): a single CrashDrill
    in the first only, a tuple of them one per attempt, else None."""
    seq = drills if isinstance(drills, tuple) else (drills,)
    return seq[n] if n < len(seq) else None


def _collect(sc: Any, cfg: TaskConfig, box: dict[str, Any]) -> None:
    def part(_: Any) -> Any:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        me = ctx.partitionId()
        yield run_task(cfg, me, ctx.getTaskInfos()[me].address, ctx.allGather)

    n = cfg.parallelism
    try:
        box["results"] = sc.parallelize(range(n), n).barrier().mapPartitions(part).collect()
    except Exception as e:  # noqa: BLE001 - a failed attempt: the driver restarts the stage
        box["error"] = e


_INPUT_ERROR = re.compile(r"(?:RecordError|SourceError|RescaleError): ([^\n]+)")


def _for_tasks(cp: CompletedCheckpoint | None) -> CompletedCheckpoint | None:
    """``cp`` as the tasks restore it: without the enumerator's snapshot and split log
    (the coordinator keeps the splits; a long job's finished ids stay out of the
    closure)."""
    return None if cp is None else replace(cp, enumerator=None, finished_log=None)


def _raise_if_input_error(error: BaseException) -> None:
    """A task failed on input it cannot use: restarting cannot help, fail the job with
    the task's message (file and row)."""
    m = _INPUT_ERROR.search(str(error))
    if m is not None:
        raise JobFailedError(m.group(1)) from error


def _metrics_urls(coord: Coordinator, nodes: NodePlacement) -> dict[str, Any] | None:
    if coord.metrics is None:
        return None
    tree = nodes.local_tree
    node_urls = {} if tree is None else {n: tree.metrics_url(n) for n in tree.tree.nodes}
    return {"coordinator": coord.metrics.url, "nodes": node_urls}


def _has_output(pipeline: Pipeline) -> bool:
    sink = pipeline.sink
    return sink is not None and bool(committed_files(sink.url, sink.storage_options))
