"""The aggregator topology: a networkx DiGraph of first parents (parent -> child), one
rooted tree or several, plus each node's further parents in order of preference (the
second ways up), the whole checked to be a DAG. Pure; node ids are strings.

FLIP-158, "Future directions": the nodes are organized "into a hierarchy/DAG". The
first parents form the tree the plan is computed on; a node whose first parent is down
uses its next live parent (:func:`dstltree.topology.plan.live_parent`). Every node can
write to the DFS itself, so a DAG whose parents are all known nodes has every path
ending at a node that writes (a root, or any node whose parents are all down).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

import networkx as nx


class TopologyError(ValueError):
    """A topology file or object is invalid; the message names the field or node."""


class NodeLink(Protocol):
    """What the tree needs of a node spec (``topology.config.NodeSpec``)."""

    @property
    def id(self) -> str: ...

    @property
    def parent_ids(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Tree:
    """Rooted trees of node ids with second parents. ``graph`` edges point from first
    parent to child; ``roots`` are the nodes without a parent (each writes to the DFS);
    ``fallbacks`` maps a node to its further parents, in order of preference."""

    graph: nx.DiGraph
    roots: tuple[str, ...]
    _parent: dict[str, str | None] = field(repr=False)
    # hops from its root per node, filled breadth-first by from_edges (linear even for
    # a chain of thousands of nodes); empty: computed from the parents on demand
    _depth: dict[str, int] = field(default_factory=dict, repr=False)
    fallbacks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # every node, parents (first and further) before children
    _order: tuple[str, ...] = field(default=(), repr=False)

    @classmethod
    def from_edges(
        cls,
        nodes: Iterable[str],
        edges: Iterable[tuple[str, str]],
        fallbacks: Mapping[str, Sequence[str]] | None = None,
    ) -> Tree:
        """Build from node ids, (first parent, child) edges and ``fallbacks`` (node ->
        further parents in order of preference). Raises TopologyError unless the first
        parents form rooted trees (no node with two first parents, no cycle) and the
        graph with the further parents is a DAG; the message names the node and the
        cycle or the unknown parent (a dead end)."""
        g = nx.DiGraph()
        g.add_nodes_from(nodes)
        g.add_edges_from(edges)
        if g.number_of_nodes() == 0:
            raise TopologyError("nodes: the tree is empty")
        if not nx.is_branching(g):
            raise TopologyError(f"nodes: {_not_a_forest(g)}")
        roots = tuple(n for n, d in g.in_degree() if d == 0)
        parent: dict[str, str | None] = dict.fromkeys(roots)
        depth = dict.fromkeys(roots, 0)
        for r in roots:
            for p, c in nx.bfs_edges(g, r):
                parent[c] = p
                depth[c] = depth[p] + 1
        more = _check_fallbacks(g, parent, fallbacks or {})
        order = _topological(g, more) if more else tuple(_breadth_first(g, roots))
        return cls(g, roots, parent, depth, MappingProxyType(more), order)

    @classmethod
    def from_specs(cls, specs: Sequence[NodeLink]) -> Tree:
        edges = [(s.parent_ids[0], s.id) for s in specs if s.parent_ids]
        more = {s.id: s.parent_ids[1:] for s in specs if len(s.parent_ids) > 1}
        return cls.from_edges((s.id for s in specs), edges, more)

    @property
    def root(self) -> str:
        """The first root (the only one of a single tree)."""
        return self.roots[0]

    @property
    def nodes(self) -> list[str]:
        """Node ids in breadth-first order from the roots, root by root."""
        return _breadth_first(self.graph, self.roots)

    def __len__(self) -> int:
        return int(self.graph.number_of_nodes())

    def __contains__(self, node: object) -> bool:
        return node in self._parent

    def parent(self, node: str) -> str | None:
        """The first parent of ``node`` (None for a root); KeyError for an unknown id."""
        return self._parent[node]

    def parents(self, node: str) -> tuple[str, ...]:
        """Every parent of ``node`` in order of preference: the first parent, then its
        further parents; () for a root. KeyError for an unknown id."""
        p = self._parent[node]
        return () if p is None else (p, *self.fallbacks.get(node, ()))

    def topological(self) -> tuple[str, ...]:
        """Every node, each after all of its parents (first and further)."""
        return self._order

    def children(self, node: str) -> list[str]:
        return sorted(self.graph.successors(node))

    def ancestors(self, node: str) -> list[str]:
        """First-parent ancestors of ``node``, nearest first, ending with its root."""
        out = []
        p = self._parent[node]
        while p is not None:
            out.append(p)
            p = self._parent[p]
        return out

    def subtree(self, node: str) -> set[str]:
        return {node, *nx.descendants(self.graph, node)}

    def depth(self, node: str) -> int:
        """Hops from its root to ``node`` (0 for a root). Raises KeyError for an
        unknown node."""
        if self._depth:
            return self._depth[node]
        return len(self.ancestors(node))

    def height(self) -> int:
        """The largest depth of any node."""
        return max(self.depth(n) for n in self._parent)

    def post_order(self) -> list[str]:
        """Children before (first) parents, leaves first, root by root."""
        return [n for r in self.roots for n in nx.dfs_postorder_nodes(self.graph, r)]


def kary_tree(n: int, branching: int, prefix: str = "e", second_parents: bool = False) -> Tree:
    """A complete ``branching``-ary tree of ``n`` nodes ``e0..e{n-1}``; node i's parent is
    (i - 1) // branching; with ``second_parents`` each node also gets
    :func:`second_parent_indices`' second parent. Raises TopologyError for n < 1 or
    branching < 1."""
    if n < 1:
        raise TopologyError("executors: at least one node is needed")
    if branching < 1:
        raise TopologyError("branching: must be at least 1")
    ids = [f"{prefix}{i}" for i in range(n)]
    edges = [(ids[(i - 1) // branching], ids[i]) for i in range(1, n)]
    more = {}
    if second_parents:
        more = {ids[i]: (ids[j],) for i, j in second_parent_indices(n, branching).items()}
    return Tree.from_edges(ids, edges, more)


def second_parent_indices(n: int, branching: int) -> dict[int, int]:
    """Node index -> its second parent's index in the complete ``branching``-ary tree
    of ``n`` nodes (node i's first parent p = (i - 1) // branching): the node after p on
    p's level (the one before p when p is the last), so that losing p moves i to another
    subtree; a child of the root gets the sibling before it (the first child none: when
    the root is down it writes itself). Every edge goes from a lower index to a higher
    one, so the result with the first parents is a DAG. A chain (branching 1) gets
    none."""
    out: dict[int, int] = {}
    if branching < 2:
        return out
    level_start, level_end = 1, min(n, 1 + branching)  # depth 1: indices 1..branching
    for i in range(2, n):
        while i >= level_end:  # i is deeper: move to the next level of parents' children
            level_start, level_end = level_end, level_end + (level_end - level_start) * branching
        p = (i - 1) // branching
        if p == 0:
            out[i] = i - 1
            continue
        p_start = (level_start - 1) // branching  # p's level: parents of i's level
        p_end = (level_end - 2) // branching  # the last parent of i's level
        q = p + 1 if p + 1 <= min(p_end, i - 1) else p - 1
        if q >= p_start and q != p:
            out[i] = q
    return out


def _breadth_first(g: nx.DiGraph, roots: Iterable[str]) -> list[str]:
    return [n for r in roots for n in (r, *(c for _, c in nx.bfs_edges(g, r)))]


def _not_a_forest(g: nx.DiGraph) -> str:
    """Why the first-parent graph is not rooted trees: a cycle, named, or a node with
    two first parents."""
    cycle = _find_cycle(g)
    if cycle:
        return f"cycle through {' -> '.join([*cycle, cycle[0]])}"
    two = next(n for n, d in g.in_degree() if d > 1)
    return f"node {two!r} has more than one first parent: {sorted(g.predecessors(two))}"


def _check_fallbacks(
    g: nx.DiGraph, parent: Mapping[str, str | None], fallbacks: Mapping[str, Sequence[str]]
) -> dict[str, tuple[str, ...]]:
    """The further parents, checked: known node ids (an unknown one is a dead end),
    not the node itself, its first parent or named twice, none on a root's list
    (TopologyError naming the node); :func:`_topological` checks they add no cycle."""
    out: dict[str, tuple[str, ...]] = {}
    for v, more in fallbacks.items():
        if v not in parent:
            raise TopologyError(f"nodes: unknown node {v!r} has parents")
        if not more:
            continue
        if parent[v] is None:
            raise TopologyError(f"nodes: node {v!r} has further parents but no first parent")
        seen = {v: "itself", parent[v]: "its first parent"}
        for p in more:
            if p not in parent:
                raise TopologyError(f"nodes: node {v!r}: parent {p!r} is not a node (a dead end)")
            if p in seen:
                raise TopologyError(f"nodes: node {v!r}: parent {p!r} is {seen[p]}")
            seen[p] = "named twice"
        out[v] = tuple(more)
    return out


def _topological(g: nx.DiGraph, fallbacks: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Every node after all of its parents; TopologyError naming the cycle when the
    first parents with the further ones are not a DAG."""
    dag = g.copy()
    dag.add_edges_from((p, v) for v, more in fallbacks.items() for p in more)
    cycle = _find_cycle(dag)
    if cycle:
        raise TopologyError(
            f"nodes: parents form a cycle through {' -> '.join([*cycle, cycle[0]])}"
        )
    return tuple(nx.topological_sort(dag))


def _find_cycle(g: nx.DiGraph) -> list[str] | None:
    try:
        return [u for u, _ in nx.find_cycle(g)]
    except nx.NetworkXNoCycle:
        return None
