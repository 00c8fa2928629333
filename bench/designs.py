"""The driver: runs the workload through one design and records what happened.

Per design: a fresh base path; for ``tree``/``tree-noplan`` the node processes (one per
executor node, plans on or off); one executor process per executor (``spawn``) holding
its writers. Checkpoint k is triggered in every executor process at
``start + k * interval`` (never before checkpoint k-1 completed: one checkpoint at a
time); its persist latency runs from the trigger to the last writer's handle.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from dstltree.bench.nodes import BenchTree, start_bench_tree
from dstltree.bench.storage import BenchStorage
from dstltree.bench.worker import (
    CheckpointReport,
    ProcessStats,
    WorkerConfig,
    worker_main,
)
from dstltree.bench.workload import Workload
from dstltree.topology.config import parse_topology
from dstltree.topology.designs import TREE_DESIGNS
from dstltree.topology.tree import Tree

__all__ = ["BenchSettings", "CheckpointRecord", "DesignRun", "run_design"]

_READY_TIMEOUT_S = 120.0
_CHECKPOINT_TIMEOUT_S = 300.0
_STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class BenchSettings:
    """One bench run. ``topology``: the topology document (YAML mapping, nodes given
    explicitly or by branching); ``tree``: its tree for E executors (executor i = node i
    in breadth-first order). Sizes in bytes, times in seconds. ``attempts``/
    ``upload_timeout``: hedging of every DFS upload (nodes and in-process).
    ``executor_persist_delay``: the ``executor`` design's persist delay (Flink: 10 ms)."""

    workload: Workload
    topology: dict[str, Any]
    tree: Tree
    target_object_bytes: int
    plan_window: int
    checkpoint_interval: float = 0.1
    attempts: int = 3
    upload_timeout: float = 1.0
    executor_persist_delay: float = 0.010

    def client_ack_timeout(self, node_id: str) -> float:
        """Seconds a writer of executor node ``node_id`` waits for an ack: the topology's
        one rule (``TopologyConfig.ack_timeout``) for a client below that node."""
        topo = parse_topology(self.node_topology(plans=True))
        return topo.ack_timeout(self.tree.depth(node_id) + 1)

    def node_topology(self, plans: bool) -> dict[str, Any]:
        doc = dict(self.topology)
        doc.update(
            target_object_bytes=self.target_object_bytes,
            plan_window=self.plan_window,
            plans=plans,
            upload_timeout=self.upload_timeout,
            upload_attempts=self.attempts,
            nodes=[
                {"id": n, "bind": "auto", **({"parent": p} if (p := self.tree.parent(n)) else {})}
                for n in self.tree.nodes
            ],
        )
        doc.pop("branching", None)
        doc.pop("metrics_port", None)
        return doc


@dataclass(frozen=True)
class CheckpointRecord:
    """Checkpoint ``k``: trigger time and per-process reports (monotonic seconds)."""

    k: int
    triggered_at: float
    reports: tuple[CheckpointReport, ...]

    @property
    def persist_s(self) -> float:
        return max(r.done_at for r in self.reports) - self.triggered_at


@dataclass
class DesignRun:
    """Everything measured for one design. ``node_snapshots[w]``: node statistics taken
    just before the first checkpoint of plan window ``w``; ``node_final``: at stop.
    ``segment_nodes``: per executor index, its node id; ``base``: the design's base URL
    (node ``v`` writes under ``base/v``, executor processes under ``base/x-<node>``
    for tree designs and ``base/<node>`` otherwise)."""

    design: str
    base: str
    executor_nodes: list[str]
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    phase_s: float = 0.0
    workers_start: list[ProcessStats] = field(default_factory=list)
    workers_end: list[ProcessStats] = field(default_factory=list)
    node_snapshots: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    node_final: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def _recv(conn: Connection, timeout: float, what: str) -> Any:
    if not conn.poll(timeout):
        raise TimeoutError(f"no answer from an executor process within {timeout:g} s ({what})")
    return conn.recv()


def run_design(
    design: str, settings: BenchSettings, storage: BenchStorage, workdir: Path
) -> DesignRun:
    """Run the workload through ``design``; every process started here is stopped (by
    PID) before returning. Raises RuntimeError if an executor process fails."""
    exec_nodes = settings.tree.nodes[: settings.workload.executors]
    run = DesignRun(design, storage.design_base(design), exec_nodes)
    nodes: BenchTree | None = None
    procs: list[BaseProcess] = []
    conns: list[Connection] = []
    try:
        if design in TREE_DESIGNS:
            nodes = _start_nodes(design, settings, storage, run.base, workdir)
        for e in range(len(exec_nodes)):
            proc, conn = _start_worker(_worker_config(run, e, settings, storage, nodes))
            procs.append(proc)
            conns.append(conn)
        _drive(run, settings, conns, nodes)
    finally:
        for c in conns:
            c.close()
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        if nodes is not None:
            run.node_final = nodes.stop()
    return run


def _start_nodes(
    design: str, settings: BenchSettings, storage: BenchStorage, base: str, workdir: Path
) -> BenchTree:
    """The node processes of a tree design (plans on for ``tree`` only)."""
    tree = settings.tree
    node_opts = {n: storage.options(1000 + i) for i, n in enumerate(tree.nodes)}
    doc = settings.node_topology(plans=design == "tree")
    doc["storage_options"] = storage.options(1000)
    return start_bench_tree(doc, tree, workdir / design, storage.url(base), node_opts)


def _worker_config(
    run: DesignRun, e: int, settings: BenchSettings, storage: BenchStorage, nodes: BenchTree | None
) -> WorkerConfig:
    """Executor process ``e``: it writes under ``base/x-<node>`` beside the nodes of a
    tree design, under ``base/<node>`` otherwise."""
    wl = settings.workload
    node_id = run.executor_nodes[e]
    return WorkerConfig(
        index=e,
        node_id=node_id,
        design=run.design,
        base_path=storage.url(f"{run.base}/{'x-' if nodes is not None else ''}{node_id}"),
        storage_options=storage.options(e),
        writer_ids=tuple(wl.writers_of(e)),
        node_address=nodes.address(node_id) if nodes else None,
        attempts=settings.attempts,
        upload_timeout=settings.upload_timeout,
        ack_timeout=settings.client_ack_timeout(node_id),
        seed=wl.seed + e,
        executor_persist_delay=settings.executor_persist_delay,
        security=nodes.client_security if nodes else None,
    )


def _start_worker(cfg: WorkerConfig) -> tuple[BaseProcess, Connection]:
    """One ``spawn`` executor process and the driver's end of its pipe."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(
        target=worker_main, args=(child, cfg), name=f"bench-exec-{cfg.index}", daemon=True
    )
    p.start()
    child.close()
    return p, parent


def _drive(
    run: DesignRun, settings: BenchSettings, conns: list[Connection], nodes: BenchTree | None
) -> None:
    """Wait for every executor process, run the checkpoints, stop the processes and
    record their statistics at start and at stop."""
    for c in conns:
        msg = _recv(c, _READY_TIMEOUT_S, "start")
        if msg[0] != "ready":
            raise RuntimeError(f"executor process failed to start:\n{msg[1]}")
        run.workers_start.append(msg[1])
    _checkpoints(run, settings, conns, nodes)
    for c in conns:
        c.send(("stop",))
    for c in conns:
        msg = _recv(c, _STOP_TIMEOUT_S, "stop")
        run.workers_end.append(msg[1])


def _checkpoints(
    run: DesignRun, settings: BenchSettings, conns: list[Connection], nodes: BenchTree | None
) -> None:
    sizes = settings.workload.sizes()
    start = time.monotonic()
    for k, per_exec in enumerate(sizes):
        due = start + k * settings.checkpoint_interval
        if (delay := due - time.monotonic()) > 0:
            time.sleep(delay)
        if nodes is not None and k % settings.plan_window == 0:
            run.node_snapshots[k // settings.plan_window] = nodes.snapshot()
            if k == 0:
                start = time.monotonic()
        t0 = time.monotonic()
        for c, s in zip(conns, per_exec, strict=True):
            c.send(("cp", k, s))
        reports = []
        for c in conns:
            msg = _recv(c, _CHECKPOINT_TIMEOUT_S, f"checkpoint {k}")
            report: CheckpointReport = msg[2]
            if report.error:
                raise RuntimeError(f"{run.design}: checkpoint {k} failed: {report.error}")
            reports.append(report)
        run.checkpoints.append(CheckpointRecord(k, t0, tuple(reports)))
    run.phase_s = time.monotonic() - start
