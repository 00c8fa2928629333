"""Helpers to run a real tree of node processes over loopback in tests."""

from __future__ import annotations

from pathlib import Path

import yaml

from aggregator.launcher import LocalTree, start_tree
from topology.config import load_topology


def write_topology(path: Path, base_path: str, nodes: list[dict], **fields: object) -> Path:
    doc = {
        "base_path": base_path,
        "target_object_bytes": fields.pop("target_object_bytes", 4 * 1024 * 1024),
        "persist_delay": fields.pop("persist_delay", 0.05),
        "parent_timeout": fields.pop("parent_timeout", 1.0),
        "nodes": nodes,
        **fields,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


THREE_NODES = [
    {"id": "root", "bind": "auto"},
    {"id": "a", "bind": "auto", "parent": "root"},
    {"id": "b", "bind": "auto", "parent": "root"},
]


def start(tmp_path: Path, nodes: list[dict] | None = None, **fields: object) -> LocalTree:
    base = str(tmp_path / "dfs")
    topo_file = write_topology(tmp_path / "topology.yaml", base, nodes or THREE_NODES, **fields)
    topo = load_topology(topo_file)
    return start_tree(topo, topo_file, workdir=tmp_path)


class InProcessTree:
    """The nodes of a topology as threads of this process (statistics visible)."""

    def __init__(self, topo, store) -> None:  # type: ignore[no-untyped-def]
        from aggregator.node import Node
        from aggregator.process import node_config

        self.tree = topo.tree()
        self.nodes: dict[str, Node] = {}
        for nid in self.tree.nodes:
            parent = self.tree.parent(nid)
            cfg = node_config(
                topo, nid, self.tree.depth(nid), self.nodes[parent].address if parent else None
            )
            node = Node(cfg, store, max_message_bytes=int(topo.max_message_bytes))
            node.start()
            self.nodes[nid] = node

    def address(self, node_id: str) -> str:
        return self.nodes[node_id].address

    def stop(self) -> None:
        for n in self.nodes.values():
            n.stop()

    def __enter__(self) -> InProcessTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
