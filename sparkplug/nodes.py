"""Aggregator nodes beside the executors.

- Nodes by host (the topology names hosts): started by a supervisor on each host
  (``dstl node --topology F --node-id ID``); nothing is started here, tasks find the
  node of their executor's host (dstltree.sparkplug.task.find_nodes), then a
  neighbour's.
- Local mode (``local[N]``): the nodes of a topology file run as processes on this
  machine; task ``i`` uses node ``i mod n`` (each node stands for one executor), then
  node ``i + 1 mod n``.
- ``local-cluster[...]`` or a cluster where nothing can be installed on the hosts: one
  node per executor, started from a barrier stage that fills every task slot (so every
  executor runs at least one of its tasks; the first task on each executor starts the
  node), arranged as a k-ary tree over the executors in address order, each node with a
  second parent in another subtree unless the topology says ``second_parents: false``.
  The stage counts the executors from the scheduler's registry it runs on (its tasks'
  addresses), not from a count taken before: an executor registering while the stage
  starts is no error, and a task on an executor the stage did not reach uses a node of
  its host or a neighbour's (dstltree.sparkplug.task.find_nodes). Nodes exit with
  their executor JVM, come back by themselves when they die otherwise (each runs under
  a respawner, dstltree.aggregator.respawn, which gives up on a node that dies at every
  start), and are stopped by a second barrier stage
  on the executors
  (SIGTERM to the node whose PID the first stage left on that host), never by PID from
  the driver.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dstltree.aggregator.launcher import LocalTree, start_tree
from dstltree.aggregator.workdirs import TREE_WORKDIR_PREFIX
from dstltree.security.keys import ClusterKeys, key_files, write_key_files
from dstltree.security.settings import SecuritySettings, cluster_keys_for_nodes
from dstltree.sparkplug.spark_session import executor_host, executor_jvm
from dstltree.topology.config import TopologyConfig, load_topology

log = logging.getLogger(__name__)


class NodeLaunchError(RuntimeError):
    """The barrier-stage launcher could not place one node on every executor."""


@dataclass
class NodePlacement:
    """Where each task's node is; ``stop()`` ends the node processes started for the
    job (a local tree here, or executor nodes through a stage on the executors).
    ``keys``: the cluster keys of the nodes (None: plaintext nodes)."""

    node_for_task: dict[int, str] = field(default_factory=dict)
    node_for_executor: dict[str, str] = field(default_factory=dict)
    node_for_host: dict[str, str] = field(default_factory=dict)
    count: int = 0
    local_tree: LocalTree | None = None
    stop_executor_nodes: Callable[[], None] | None = None
    keys: ClusterKeys | None = None

    def stop(self) -> None:
        if self.local_tree is not None:
            self.local_tree.stop()
        if self.stop_executor_nodes is not None:
            self.stop_executor_nodes()


def local_nodes(
    topology_file: Path,
    tasks: int,
    base_path: str,
    storage_options: dict[str, Any],
    metrics_port: int | None = None,
    curve: bool = True,
) -> NodePlacement:
    """Start the topology's nodes here, restarted when one dies; task i -> node i mod n
    (breadth-first order).
    The nodes get the job's base path and storage options (a copy of the topology file
    with those fields replaced), and ``metrics_port`` as the topology's if given.
    ``curve``: False = plaintext nodes whatever the topology says; else CURVE unless the
    topology turns it off, with its key directory or keys generated for the run."""
    topo = load_topology(
        topology_file,
        base_path=base_path,
        storage_options=storage_options,
        metrics_port=metrics_port,
        security=None if curve else {"curve": False},
    )
    workdir = Path(tempfile.mkdtemp(prefix=TREE_WORKDIR_PREFIX))
    effective = workdir / "topology.yaml"
    effective.write_text(yaml.safe_dump(topo.model_dump(mode="json", exclude_none=True)))
    tree = start_tree(topo, effective, workdir=workdir, remove_workdir=True)
    tree.supervise()  # a node that dies is started again (same id and endpoint)
    ids = tree.tree.nodes
    return NodePlacement(
        node_for_task={i: tree.address(ids[i % len(ids)]) for i in range(tasks)},
        count=len(ids),
        local_tree=tree,
        keys=tree.keys,
    )


def executor_nodes(
    sc: Any,
    topo: TopologyConfig,
    executors: int,
    base_path: str,
    storage_options: dict[str, Any],
    curve: bool = True,
) -> NodePlacement:
    """Start one node per executor from a barrier stage filling every task slot the
    scheduler offers (``sc.defaultParallelism``): the executors are those the stage's
    tasks ran on. ``executors``, the count the caller saw registered, is only compared
    (a warning when the stage reached fewer: executors still registering). Raises
    NodeLaunchError when the stage started no node. ``curve``: as for
    :func:`local_nodes`; keys not named by the topology are generated here, and the node
    secret and writer public key are shipped to the executors in the stage's closure
    (see docs/deploy.md: Spark's RPC encryption keeps them secret on the wire)."""
    settings = topo.security or SecuritySettings()
    keys = None
    if curve and settings.curve:
        keys = cluster_keys_for_nodes(settings, "topology", required=False)
        keys = keys or ClusterKeys.generate()
    files = None if keys is None else key_files(keys)
    branching = topo.branching or 8
    # the nodes' own topology: the launcher's k-ary tree over the executors, not the
    # file's node list (its ids are e0, e1, ... in executor address order)
    doc = topo.model_dump(
        mode="json",
        exclude_none=True,
        exclude={"nodes", "hosts", "node_port", "bind_all", "security"},
    )
    doc.update(base_path=base_path, storage_options=storage_options, branching=branching)
    doc["security"] = {"curve": files is not None}
    if settings.metrics_host is not None:
        doc["security"]["metrics_host"] = settings.metrics_host
    slots = max(1, int(sc.defaultParallelism))  # what the scheduler offers, all at once
    run = sc.applicationId
    rows = (
        sc.parallelize(range(slots), slots)
        .barrier()
        .mapPartitions(lambda _: _start_on_executor(doc, branching, run, files))
        .collect()
    )
    placement = NodePlacement(count=len(rows), keys=keys)
    for executor, address, _depth in rows:
        placement.node_for_executor[executor] = address
    placement.stop_executor_nodes = lambda: _stop_on_executors(sc, slots, run)
    if not rows:
        placement.stop()
        raise NodeLaunchError("the node launcher's stage started no node")
    if len(rows) < executors:
        log.warning(
            "the node launcher reached %d of %d executors (%s); tasks on the others use "
            "a node of their host or a neighbour's",
            len(rows),
            executors,
            sorted(placement.node_for_executor),
        )
    return placement


def _pid_file(run: str, executor: str) -> Path:
    """Where the launcher leaves the PID of an executor's node on its host."""
    safe = "".join(c if c.isalnum() else "_" for c in f"{run}-{executor}")
    return Path(tempfile.gettempdir()) / f"dstl-node-{safe}.pid"


def _stop_on_executors(sc: Any, slots: int, run: str) -> None:
    """SIGTERM every executor's node from a barrier stage on the executors."""

    def stop(_: Any) -> Any:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        executor = ctx.getTaskInfos()[ctx.partitionId()].address
        pid_file = _pid_file(run, executor)
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            pid_file.unlink()
            os.kill(pid, signal.SIGTERM)
        return []

    with contextlib.suppress(Exception):  # executors gone: their nodes exited with them
        sc.parallelize(range(slots), slots).barrier().mapPartitions(stop).collect()


def _start_on_executor(
    doc: dict[str, Any], branching: int, run: str, key_texts: dict[str, str] | None
) -> Any:
    from pyspark import BarrierTaskContext

    from dstltree.aggregator.launcher import start_node_process
    from dstltree.aggregator.workdirs import NODE_WORKDIR_PREFIX, sweep_stale_workdirs
    from dstltree.topology.tree import second_parent_indices

    ctx = BarrierTaskContext.get()
    me = ctx.partitionId()
    executor = ctx.getTaskInfos()[me].address
    host = executor_host(executor)
    port = _free_port(host)
    gathered = ctx.allGather(f"{executor}|tcp://{host}:{port}")
    executors = sorted({g.split("|")[0] for g in gathered})
    first_task: dict[str, tuple[int, str]] = {}
    for i, g in enumerate(gathered):
        first_task.setdefault(g.split("|")[0], (i, g.split("|")[1]))
    if first_task[executor][0] != me:
        return []  # another task on this executor starts its node
    index = executors.index(executor)
    parents = [] if index == 0 else [first_task[executors[(index - 1) // branching]][1]]
    second = second_parent_indices(len(executors), branching) if doc.get("second_parents") else {}
    if index in second:  # a DAG: the way up while the first parent is lost
        parents.append(first_task[executors[second[index]]][1])
    depth, i = 0, index
    while i > 0:
        i, depth = (i - 1) // branching, depth + 1
    sweep_stale_workdirs()  # what SIGKILLed nodes left on this host, key files included
    workdir = Path(tempfile.mkdtemp(prefix=NODE_WORKDIR_PREFIX))
    topo_file = workdir / "topology.yaml"
    topo_file.write_text(yaml.safe_dump(doc))
    keys_dir = None if key_texts is None else write_key_files(key_texts, workdir / "keys")
    h = start_node_process(
        topo_file,
        f"e{index}",
        depth,
        parents,
        workdir,
        bind=f"tcp://{host}:{port}",
        exit_with_pid=_executor_pid(),
        keys_dir=keys_dir,
        respawn_pid_file=_pid_file(run, executor),  # a node that dies comes back
        remove_workdir=True,  # its key files do not outlive it on the executor's host
    )
    return [(executor, h.address, depth)]


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _executor_pid() -> int | None:
    """The executor JVM above this Python worker (nodes exit when it does)."""
    jvm = executor_jvm()
    return None if jvm is None else int(jvm.pid)
