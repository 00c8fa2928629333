"""Starting the nodes of a topology on this machine, root first (``dstl up``, the local
demo, the tests). Each node is a separate process stopped by its PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from dstltree.topology.config import TopologyConfig
from dstltree.topology.tree import Tree


@dataclass
class NodeHandle:
    node_id: str
    depth: int
    address: str
    process: subprocess.Popen[bytes]
    metrics_url: str | None = None  # http://host:port/metrics, None when not served
    stats_file: Path | None = None  # final statistics, written on SIGTERM
    snapshot_file: Path | None = None  # statistics written on SIGUSR1

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL the node (chaos tests)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@dataclass
class LocalTree:
    """The running nodes of a topology, by node id."""

    topology: TopologyConfig
    tree: Tree
    nodes: dict[str, NodeHandle] = field(default_factory=dict)
    workdir: Path | None = None

    def address(self, node_id: str) -> str:
        return self.nodes[node_id].address

    def metrics_url(self, node_id: str) -> str | None:
        """The node's metrics URL (topology ``metrics_port``), or None."""
        return self.nodes[node_id].metrics_url

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every node (leaves first), SIGKILL after ``timeout`` seconds."""
        stop_nodes(self.tree, self.nodes, timeout)

    def __enter__(self) -> LocalTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_nodes(tree: Tree, nodes: dict[str, NodeHandle], timeout: float) -> None:
    """SIGTERM the node processes (leaves first), SIGKILL those still running after
    ``timeout`` seconds. Blocking."""
    for node_id in tree.post_order():
        h = nodes.get(node_id)
        if h is not None and h.process.poll() is None:
            h.process.terminate()
    deadline = time.monotonic() + timeout
    for h in nodes.values():
        try:
            h.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            h.kill()


def start_node_process(
    topology_file: Path,
    node_id: str,
    depth: int,
    parent: str | None,
    workdir: Path,
    bind: str = "tcp://127.0.0.1:0",
    base_path: str | None = None,
    exit_with_pid: int | None = None,
    timeout: float = 30.0,
    plans: bool = True,
) -> NodeHandle:
    """Start ``python -m aggregator`` and wait (at most ``timeout`` s) for its address
    file (endpoint, then metrics URL when the topology sets ``metrics_port``).
    The node writes its final statistics to ``workdir/<node_id>.stats.json`` on SIGTERM
    and a snapshot to ``workdir/<node_id>.snapshot.json`` on SIGUSR1."""
    addr_file = workdir / f"{node_id}.addr"
    addr_file.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "dstltree.cli",
        "node",
        "--topology",
        str(topology_file),
        "--node-id",
        node_id,
        "--depth",
        str(depth),
        "--bind",
        bind,
        "--address-file",
        str(addr_file),
    ]
    if parent:
        cmd += ["--parent", parent]
    if base_path:
        cmd += ["--base-path", base_path]
    if exit_with_pid:
        cmd += ["--exit-with-pid", str(exit_with_pid)]
    if not plans:
        cmd += ["--no-plans"]
    stats_file = workdir / f"{node_id}.stats.json"
    snapshot_file = workdir / f"{node_id}.snapshot.json"
    cmd += ["--stats-file", str(stats_file), "--snapshot-file", str(snapshot_file)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not addr_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"node {node_id} exited with code {proc.returncode} at start")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"node {node_id} did not publish its address in {timeout} s")
        time.sleep(0.02)
    lines = addr_file.read_text().splitlines()  # endpoint, then the metrics URL if served
    metrics_url = lines[1] if len(lines) > 1 else None
    return NodeHandle(node_id, depth, lines[0], proc, metrics_url, stats_file, snapshot_file)


def start_tree(
    topology: TopologyConfig,
    topology_file: Path,
    base_path: str | None = None,
    workdir: Path | None = None,
    executors: int | None = None,
    plans: bool = True,
) -> LocalTree:
    """Start every node of ``topology`` as a local process, parents before children."""
    tree = topology.tree(executors)
    wd = workdir or Path(tempfile.mkdtemp(prefix="dstl-nodes-"))
    binds = {n.id: n.bind for n in topology.nodes or []}
    running = LocalTree(topology, tree, workdir=wd)
    try:
        for node_id in tree.nodes:
            parent = tree.parent(node_id)
            bind = binds.get(node_id, "auto")
            h = start_node_process(
                topology_file,
                node_id,
                tree.depth(node_id),
                running.nodes[parent].address if parent else None,
                wd,
                bind="tcp://127.0.0.1:0" if bind == "auto" else bind,
                base_path=base_path,
                exit_with_pid=os.getpid(),
                plans=plans,
            )
            running.nodes[node_id] = h
    except BaseException:
        running.stop()
        raise
    return running
