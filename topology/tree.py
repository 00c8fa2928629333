"""The aggregator tree: a networkx DiGraph (parent -> child) checked to be one
arborescence. Pure; node ids are strings."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import networkx as nx


class TopologyError(ValueError):
    """A topology file or object is invalid; the message names the field or node."""


class NodeLink(Protocol):
    """What the tree needs of a node spec (``topology.config.NodeSpec``)."""

    @property
    def id(self) -> str: ...

    @property
    def parent(self) -> str | None: ...


@dataclass(frozen=True)
class Tree:
    """A rooted tree of node ids. ``graph`` edges point from parent to child."""

    graph: nx.DiGraph
    root: str
    _parent: dict[str, str | None] = field(repr=False)
    # hops from the root per node, filled breadth-first by from_edges (linear even for
    # a chain of thousands of nodes); empty: computed from the parents on demand
    _depth: dict[str, int] = field(default_factory=dict, repr=False)

    @classmethod
    def from_edges(cls, nodes: Iterable[str], edges: Iterable[tuple[str, str]]) -> Tree:
        """Build from node ids and (parent, child) edges; raises TopologyError unless the
        graph is one arborescence (one root, every other node has exactly one parent)."""
        g = nx.DiGraph()
        g.add_nodes_from(nodes)
        g.add_edges_from(edges)
        if g.number_of_nodes() == 0:
            raise TopologyError("nodes: the tree is empty")
        if not nx.is_arborescence(g):
            cycle = _find_cycle(g)
            detail = f"cycle through {cycle}" if cycle else "not a single rooted tree"
            raise TopologyError(f"nodes: {detail}")
        root = next(n for n, d in g.in_degree() if d == 0)
        parent: dict[str, str | None] = {root: None}
        depth = {root: 0}
        for p, c in nx.bfs_edges(g, root):
            parent[c] = p
            depth[c] = depth[p] + 1
        return cls(graph=g, root=root, _parent=parent, _depth=depth)

    @classmethod
    def from_specs(cls, specs: Sequence[NodeLink]) -> Tree:
        return cls.from_edges(
            (s.id for s in specs), ((s.parent, s.id) for s in specs if s.parent is not None)
        )

    @property
    def nodes(self) -> list[str]:
        """Node ids in breadth-first order from the root."""
        return [self.root, *(c for _, c in nx.bfs_edges(self.graph, self.root))]

    def __len__(self) -> int:
        return int(self.graph.number_of_nodes())

    def __contains__(self, node: object) -> bool:
        return node in self._parent

    def parent(self, node: str) -> str | None:
        return self._parent[node]

    def children(self, node: str) -> list[str]:
        return sorted(self.graph.successors(node))

    def ancestors(self, node: str) -> list[str]:
        """Ancestors of ``node``, nearest first, ending with the root."""
        out = []
        p = self._parent[node]
        while p is not None:
            out.append(p)
            p = self._parent[p]
        return out

    def subtree(self, node: str) -> set[str]:
        return {node, *nx.descendants(self.graph, node)}

    def depth(self, node: str) -> int:
        """Hops from the root to ``node`` (0 for the root). Raises KeyError for an
        unknown node."""
        if self._depth:
            return self._depth[node]
        return len(self.ancestors(node))

    def height(self) -> int:
        """The largest depth of any node."""
        return max(self.depth(n) for n in self._parent)

    def post_order(self) -> list[str]:
        """Children before parents (leaves first)."""
        return list(nx.dfs_postorder_nodes(self.graph, self.root))


def kary_tree(n: int, branching: int, prefix: str = "e") -> Tree:
    """A complete ``branching``-ary tree of ``n`` nodes ``e0..e{n-1}``; node i's parent is
    (i - 1) // branching. Raises TopologyError for n < 1 or branching < 1."""
    if n < 1:
        raise TopologyError("executors: at least one node is needed")
    if branching < 1:
        raise TopologyError("branching: must be at least 1")
    ids = [f"{prefix}{i}" for i in range(n)]
    edges = [(ids[(i - 1) // branching], ids[i]) for i in range(1, n)]
    return Tree.from_edges(ids, edges)


def _find_cycle(g: nx.DiGraph) -> list[str] | None:
    try:
        return [u for u, _ in nx.find_cycle(g)]
    except nx.NetworkXNoCycle:
        return None
