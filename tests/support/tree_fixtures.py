"""Helpers to run a real tree of node processes over loopback in tests."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from dstltree.aggregator.launcher import LocalTree, start_tree
from dstltree.topology.config import load_topology


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


def metric(url: str | None, name: str) -> float:
    """The value of sample ``name`` (e.g. ``dstl_writers_below``) scraped from a node's
    metrics ``url`` (one node per URL, so one sample per name). KeyError if absent."""
    assert url is not None, "the topology serves no metrics (set metrics_port)"
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise KeyError(name)


class InProcessTree:
    """The nodes of a topology as threads of this process (statistics visible)."""

    def __init__(self, topo, store) -> None:  # type: ignore[no-untyped-def]
        from dstltree.aggregator.node import Node
        from dstltree.aggregator.process import node_config

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
