"""The simulator's tree designs on the real node core (simulations/nodeshell.py):
small trees, every rule from ``aggregator.core``; no timed assertions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dstltree.simulations import SimConfig, simulate
from dstltree.topology.tree import Tree, kary_tree

KiB = 1024
MiB = 1024 * KiB
_SIM = Path(__file__).resolve().parents[2] / "simulations"


def _seven(**kw: object) -> SimConfig:
    seg = 64 * KiB
    base: dict[str, object] = dict(
        executors=7,
        tree=kary_tree(7, 2),
        tasks_per_executor=4,
        bytes_per_checkpoint=seg,
        target_object_bytes=int(11.5 * seg),
        checkpoints=12,
        plan_window=4,
        warmup_checkpoints=0,
        design="tree",
        hedge_timeout_s=None,
        dfs_latency_scale=0.1,
        checkpoint_interval_s=0.25,
    )
    base.update(kw)
    return SimConfig(**base)  # type: ignore[arg-type]


def test_node_core_counts_whole_batches_in_every_window() -> None:
    """12 segments against a target of 11.5: each inner node cuts one object on size
    (hop by hop in window 0, as planned collector later) and the root writes its own
    4: 3 objects in every checkpoint, window 0 and plan changes included."""
    r = simulate(_seven())
    assert r.objects_each_checkpoint == [3] * 12
    assert r.requests_per_checkpoint == 3 and r.fallback_segments == 0
    assert len(r.each_checkpoint_ms) == 12


def test_invariants_hold_in_the_simulator() -> None:
    """Every node core checks its invariants after each event (NodeCore.validate)."""
    r = simulate(_seven(check_invariants=True, checkpoints=8, distribution="lognormal"))
    assert r.fallback_segments == 0 and len(r.objects_each_checkpoint) == 8


def test_plans_come_from_the_root() -> None:
    """Window 0 has no plan: leaves' bytes pass their parents (relayed); once the root
    planned, every node sends one hop to its collector (nothing relayed)."""
    tree = Tree.from_edges(
        ["root", "a", "b", "a1", "a2", "b1", "b2"],
        [("root", "a"), ("root", "b"), ("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2")],
    )
    base = dict(tree=tree, target_object_bytes=64 * MiB, bytes_per_checkpoint=MiB)
    first = simulate(_seven(checkpoints=4, **base))
    later = simulate(_seven(checkpoints=8, warmup_checkpoints=4, **base))
    noplan = simulate(_seven(checkpoints=8, warmup_checkpoints=4, design="tree-noplan", **base))
    assert first.relay_fraction > 0.05
    assert later.relay_fraction == 0.0
    assert noplan.relay_fraction > 0.05
    assert later.objects_each_checkpoint == noplan.objects_each_checkpoint == [1] * 8


def test_deterministic_and_every_writer_acked() -> None:
    cfg = SimConfig(design="tree", executors=40, distribution="lognormal", checkpoints=6)
    a, b = simulate(cfg), simulate(cfg)
    assert a.each_checkpoint_ms == b.each_checkpoint_ms
    assert a.objects_each_checkpoint == b.objects_each_checkpoint
    assert a.fallback_segments == 0 and all(x > 0 for x in a.each_checkpoint_ms)


@pytest.mark.parametrize("name", ["cluster.py", "nodeshell.py", "config.py"])
def test_no_copy_of_the_node_rules(name: str) -> None:
    """The simulator imports no plan or batching rule of its own: plans, batches and
    routes come from the node core."""
    tree = ast.parse((_SIM / name).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not imported & {"compute_plan", "decide_local", "ByteEstimator", "Batch", "TreePlan"}
