"""The main job on the driver: nodes, coordinator, the stateful barrier stage with
restarts, and the final comparison with a Spark SQL batch query (``dstl demo``)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client import ObjectStore
from coordinator.checkpoint import CompletedCheckpoint
from coordinator.service import Coordinator
from sparkplug.flights import batch_aggregates, compare, load_table, shard_lengths
from sparkplug.keygroups import key_group_range
from sparkplug.nodes import NodePlacement, executor_nodes, local_nodes
from sparkplug.spark_session import executor_count, spark_session
from sparkplug.task import STATE, TaskConfig, restore_state, run_task
from topology.config import load_topology


@dataclass(frozen=True)
class DemoOptions:
    """Flags of ``dstl demo``. Times in seconds."""

    base_path: str
    topology: Path
    master: str = "local[4]"
    tasks: int = 4
    replay: int = 1
    checkpoint_interval: float = 0.3
    materialization_interval: float = 3.0
    kill_task_after: int = 8
    records_per_second: float = 20000.0
    storage_options: dict[str, Any] = field(default_factory=dict)
    max_attempts: int = 4
    retained_checkpoints: int = 2
    limit_records: int | None = None
    metrics_port: int | None = None  # coordinator here, nodes from metrics_port + 1


@dataclass
class _Observed:
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
        self.offsets = sum(t.source_offset for t in cp.tasks.values())
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


def run_demo(opts: DemoOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Run the main job end to end; returns the report (see README). Blocking."""
    started = time.monotonic()
    spark = spark_session(opts.master)
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
    df = load_table(opts.limit_records)
    total = sum(shard_lengths(df, opts.tasks, opts.replay))
    observed = _Observed()
    try:
        coord.start()
        results, recoveries = _run_attempts(sc, opts, coord, nodes, topo, observed, total, progress)
        observed.see(coord.latest_checkpoint())
        stats = coord.statistics()
        latest = coord.latest_checkpoint()
    finally:
        coord.stop()
        nodes.stop()
    streamed: dict[str, Any] = {}
    for r in results:
        streamed.update(r["state"])
    restored = _restore_all(store, latest, opts.tasks)
    batch = batch_aggregates(spark, df, opts.replay)
    spark.stop()
    mismatched = sorted(set(compare(streamed, batch)) | set(compare(restored, batch)))
    durations = sorted(stats.checkpoint_durations_s)
    present = set(store.list_objects())
    return {
        "records": total,
        "tasks": opts.tasks,
        "master": opts.master,
        "checkpoints_completed": stats.checkpoints_completed,
        "checkpoints_aborted": stats.checkpoints_aborted,
        "checkpoint_duration_ms": {"p50": _pct(durations, 50), "p99": _pct(durations, 99)},
        "materializations": stats.materializations_completed,
        "recoveries": recoveries,
        "objects_written": len(observed.objects | present),
        "objects_referenced": len(observed.objects),
        "changelog_bytes": observed.segment_bytes,
        "writers": len(observed.writers),
        "nodes": nodes.count,
        "objects_per_checkpoint": round(
            len(observed.objects) / max(1, len(observed.checkpoint_ids)), 3
        ),
        "objects_deleted": stats.objects_deleted,
        "orphans_deleted_at_start": stats.orphans_deleted,
        "state_matches_batch": not mismatched,
        "mismatched_keys": mismatched[:50],
        "keys": len(batch),
        "base_path": store.base_url,
        "metrics": _metrics_urls(coord, nodes),
        "wall_s": round(time.monotonic() - started, 1),
    }


def _start_nodes(sc: Any, opts: DemoOptions, topo: Any) -> NodePlacement:
    if opts.master.startswith("local-cluster["):
        n = executor_count(opts.master)
        return executor_nodes(sc, topo, n, opts.base_path, opts.storage_options)
    node_port = opts.metrics_port and opts.metrics_port + 1  # None or 0 (free ports) stay
    return local_nodes(opts.topology, opts.tasks, opts.base_path, opts.storage_options, node_port)


def _run_attempts(
    sc: Any,
    opts: DemoOptions,
    coord: Coordinator,
    nodes: NodePlacement,
    topo: Any,
    observed: _Observed,
    total: int,
    progress: Progress | None,
) -> tuple[list[dict[str, Any]], int]:
    job = uuid.uuid4().hex[:8]
    for attempt in range(opts.max_attempts):
        coord.begin_attempt(attempt)
        cfg = TaskConfig(
            job=job,
            attempt=attempt,
            parallelism=opts.tasks,
            replay=opts.replay,
            base_path=opts.base_path,
            coordinator=coord.address,
            storage_options=opts.storage_options,
            node_for_task=nodes.node_for_task,
            node_for_executor=nodes.node_for_executor,
            ack_timeout=topo.parent_timeout * 5 + 1.0,
            records_per_second=opts.records_per_second / opts.tasks,
            kill_task=opts.tasks - 1 if opts.kill_task_after > 0 else None,
            kill_after_checkpoints=opts.kill_task_after,
            limit_records=opts.limit_records,
        )
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


def _restore_all(
    store: ObjectStore, latest: CompletedCheckpoint | None, tasks: int
) -> dict[str, Any]:
    """The state restored from the latest completed checkpoint (snapshot + changelog)."""
    out: dict[str, Any] = {}
    if latest is None:
        return out
    for t, tc in latest.tasks.items():
        backend = restore_state(store, tc, key_group_range(t, tasks))
        out.update(dict(backend.items(STATE)))
    return out


def _metrics_urls(coord: Coordinator, nodes: NodePlacement) -> dict[str, Any] | None:
    if coord.metrics is None:
        return None
    tree = nodes.local_tree
    node_urls = {} if tree is None else {n: tree.metrics_url(n) for n in tree.tree.nodes}
    return {"coordinator": coord.metrics.url, "nodes": node_urls}


def _pct(sorted_s: list[float], q: float) -> float | None:
    if not sorted_s:
        return None
    i = min(len(sorted_s) - 1, max(0, round(q / 100 * (len(sorted_s) - 1))))
    return round(sorted_s[i] * 1000, 1)
