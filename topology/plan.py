"""The plan policy: which nodes are collectors (nodes that write the objects) for a plan
window, and where every node sends its changesets. Pure code, no I/O; the aggregator and
the simulator run it as is.

Source: FLIP-158, "Future directions" (a node proxies requests up the hierarchy unless it
has accumulated enough data, with "a decision upfront for the next N checkpoints"), and
docs/design.md, "The plan".

The rule, for plan window ``w`` = checkpoints ``[w*N, (w+1)*N)``:

* the expected residual of node ``v`` is ``r(v) = own(v) + sum(r(c))`` over the
  children ``c`` of ``v`` that do not write (bytes per checkpoint);
* ``v`` is a collector iff ``r(v) >= target_object_bytes`` or ``v`` is the root;
* a collector sends its own id down as the collector address; any other node passes
  down the collector address it received from its parent.

A node knows only its own executor's bytes and the residuals its children report
(:func:`decide_local`, then :meth:`LocalDecision.collector`); :func:`compute_plan` gives the
same answer for the whole tree at once.

Nodes marked down are contracted out of the graph: a down node never writes, its own
bytes are not counted (its executor is gone with it) and its children report to, and
route through, their next live parent (:func:`live_parent`: the further parents of a
DAG first, then the parents of those; for a tree the nearest live ancestor). A live
node with no live parent left (the root is down) acts as a root: "a node that cannot
reach its parent writes itself" (docs/design.md, "Invariants").
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dstltree.topology.latency import (
    HedgingPolicy,
    LatencyModel,
    checkpoint_quantile,
    expected_attempts,
)
from dstltree.topology.tree import Tree

__all__ = [
    "ByteEstimator",
    "LocalDecision",
    "NodePlan",
    "TailEstimate",
    "TreePlan",
    "compute_plan",
    "decide_local",
    "live_parent",
    "planned_object_sizes",
    "prefixes_for",
    "size_for_tail",
    "window_of",
]


def window_of(checkpoint: int, plan_window: int) -> int:
    """The plan window holding ``checkpoint`` (both >= 0 / >= 1); ValueError otherwise."""
    if checkpoint < 0 or plan_window < 1:
        raise ValueError(
            f"checkpoint must be >= 0 and plan_window >= 1, got {checkpoint}, {plan_window}"
        )
    return checkpoint // plan_window


@dataclass(frozen=True)
class LocalDecision:
    """What one node decides from its own bytes and its children's reports.

    ``residual_bytes`` is r(v); ``writes`` whether v is a collector for the window;
    ``reported_bytes`` what v reports to its parent: 0 when it writes, r(v) otherwise.
    """

    node: str
    residual_bytes: float
    writes: bool

    @property
    def reported_bytes(self) -> float:
        return 0.0 if self.writes else self.residual_bytes

    def collector(self, parent_collector: str | None) -> str:
        """The collector address this node uses and passes down to its children.

        ``parent_collector`` is the address received from the (live) parent, None for a
        root. Raises ValueError for a non-writing node without a parent collector.
        """
        if self.writes:
            return self.node
        if parent_collector is None:
            raise ValueError(f"node {self.node!r} does not write and got no collector address")
        return parent_collector


def decide_local(
    node: str,
    own_bytes: float,
    child_reports: Iterable[float],
    target_object_bytes: float,
    is_root: bool,
) -> LocalDecision:
    """Decide for one node from local knowledge only (bytes per checkpoint).

    ``child_reports`` are the ``reported_bytes`` of the node's (live) children. Raises
    ValueError for negative bytes or a non-positive target.
    """
    if target_object_bytes <= 0:
        raise ValueError(f"target_object_bytes must be > 0, got {target_object_bytes}")
    reports = list(child_reports)
    if own_bytes < 0 or any(r < 0 for r in reports):
        raise ValueError(f"node {node!r}: bytes must be >= 0")
    residual = float(own_bytes) + float(sum(reports))
    return LocalDecision(node, residual, is_root or residual >= target_object_bytes)


@dataclass(frozen=True)
class NodePlan:
    """One live node's plan for a window: its expected residual r(v) (bytes per
    checkpoint), whether it writes, and the collector it sends its changesets to."""

    node: str
    residual_bytes: float
    writes: bool
    collector: str


@dataclass(frozen=True)
class TreePlan:
    """The plan of a whole tree for plan window ``window`` (checkpoints
    ``[window*plan_window, (window+1)*plan_window)``). ``nodes`` maps every live node id
    to its :class:`NodePlan`; ``down`` lists the excluded nodes."""

    window: int
    plan_window: int
    target_object_bytes: float
    nodes: Mapping[str, NodePlan]
    down: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", MappingProxyType(dict(self.nodes)))
        object.__setattr__(self, "down", frozenset(self.down))

    def __reduce__(self) -> tuple[Any, ...]:  # picklable despite the read-only mapping
        return (
            TreePlan,
            (self.window, self.plan_window, self.target_object_bytes, dict(self.nodes), self.down),
        )

    @property
    def first_checkpoint(self) -> int:
        return self.window * self.plan_window

    def covers(self, checkpoint: int) -> bool:
        """True if ``checkpoint`` belongs to this plan's window."""
        return window_of(checkpoint, self.plan_window) == self.window

    def collector_of(self, node: str) -> str:
        """The collector of ``node``; KeyError for unknown or down nodes."""
        return self.nodes[node].collector

    def routes(self) -> dict[str, str]:
        """node id -> collector id, for every live node."""
        return {n: p.collector for n, p in self.nodes.items()}

    def collectors(self) -> list[str]:
        """Collector ids, in the order of ``nodes``."""
        return [n for n, p in self.nodes.items() if p.writes]

    def expected_object_bytes(self) -> dict[str, float]:
        """collector id -> expected bytes it holds per checkpoint (its residual r(v))."""
        return {n: p.residual_bytes for n, p in self.nodes.items() if p.writes}


def live_parent(tree: Tree, node: str, down: Collection[str] = ()) -> str | None:
    """The parent ``node`` uses while the nodes in ``down`` are down: the first of its
    parents in order of preference (:meth:`Tree.parents`) that is not down, else the
    nearest live one of their parents, breadth-first in the same order; None when no
    way up is left (the node writes itself). The answer is always an ancestor in the
    DAG, so the routes stay acyclic. For a tree: the nearest live ancestor."""
    queue = deque(tree.parents(node))
    seen: set[str] = set()
    while queue:
        p = queue.popleft()
        if p in seen:
            continue
        if p not in down:
            return p
        seen.add(p)
        queue.extend(tree.parents(p))
    return None


def compute_plan(
    tree: Tree,
    own_bytes: Mapping[str, float],
    target_object_bytes: float,
    *,
    window: int = 0,
    plan_window: int = 16,
    down: Collection[str] = (),
) -> TreePlan:
    """The plan of the whole tree for one window.

    ``own_bytes`` maps node id -> estimated bytes per checkpoint of that node's own
    executor (missing nodes count 0). ``down`` lists nodes to exclude. Deterministic:
    the same input gives an equal plan. Raises ValueError for a non-positive target,
    negative bytes or unknown node ids in ``own_bytes``/``down``.
    """
    if target_object_bytes <= 0:
        raise ValueError(f"target_object_bytes must be > 0, got {target_object_bytes}")
    unknown = sorted({*own_bytes, *down} - set(tree.nodes))
    if unknown:
        raise ValueError(f"unknown node ids: {unknown[:5]}")
    dead = frozenset(down)
    order = tree.topological()  # every node after all of its parents
    parent = {v: live_parent(tree, v, dead) for v in order if v not in dead}
    # Up: residuals, children before parents.
    residual: dict[str, float] = {}
    upward: dict[str, float] = dict.fromkeys(parent, 0.0)
    writes: dict[str, bool] = {}
    for v in tree.post_order() if not tree.fallbacks else reversed(order):
        if v in dead:
            continue
        b = float(own_bytes.get(v, 0.0))
        if b < 0:
            raise ValueError(f"node {v!r}: bytes must be >= 0, got {b}")
        r = b + upward[v]
        residual[v] = r
        writes[v] = parent[v] is None or r >= target_object_bytes
        p = parent[v]
        if p is not None and not writes[v]:
            upward[p] += r
    # Down: collector addresses, parents before children.
    collector: dict[str, str] = {}
    for v in parent:
        p = parent[v]
        collector[v] = v if writes[v] else collector[p]  # type: ignore[index]
    nodes = {
        v: NodePlan(v, residual[v], writes[v], collector[v]) for v in tree.nodes if v in parent
    }
    return TreePlan(window, plan_window, float(target_object_bytes), nodes, dead)


class ByteEstimator:
    """Moving average of bytes per checkpoint per node over the last ``history``
    checkpoints (docs/design.md, "The plan": "Estimates use a moving average of recent
    checkpoints"). Deterministic. A node missing from an update counts 0 bytes for that
    checkpoint once it has been seen."""

    def __init__(self, history: int = 16) -> None:
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history}")
        self.history = history
        self._samples: dict[str, deque[float]] = {}
        self._means: dict[str, float] | None = None  # estimate() until the next update

    def update(self, observed: Mapping[str, float]) -> None:
        """Record one checkpoint: node id -> bytes (>= 0; ValueError otherwise)."""
        for n, b in observed.items():
            if b < 0:
                raise ValueError(f"node {n!r}: bytes must be >= 0, got {b}")
        for n in observed.keys() - self._samples.keys():
            self._samples[n] = deque(maxlen=self.history)
        for n, q in self._samples.items():
            q.append(float(observed.get(n, 0.0)))
        self._means = None

    def estimate(self) -> dict[str, float]:
        """node id -> mean bytes per checkpoint over its recorded history (a new dict
        each call; the means are computed once per update)."""
        return dict(self._cached_means())

    def mean(self, node: str) -> float:
        """``estimate()[node]``, 0.0 for a node never seen (no copy)."""
        return self._cached_means().get(node, 0.0)

    def _cached_means(self) -> dict[str, float]:
        if self._means is None:
            self._means = {n: sum(q) / len(q) for n, q in self._samples.items()}
        return self._means


def planned_object_sizes(plan: TreePlan) -> list[int]:
    """Bytes of the objects ``plan``'s collectors write per checkpoint if their expected
    residuals arrive: each cuts an object whenever it holds the target, then writes the
    rest (the simulator's collector rule)."""
    target = int(plan.target_object_bytes)
    sizes: list[int] = []
    for r in plan.expected_object_bytes().values():
        whole, rest = divmod(int(round(r)), target)
        sizes += [target] * whole + ([rest] if rest else [])
    return sizes


@dataclass(frozen=True)
class TailEstimate:
    """One candidate target object size (bytes): the objects its plan writes per
    checkpoint, the expected requests (copies and hedges included) and the predicted
    checkpoint store latency (seconds) at the chosen percentile."""

    target_object_bytes: int
    objects: int
    requests: float
    quantile_s: float


def size_for_tail(
    tree: Tree,
    own_bytes: Mapping[str, float],
    targets: Iterable[int],
    model: LatencyModel,
    policy: HedgingPolicy,
    *,
    percentile: float = 99.0,
    goal_s: float | None = None,
) -> tuple[TailEstimate, list[TailEstimate]]:
    """Choose the target object size for the checkpoint tail, not only the request
    count: for every candidate in ``targets`` (bytes) the plan's objects
    (:func:`planned_object_sizes`) and, under ``model`` and ``policy``, their predicted
    ``percentile`` (:func:`dstltree.topology.latency.checkpoint_quantile`, independent
    requests, no throttling, network time left out) and expected requests. The choice:
    the fewest requests among candidates predicted within ``goal_s`` seconds, else
    (no goal, or none meets it) the lowest predicted latency. Returns (choice, every
    estimate in the order of ``targets``). ValueError for no candidates or no bytes."""
    estimates = []
    for target in targets:
        sizes = planned_object_sizes(compute_plan(tree, own_bytes, target))
        if not sizes:
            raise ValueError("no bytes to write: nothing to size")
        requests = sum(expected_attempts(model, policy, s) for s in sizes)
        q = checkpoint_quantile(model, policy, sizes, percentile)
        estimates.append(TailEstimate(int(target), len(sizes), requests, q))
    if not estimates:
        raise ValueError("no candidate targets")
    within = [e for e in estimates if goal_s is not None and e.quantile_s <= goal_s]
    if within:
        return min(within, key=lambda e: (e.requests, e.quantile_s)), estimates
    return min(estimates, key=lambda e: (e.quantile_s, e.requests)), estimates


def prefixes_for(
    requests_per_s: float, limit_per_prefix: float = 3500.0, headroom: float = 0.5
) -> int:
    """Prefixes that keep ``requests_per_s`` (bursts included) at most ``headroom`` of
    each prefix's ``limit_per_prefix`` (S3: 3,500 PUT/s per prefix, AWS S3 performance
    guidelines), at least 1. ValueError for non-positive limit or headroom."""
    if limit_per_prefix <= 0 or not 0 < headroom <= 1 or requests_per_s < 0:
        raise ValueError("limit and headroom must be > 0 (headroom <= 1), rate >= 0")
    return max(1, math.ceil(requests_per_s / (limit_per_prefix * headroom)))
