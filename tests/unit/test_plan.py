"""Property tests of the plan policy (topology/plan.py), DESIGN.md "The plan"."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstltree.topology.plan import (
    ByteEstimator,
    LocalDecision,
    TreePlan,
    compute_plan,
    decide_local,
    live_parent,
    window_of,
)
from dstltree.topology.tree import Tree, kary_tree


@st.composite
def trees_and_loads(draw: st.DrawFn, with_down: bool = False, dag: bool = False):
    """A random tree (with ``dag``: several roots, further parents of lower index) and
    loads; node i's parents all have indices below i, so the graph is a DAG."""
    n = draw(st.integers(1, 40))
    ids = [f"n{i}" for i in range(n)]
    edges, more = [], {}
    for i in range(1, n):
        if dag and draw(st.integers(0, 9)) == 0:
            continue  # another root
        p = draw(st.integers(0, i - 1))
        edges.append((ids[p], ids[i]))
        if dag:
            extra = draw(st.lists(st.integers(0, i - 1), max_size=2, unique=True))
            more[ids[i]] = [ids[j] for j in extra if j != p]
    tree = Tree.from_edges(ids, edges, more)
    loads = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n))
    own = dict(zip(ids, map(float, loads), strict=True))
    target = draw(st.integers(1, 20_000))
    down: set[str] = set()
    if with_down:
        down = set(draw(st.lists(st.sampled_from(ids), max_size=max(0, n - 1), unique=True)))
        if len(down) == n:
            down.pop()
    order_seed = draw(st.integers(0, 2**31))
    return tree, own, target, frozenset(down), order_seed


def plan_by_messages(
    tree: Tree, own: dict[str, float], target: float, down: frozenset[str], order_seed: int
) -> dict[str, tuple[bool, str]]:
    """Each live node decides from its own bytes and its live children's reports, in a
    random order of message delivery; then collector addresses flow down."""
    rng = random.Random(order_seed)
    live = [v for v in tree.nodes if v not in down]
    parent = {v: live_parent(tree, v, down) for v in live}
    kids: dict[str, list[str]] = {v: [] for v in live}
    for v, p in parent.items():
        if p is not None:
            kids[p].append(v)
    reports: dict[str, dict[str, float]] = {v: {} for v in live}
    decided: dict[str, LocalDecision] = {}
    while len(decided) < len(live):
        ready = [v for v in live if v not in decided and len(reports[v]) == len(kids[v])]
        v = rng.choice(ready)
        d = decide_local(v, own[v], reports[v].values(), target, parent[v] is None)
        decided[v] = d
        pv = parent[v]
        if pv is not None:
            reports[pv][v] = d.reported_bytes
    out: dict[str, tuple[bool, str]] = {}
    todo = [v for v in live if parent[v] is None]
    while todo:
        v = todo.pop()
        p = parent[v]
        out[v] = (decided[v].writes, decided[v].collector(None if p is None else out[p][1]))
        todo.extend(kids[v])
    return out


def check_invariants(tree: Tree, own: dict[str, float], target: float, plan: TreePlan) -> None:
    down = plan.down
    for v, np_ in plan.nodes.items():
        assert v not in down
        chain = [v]  # the way up while the down nodes are down: live parents
        while (up := live_parent(tree, chain[-1], down)) is not None:
            assert up not in chain, "the routes are acyclic"
            chain.append(up)
        assert np_.collector in chain, "collector is the node itself or a live parent's"
        assert np_.collector not in down
        assert plan.nodes[np_.collector].writes
        # exactly one collector: the nearest writing live node on the chain
        first = next(a for a in chain if a in plan.nodes and plan.nodes[a].writes)
        assert np_.collector == first
        is_root = live_parent(tree, v, down) is None
        if is_root:
            assert np_.writes, "the root always writes"
        elif np_.writes:
            assert np_.residual_bytes >= target
        else:
            assert np_.residual_bytes < target
    # bytes are conserved: all live own bytes end up at some collector exactly once
    total = sum(b for n, b in own.items() if n not in down)
    assert sum(plan.expected_object_bytes().values()) == pytest.approx(total)


@settings(max_examples=150, deadline=None)
@given(trees_and_loads())
def test_plan_properties(case) -> None:
    tree, own, target, _, _ = case
    plan = compute_plan(tree, own, target)
    check_invariants(tree, own, target, plan)
    assert plan.nodes[tree.root].writes
    assert compute_plan(tree, dict(reversed(list(own.items()))), target) == plan


@settings(max_examples=150, deadline=None)
@given(trees_and_loads(with_down=True))
def test_local_equals_global_with_down_nodes(case) -> None:
    tree, own, target, down, seed = case
    plan = compute_plan(tree, own, target, down=down)
    check_invariants(tree, own, target, plan)
    local = plan_by_messages(tree, own, target, down, seed)
    assert local == {v: (p.writes, p.collector) for v, p in plan.nodes.items()}


@settings(max_examples=150, deadline=None)
@given(trees_and_loads(with_down=True, dag=True))
def test_a_dag_with_down_nodes_plans_as_its_nodes_decide(case) -> None:
    tree, own, target, down, seed = case
    plan = compute_plan(tree, own, target, down=down)
    check_invariants(tree, own, target, plan)
    for r in tree.roots:
        assert r in down or plan.nodes[r].writes
    local = plan_by_messages(tree, own, target, down, seed)
    assert local == {v: (p.writes, p.collector) for v, p in plan.nodes.items()}


def test_a_node_whose_first_parent_is_down_goes_to_its_second_parent() -> None:
    # root <- a <- a1 ; root <- b <- b1 ; b1's second parent a
    tree = Tree.from_edges(
        ["root", "a", "b", "a1", "b1"],
        [("root", "a"), ("root", "b"), ("a", "a1"), ("b", "b1")],
        {"b1": ["a"]},
    )
    assert live_parent(tree, "b1", {"b"}) == "a"
    assert live_parent(tree, "b1", {"b", "a"}) == "root"  # then their parents
    assert live_parent(tree, "b1", {"b", "a", "root"}) is None
    own = {"root": 1, "a": 1, "b": 1, "a1": 1, "b1": 8}
    plan = compute_plan(tree, own, 9, down={"b"})
    assert plan.nodes["a"].residual_bytes == 10.0  # a1 and b1 report to a
    assert plan.nodes["a"].writes and plan.collector_of("b1") == "a"
    assert compute_plan(tree, own, 9).collector_of("b1") == "b"  # b is back: the tree


def test_small_example() -> None:
    # root <- a <- a1, a2 ; root <- b
    tree = Tree.from_edges(
        ["root", "a", "b", "a1", "a2"], [("root", "a"), ("root", "b"), ("a", "a1"), ("a", "a2")]
    )
    own = {"root": 1, "a": 1, "b": 3, "a1": 6, "a2": 2}
    plan = compute_plan(tree, own, 5)
    assert plan.routes() == {"root": "root", "a": "root", "b": "root", "a1": "a1", "a2": "root"}
    assert plan.expected_object_bytes() == {"root": 7.0, "a1": 6.0}
    # a1 down: a2 and a still go to the root, a1's bytes vanish
    plan = compute_plan(tree, own, 5, down={"a1"})
    assert "a1" not in plan.nodes and plan.collectors() == ["root"]
    # root down: a and b act as roots; a1 routes to a
    plan = compute_plan(tree, own, 100, down={"root"})
    assert plan.routes() == {"a": "a", "b": "b", "a1": "a", "a2": "a"}


def test_kary_heavy_load_every_node_writes() -> None:
    tree = kary_tree(100, 4)
    plan = compute_plan(tree, dict.fromkeys(tree.nodes, 10.0), 10)
    assert len(plan.collectors()) == 100


def test_errors() -> None:
    tree = kary_tree(3, 2)
    with pytest.raises(ValueError, match="target"):
        compute_plan(tree, {}, 0)
    with pytest.raises(ValueError, match="unknown"):
        compute_plan(tree, {"zz": 1.0}, 1)
    with pytest.raises(ValueError, match=">= 0"):
        compute_plan(tree, {"e1": -1.0}, 1)
    with pytest.raises(ValueError, match="collector address"):
        decide_local("x", 0, [], 10, is_root=False).collector(None)


def test_windows() -> None:
    assert [window_of(c, 4) for c in (0, 3, 4, 9)] == [0, 0, 1, 2]
    plan = compute_plan(kary_tree(3, 2), {}, 1, window=2, plan_window=4)
    assert plan.first_checkpoint == 8 and plan.covers(11) and not plan.covers(12)
    with pytest.raises(ValueError):
        window_of(-1, 4)


def test_byte_estimator_moving_average() -> None:
    est = ByteEstimator(history=3)
    for b in (3, 6, 9, 12):
        est.update({"a": b})
    est.update({"b": 5})  # a missing: counts 0
    assert est.estimate() == {"a": pytest.approx((9 + 12 + 0) / 3), "b": 5.0}
    with pytest.raises(ValueError):
        est.update({"a": -1})
    with pytest.raises(ValueError):
        ByteEstimator(0)


def test_plan_pickles() -> None:
    import pickle

    plan = compute_plan(kary_tree(9, 2), {"e3": 5.0}, 4, down={"e8"})
    copy = pickle.loads(pickle.dumps(plan))
    assert copy == plan and copy.routes() == plan.routes() and copy.down == {"e8"}
