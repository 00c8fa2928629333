"""The cluster simulator (simulations/): proof against the latency table, design
behaviour, determinism, throttling. Small configurations; no timed assertions."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest

from dstltree.simulations import SimConfig, simulate
from dstltree.simulations.config import Design, SimWorkload
from dstltree.simulations.storage import Throttle
from dstltree.simulations.sweep import best, sweep
from dstltree.topology.latency import get_model
from dstltree.topology.tree import Tree

MiB = 1024 * 1024


def test_one_task_reproduces_the_latency_table() -> None:
    """Issue 5, "Proof": one task, design task, reference-size objects, hedging off."""
    model = get_model("flip158-s3")
    r = simulate(
        SimConfig(
            design="task",
            executors=1,
            tasks_per_executor=1,
            bytes_per_checkpoint=model.reference_bytes,
            checkpoints=50_000,
            hedge_timeout_s=None,
            seed=1,
        )
    )
    table = {"p50": 50, "p90": 90, "p99": 99, "p999": 99.9}
    for key, p in table.items():
        tol = 0.05 if p == 99.9 else 0.02
        assert r.checkpoint_ms[key] == pytest.approx(1000 * model.percentiles[p], rel=tol)
    assert r.requests_per_checkpoint == 1 and r.hedged_requests == 0


@pytest.mark.parametrize("design", ["task", "executor", "tree", "tree-noplan"])
def test_designs_object_counts(design: Design) -> None:
    cfg = SimConfig(
        design=design,
        executors=7,
        tasks_per_executor=4,
        branching=2,
        bytes_per_checkpoint=MiB,
        target_object_bytes=4 * MiB,
        checkpoints=8,
        hedge_timeout_s=None,
    )
    r = simulate(cfg)
    expected = {"task": 28, "executor": 7}.get(design)
    if expected is not None:
        assert r.objects_per_checkpoint == expected
    else:
        total = 28 * MiB
        collectors = 7
        assert r.objects_per_checkpoint <= math.ceil(total / cfg.target_object_bytes) + collectors
        assert r.mean_object_bytes >= cfg.target_object_bytes / 2
    assert r.requests_per_checkpoint == r.objects_per_checkpoint  # no hedging
    assert r.throttled_requests == 0
    assert 0 < r.checkpoint_ms["p50"] <= r.checkpoint_ms["p99"]


def test_plans_take_one_hop_noplan_relays() -> None:
    tree = Tree.from_edges(
        ["root", "a", "b", "a1", "a2", "b1", "b2"],
        [("root", "a"), ("root", "b"), ("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2")],
    )
    base: dict[str, Any] = dict(
        executors=7,
        tree=tree,
        tasks_per_executor=4,
        bytes_per_checkpoint=MiB,
        target_object_bytes=64 * MiB,
        checkpoints=8,
    )
    planned = simulate(SimConfig(design="tree", **base))
    noplan = simulate(SimConfig(design="tree-noplan", **base))
    assert planned.relay_fraction == 0.0  # one hop to the collector after the first window
    assert noplan.relay_fraction > 0.05  # leaves' bytes pass a and b
    assert planned.objects_per_checkpoint == noplan.objects_per_checkpoint == 1


def test_deterministic() -> None:
    cfg = SimConfig(design="tree", executors=50, distribution="lognormal", checkpoints=6)
    a, b = simulate(cfg), simulate(cfg)
    assert a.checkpoint_ms == b.checkpoint_ms
    assert a.requests_per_checkpoint == b.requests_per_checkpoint


# 400 tasks writing their own objects against 100 PUT/s: the store throttles
_OVER_THE_LIMIT = SimConfig(
    design="task",
    executors=100,
    tasks_per_executor=4,
    put_rate_limit=100,
    checkpoints=3,
    hedge_timeout_s=None,
    dfs_latency="local",
)


def test_throttling_kicks_in_over_the_rate_limit() -> None:
    cfg = _OVER_THE_LIMIT
    r = simulate(cfg)
    assert r.throttled_requests > 0 and not r.within_rate_limit
    tree = simulate(replace(cfg, design="tree"))
    assert tree.throttled_requests == 0 and tree.within_rate_limit


def test_throttle_admits_rate_per_window_and_backs_off() -> None:
    th = Throttle(rate_per_s=10, window_s=1.0)
    rng = random.Random(0)
    res = [th.admit("p", 0.0, rng) for _ in range(25)]
    assert [k for _, k in res[:10]] == [0] * 10
    assert all(k > 0 and t >= 1.0 for t, k in res[10:])
    windows = [int(t) for t, _ in res]
    assert max(windows.count(w) for w in set(windows)) <= 10


def test_workload_distributions() -> None:
    cfg = SimConfig(
        executors=100,
        tasks_per_executor=4,
        distribution="skewed",
        hot_fraction=0.1,
        hot_factor=10.0,
        bytes_per_checkpoint=1000,
    )
    x = SimWorkload(cfg).next()
    assert x.shape == (100, 4) and (x.sum(axis=1) == 40_000).sum() == 10
    ln = SimWorkload(
        SimConfig(executors=1000, distribution="lognormal", bytes_per_checkpoint=1000)
    ).next()
    assert ln.mean() == pytest.approx(1000, rel=0.1)


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="design"):
        SimConfig(design="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one node per executor"):
        SimConfig(executors=3, tree=Tree.from_edges(["a"], []))
    with pytest.raises(ValueError, match="known"):
        simulate(SimConfig(dfs_latency="nope", checkpoints=1))


def test_sweep_names_the_best_under_the_limit() -> None:
    base = SimConfig(
        executors=30,
        tasks_per_executor=2,
        checkpoints=4,
        put_rate_limit=40,
        dfs_latency="local",
        hedge_timeout_s=None,
    )
    out = sweep(
        base, branching=[2, 4], targets=[MiB, 4 * MiB], designs=["task", "executor", "tree"]
    )
    assert len(out) == 2 + 4  # task and executor do not depend on the swept values
    b = best(out)
    assert b is not None and b.within_rate_limit
    assert b.checkpoint_ms["p99"] == min(r.checkpoint_ms["p99"] for r in out if r.within_rate_limit)


def test_hedging_does_not_repeat_throttled_uploads_unless_told_to() -> None:
    """Over the rate limit with hedging after 50 ms: the throttle-aware rule (the real
    uploader's) skips hedges and repeats no throttled upload; the blind rule repeats
    them. Copies of small objects are counted as such."""
    cfg = replace(_OVER_THE_LIMIT, hedge_timeout_s=0.05)
    aware = simulate(cfg)
    assert aware.throttled_requests > 0
    assert aware.hedges_repeated_throttled == 0 and aware.hedges_skipped_throttled > 0
    blind = simulate(replace(cfg, throttle_aware=False))
    assert blind.hedges_repeated_throttled > 0 and blind.hedges_skipped_throttled == 0
    copies = simulate(replace(cfg, put_rate_limit=1e6, hedge_copies=2))
    assert copies.throttled_requests == 0 and copies.hedge_copies > 0
    with pytest.raises(ValueError, match="copies"):
        SimConfig(hedge_copies=0)
