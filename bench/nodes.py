"""The node processes of the tree designs, one per executor, started root first.

Like ``aggregator.launcher.start_tree`` (same node, same topology file format, one
process per node stopped by its PID), with two additions for measuring: every node
writes under its own base path ``<base>/<node id>`` (so an object's path names the
writer node that wrote it) and may get its own fault-injection seed, and
:meth:`BenchTree.snapshot` reads every node's counters without stopping it (SIGUSR1,
see ``aggregator.process.run_node``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dstltree.aggregator.launcher import NodeHandle, start_node_process, stop_nodes
from dstltree.security.curve import Curve
from dstltree.security.keys import ClusterKeys, generate_key_dir
from dstltree.topology.tree import Tree

__all__ = ["BenchTree", "start_bench_tree"]

_START_TIMEOUT_S = 30.0
_SNAPSHOT_TIMEOUT_S = 10.0


@dataclass
class BenchTree:
    """Running node processes by node id (breadth-first order); ``keys``: their
    cluster keys (None: plaintext)."""

    tree: Tree
    workdir: Path
    nodes: dict[str, NodeHandle] = field(default_factory=dict)
    keys: ClusterKeys | None = None

    @property
    def client_security(self) -> Curve | None:
        """What the nodes' clients pass as ``security`` (the writer keys)."""
        return None if self.keys is None else Curve.for_writer(self.keys)

    def address(self, node_id: str) -> str:
        return self.nodes[node_id].address

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every live node's current statistics (node id -> the JSON document of
        ``aggregator.process.write_stats``). Waits at most 10 s per node; a node that
        does not answer is left out."""
        for h in self.nodes.values():
            assert h.snapshot_file is not None
            h.snapshot_file.unlink(missing_ok=True)
            if h.process.poll() is None:
                os.kill(h.pid, signal.SIGUSR1)
        out: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + _SNAPSHOT_TIMEOUT_S
        for node_id, h in self.nodes.items():
            assert h.snapshot_file is not None
            while not h.snapshot_file.exists() and h.process.poll() is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.005)
            with contextlib.suppress(OSError, ValueError):
                out[node_id] = json.loads(h.snapshot_file.read_text())
        return out

    def stop(self, timeout: float = 15.0) -> dict[str, dict[str, Any]]:
        """SIGTERM every node (leaves first), SIGKILL after ``timeout`` seconds; returns
        the final statistics of the nodes that wrote them."""
        stop_nodes(self.tree, self.nodes, timeout)
        out: dict[str, dict[str, Any]] = {}
        for node_id, h in self.nodes.items():
            with contextlib.suppress(OSError, ValueError, AttributeError):
                out[node_id] = json.loads(h.stats_file.read_text())  # type: ignore[union-attr]
        return out


def start_bench_tree(
    topology: dict[str, Any],
    tree: Tree,
    workdir: Path,
    base_path: str,
    node_options: dict[str, dict[str, Any]] | None = None,
) -> BenchTree:
    """Start one node process per node of ``tree``, parents before children.

    ``topology`` is the topology document (YAML mapping); ``node_options`` replaces, per
    node id, its ``storage_options``. Node ``v`` writes under ``<base_path>/<v>``.
    CURVE as in production unless the document says ``security: {curve: false}``:
    fresh cluster keys in ``<workdir>/keys`` (:attr:`BenchTree.keys`).
    Raises RuntimeError/TimeoutError if a node does not start within 30 s."""
    workdir.mkdir(parents=True, exist_ok=True)
    curve = (topology.get("security") or {}).get("curve", True)
    keys = generate_key_dir(workdir / "keys", force=True) if curve else None
    running = BenchTree(tree, workdir, keys=keys)
    try:
        for node_id in tree.nodes:
            doc = dict(topology)
            if node_options and node_id in node_options:
                doc["storage_options"] = node_options[node_id]
            topo_file = workdir / f"{node_id}.topology.yaml"
            topo_file.write_text(yaml.safe_dump(doc))
            parent = tree.parent(node_id)
            running.nodes[node_id] = _start(
                topo_file,
                node_id,
                tree.depth(node_id),
                running.nodes[parent].address if parent else None,
                workdir,
                f"{base_path.rstrip('/')}/{node_id}",
                None if keys is None else keys.directory,
            )
    except BaseException:
        running.stop()
        raise
    return running


def _start(
    topo_file: Path,
    node_id: str,
    depth: int,
    parent: str | None,
    workdir: Path,
    base: str,
    keys_dir: Path | None,
) -> NodeHandle:
    return start_node_process(
        topo_file,
        node_id,
        depth,
        parent,
        workdir,
        base_path=base,
        exit_with_pid=os.getpid(),
        timeout=_START_TIMEOUT_S,
        keys_dir=keys_dir,
    )
