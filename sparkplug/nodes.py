"""Aggregator nodes beside the executors.

- Local mode (``local[N]``): the nodes of a topology file run as processes on this
  machine; task ``i`` uses node ``i mod n`` (each node stands for one executor).
- ``local-cluster[...]`` or a real cluster: one node per executor, started from a
  barrier stage (one task per executor), arranged as a k-ary tree over the executors in
  address order; tasks find their node by their executor's address.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dstltree.aggregator.launcher import LocalTree, start_tree
from dstltree.topology.config import TopologyConfig, load_topology


@dataclass
class NodePlacement:
    """Where each task's node is; ``stop()`` ends the node processes started here."""

    node_for_task: dict[int, str] = field(default_factory=dict)
    node_for_executor: dict[str, str] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)
    count: int = 0
    local_tree: LocalTree | None = None

    def stop(self) -> None:
        if self.local_tree is not None:
            self.local_tree.stop()
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def local_nodes(
    topology_file: Path,
    tasks: int,
    base_path: str,
    storage_options: dict[str, Any],
    metrics_port: int | None = None,
) -> NodePlacement:
    """Start the topology's nodes here; task i -> node i mod n (breadth-first order).
    The nodes get the job's base path and storage options (a copy of the topology file
    with those fields replaced), and ``metrics_port`` as the topology's if given."""
    topo = load_topology(
        topology_file,
        base_path=base_path,
        storage_options=storage_options,
        metrics_port=metrics_port,
    )
    workdir = Path(tempfile.mkdtemp(prefix="dstl-nodes-"))
    effective = workdir / "topology.yaml"
    effective.write_text(yaml.safe_dump(topo.model_dump(mode="json", exclude_none=True)))
    tree = start_tree(topo, effective, workdir=workdir)
    ids = tree.tree.nodes
    return NodePlacement(
        node_for_task={i: tree.address(ids[i % len(ids)]) for i in range(tasks)},
        count=len(ids),
        local_tree=tree,
    )


def executor_nodes(
    sc: Any, topo: TopologyConfig, executors: int, base_path: str, storage_options: dict[str, Any]
) -> NodePlacement:
    """Start one node per executor from a barrier stage of ``executors`` tasks."""
    doc = topo.model_dump(mode="json", exclude_none=True)
    doc["base_path"] = base_path
    doc["storage_options"] = storage_options
    branching = topo.branching or 8
    rows = (
        sc.parallelize(range(executors), executors)
        .barrier()
        .mapPartitions(lambda _: _start_on_executor(doc, branching))
        .collect()
    )
    placement = NodePlacement(count=len(rows))
    for executor, address, pid, _depth in rows:
        placement.node_for_executor[executor] = address
        placement.pids.append(pid)
    return placement


def _start_on_executor(doc: dict[str, Any], branching: int) -> Any:
    from pyspark import BarrierTaskContext

    from dstltree.aggregator.launcher import start_node_process

    ctx = BarrierTaskContext.get()
    me = ctx.partitionId()
    executor = ctx.getTaskInfos()[me].address
    host = executor.rsplit(":", 1)[0]
    port = _free_port(host)
    gathered = ctx.allGather(f"{executor}|tcp://{host}:{port}")
    executors = sorted({g.split("|")[0] for g in gathered})
    first_task: dict[str, tuple[int, str]] = {}
    for i, g in enumerate(gathered):
        first_task.setdefault(g.split("|")[0], (i, g.split("|")[1]))
    if first_task[executor][0] != me:
        return []  # another task on this executor starts its node
    index = executors.index(executor)
    parent = None if index == 0 else first_task[executors[(index - 1) // branching]][1]
    depth, i = 0, index
    while i > 0:
        i, depth = (i - 1) // branching, depth + 1
    workdir = Path(tempfile.mkdtemp(prefix="dstl-node-"))
    topo_file = workdir / "topology.yaml"
    topo_file.write_text(yaml.safe_dump(doc))
    h = start_node_process(
        topo_file,
        f"e{index}",
        depth,
        parent,
        workdir,
        bind=f"tcp://{host}:{port}",
        exit_with_pid=_executor_pid(),
    )
    return [(executor, h.address, h.pid, depth)]


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _executor_pid() -> int | None:
    """The executor JVM above this Python worker (nodes exit when it does)."""
    try:
        import psutil

        p = psutil.Process().parent()
        while p is not None:
            if "java" in p.name():
                return int(p.pid)
            p = p.parent()
    except Exception:  # noqa: BLE001 - best effort; the driver also stops nodes by PID
        return None
    return None
