"""The driver side of a keyed job: nodes beside the executors, the coordinator, and the
stateful barrier stage with restarts after a failure (a new attempt restores from the
latest completed checkpoint). The job itself is a
:class:`dstltree.sparkplug.keyed_job.KeyedJob`."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstltree.coordinator.checkpoint import CompletedCheckpoint
from dstltree.coordinator.service import Coordinator, CoordinatorStatistics
from dstltree.sparkplug.keyed_job import KeyedJob
from dstltree.sparkplug.keygroups import DEFAULT_MAX_PARALLELISM, key_group_range
from dstltree.sparkplug.nodes import NodePlacement, executor_nodes, local_nodes
from dstltree.sparkplug.spark_session import executor_count
from dstltree.sparkplug.task import TaskConfig, restore_state, run_task
from dstltree.storage.store import ObjectStore
from dstltree.topology.config import TopologyConfig, load_topology


@dataclass(frozen=True)
class JobOptions:
    """How to run a keyed job. Times in seconds. ``kill_task_after`` > 0 kills the last
    task hard after that many checkpoints in the first attempt (a crash drill)."""

    base_path: str
    topology: Path
    master: str = "local[4]"
    tasks: int = 4
    max_parallelism: int = DEFAULT_MAX_PARALLELISM
    checkpoint_interval: float = 0.3
    materialization_interval: float = 3.0
    kill_task_after: int = 8
    records_per_second: float = 20000.0  # over all tasks; 0 = unthrottled
    storage_options: dict[str, Any] = field(default_factory=dict)
    max_attempts: int = 4
    retained_checkpoints: int = 2
    metrics_port: int | None = None  # coordinator here, nodes from metrics_port + 1


@dataclass
class Observed:
    """What the driver sees of completed checkpoints while the job runs."""

    checkpoint_ids: set[int] = field(default_factory=set)
    objects: set[str] = field(default_factory=set)
    segments: set[tuple[str, int, int]] = field(default_factory=set)
    segment_bytes: int = 0
    writers: set[str] = field(default_factory=set)
    offsets: int = 0

    def see(self, cp: CompletedCheckpoint | None) -> None:
        if cp is None or cp.checkpoint_id in self.checkpoint_ids:
            return
        self.checkpoint_ids.add(cp.checkpoint_id)
        self.offsets = sum(t.records for t in cp.tasks.values())
        for t in cp.tasks.values():
            for h in t.changelog:
                self.writers.add(h.log_id)
                for s in h.segments:
                    self.objects.add(s.path)
                    key = (s.path, s.offset, s.length)
                    if key not in self.segments:
                        self.segments.add(key)
                        self.segment_bytes += s.length


Progress = Callable[[int, int, Any], None]  # (records done, total records, coordinator stats)


@dataclass
class JobRun:
    """What the driver saw of one run: per-task results of the final attempt
    (``{"task", "attempt", "state", "records"}``), recoveries (failed attempts), the
    coordinator's statistics and latest checkpoint, the checkpoints observed."""

    results: list[dict[str, Any]]
    recoveries: int
    stats: CoordinatorStatistics
    latest: CompletedCheckpoint | None
    observed: Observed
    nodes: int
    metrics: dict[str, Any] | None


def run_keyed_job(
    spark: Any, job: KeyedJob, opts: JobOptions, progress: Progress | None = None
) -> JobRun:
    """Run ``job`` on ``opts.tasks`` stateful tasks of a Spark barrier stage, with nodes
    from ``opts.topology``, checkpoints, materialization and restarts, to the end of its
    input. Blocking. Raises RuntimeError when ``opts.max_attempts`` attempts failed."""
    sc = spark.sparkContext
    store = ObjectStore(opts.base_path, opts.storage_options)
    topo = load_topology(
        opts.topology, base_path=opts.base_path, storage_options=opts.storage_options
    )
    nodes = _start_nodes(sc, opts, topo)
    coord = Coordinator(
        store,
        opts.tasks,
        opts.checkpoint_interval,
        opts.materialization_interval,
        retained_checkpoints=opts.retained_checkpoints,
        metrics_port=opts.metrics_port,
    )
    observed = Observed()
    try:
        coord.start()
        results, recoveries = _run_attempts(sc, job, opts, coord, nodes, topo, observed, progress)
        observed.see(coord.latest_checkpoint())
        stats, latest = coord.statistics(), coord.latest_checkpoint()
        metrics = _metrics_urls(coord, nodes)
    finally:
        coord.stop()
        nodes.stop()
    return JobRun(results, recoveries, stats, latest, observed, nodes.count, metrics)


def _start_nodes(sc: Any, opts: JobOptions, topo: TopologyConfig) -> NodePlacement:
    if opts.master.startswith("local-cluster["):
        n = executor_count(opts.master)
        return executor_nodes(sc, topo, n, opts.base_path, opts.storage_options)
    node_port = opts.metrics_port and opts.metrics_port + 1  # None or 0 (free ports) stay
    return local_nodes(opts.topology, opts.tasks, opts.base_path, opts.storage_options, node_port)


def _task_config(
    job: KeyedJob,
    opts: JobOptions,
    job_id: str,
    attempt: int,
    coord: Coordinator,
    nodes: NodePlacement,
    topo: TopologyConfig,
) -> TaskConfig:
    return TaskConfig(
        job=job,
        job_id=job_id,
        attempt=attempt,
        parallelism=opts.tasks,
        base_path=opts.base_path,
        coordinator=coord.address,
        storage_options=opts.storage_options,
        node_for_task=nodes.node_for_task,
        node_for_executor=nodes.node_for_executor,
        ack_timeout=_client_ack_timeout(opts, topo),
        max_parallelism=opts.max_parallelism,
        records_per_second=opts.records_per_second / opts.tasks,
        kill_task=opts.tasks - 1 if opts.kill_task_after > 0 else None,
        kill_after_checkpoints=opts.kill_task_after,
    )


def _client_ack_timeout(opts: JobOptions, topo: TopologyConfig) -> float:
    """A task waits for its node as a client of the deepest node would
    (``TopologyConfig.ack_timeout``): every task's node is at most that deep."""
    return topo.ack_timeout(topo.tree(executor_count(opts.master)).height() + 1)


def _run_attempts(
    sc: Any,
    job: KeyedJob,
    opts: JobOptions,
    coord: Coordinator,
    nodes: NodePlacement,
    topo: TopologyConfig,
    observed: Observed,
    progress: Progress | None,
) -> tuple[list[dict[str, Any]], int]:
    job_id = uuid.uuid4().hex[:8]
    total = sum(job.lengths(opts.tasks, opts.max_parallelism))
    for attempt in range(opts.max_attempts):
        coord.begin_attempt(attempt)
        cfg = _task_config(job, opts, job_id, attempt, coord, nodes, topo)
        box: dict[str, Any] = {}
        t = threading.Thread(target=_collect, args=(sc, cfg, opts.tasks, box), daemon=True)
        t.start()
        while t.is_alive():
            t.join(0.05)
            observed.see(coord.latest_checkpoint())
            if progress is not None:
                progress(observed.offsets, total, coord.statistics())
        if "results" in box:
            return box["results"], attempt
        if attempt + 1 == opts.max_attempts:
            raise RuntimeError(f"job failed in {opts.max_attempts} attempts") from box.get("error")
    raise AssertionError("unreachable")


def _collect(sc: Any, cfg: TaskConfig, tasks: int, box: dict[str, Any]) -> None:
    def part(_: Any) -> Any:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        me = ctx.partitionId()
        yield run_task(cfg, me, ctx.getTaskInfos()[me].address)

    try:
        box["results"] = sc.parallelize(range(tasks), tasks).barrier().mapPartitions(part).collect()
    except Exception as e:  # noqa: BLE001 - a failed attempt: the driver restarts the stage
        box["error"] = e


def restore_all(
    store: ObjectStore,
    latest: CompletedCheckpoint | None,
    job: KeyedJob,
    tasks: int,
    max_parallelism: int = DEFAULT_MAX_PARALLELISM,
) -> dict[Any, Any]:
    """The state of every key restored from ``latest`` (snapshot + changelog replay),
    with the key groups of ``tasks`` tasks. Raises CorruptObjectError / StorageError."""
    out: dict[Any, Any] = {}
    if latest is None:
        return out
    for t, tc in latest.tasks.items():
        kgs = key_group_range(t, tasks, max_parallelism)
        backend = restore_state(store, tc, kgs, job.state_name, max_parallelism)
        out.update(dict(backend.items(job.state_name)))
    return out


def _metrics_urls(coord: Coordinator, nodes: NodePlacement) -> dict[str, Any] | None:
    if coord.metrics is None:
        return None
    tree = nodes.local_tree
    node_urls = {} if tree is None else {n: tree.metrics_url(n) for n in tree.tree.nodes}
    return {"coordinator": coord.metrics.url, "nodes": node_urls}
