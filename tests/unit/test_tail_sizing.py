"""Predicting the checkpoint tail from the latency model and the hedging rule
(topology/latency.py), and sizing objects and prefixes for it (topology/plan.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from dstltree.simulations.storage import SimulatedStore, Throttle
from dstltree.topology.latency import (
    HedgingPolicy,
    checkpoint_quantile,
    expected_attempts,
    get_model,
    request_survival,
)
from dstltree.topology.plan import (
    compute_plan,
    planned_object_sizes,
    prefixes_for,
    size_for_tail,
)
from dstltree.topology.tree import kary_tree

S3 = get_model("flip158-s3")
MiB = 1 << 20
OFF = HedgingPolicy(None)


def test_one_plain_request_is_the_model() -> None:
    for p in (10, 50, 90, 99, 99.9):
        x = S3.quantile(p, 3 * MiB)
        assert request_survival(S3, OFF, 3 * MiB, x) == pytest.approx(1 - p / 100)
        assert checkpoint_quantile(S3, OFF, [3 * MiB], p) == pytest.approx(x, abs=1e-6)
    assert request_survival(S3, OFF, 0, 0.0) == 1.0
    assert request_survival(S3, OFF, 0, S3.max_s + 1) == 0.0
    with pytest.raises(ValueError):
        checkpoint_quantile(S3, OFF, [], 99)


def test_copies_square_the_tail() -> None:
    two = HedgingPolicy(None, 3, copies=2)
    x = S3.quantile(99)
    assert request_survival(S3, two, S3.reference_bytes, x) == pytest.approx(0.01**2)
    assert expected_attempts(S3, two, MiB) == 2
    flink, t = HedgingPolicy(1.0, 3), 1.0 + 1 / 32  # the timeout grown by 1 MiB at 32 MiB/s
    assert expected_attempts(S3, flink, MiB) == pytest.approx(
        1 + request_survival(S3, flink, MiB, t) + request_survival(S3, flink, MiB, 2 * t)
    )


@pytest.mark.parametrize(
    "policy",
    [HedgingPolicy(1.0, 3), HedgingPolicy(0.5, 3, copies=2)],
    ids=["flink-defaults", "copies"],
)
def test_prediction_matches_the_simulated_store(policy: HedgingPolicy) -> None:
    sizes = [4 * MiB] * 50 + [MiB] * 50
    store = SimulatedStore(S3, policy, Throttle(1e9), random.Random(5), prefixes=4)
    lat = [max(store.put(r, 10.0 * r, s) for s in sizes) - 10.0 * r for r in range(400)]
    for p in (50, 90):
        assert np.percentile(lat, p) == pytest.approx(
            checkpoint_quantile(S3, policy, sizes, p), rel=0.05
        )
    reqs = store.totals(range(400)).requests / 400
    assert reqs == pytest.approx(sum(expected_attempts(S3, policy, s) for s in sizes), rel=0.05)


def test_planned_object_sizes_cut_at_the_target() -> None:
    tree = kary_tree(21, 4)
    own = dict.fromkeys(tree.nodes, 3 * MiB)
    plan = compute_plan(tree, own, 4 * MiB)
    sizes = planned_object_sizes(plan)
    assert sum(sizes) == 21 * 3 * MiB and max(sizes) == 4 * MiB


def test_size_for_tail_prefers_fewer_requests_within_the_goal() -> None:
    tree = kary_tree(40, 4)
    own = dict.fromkeys(tree.nodes, MiB)
    targets = [MiB, 4 * MiB, 16 * MiB]
    best, all_ = size_for_tail(tree, own, targets, S3, HedgingPolicy(1.0, 3), goal_s=5.0)
    assert [e.target_object_bytes for e in all_] == targets
    assert best == min(all_, key=lambda e: e.requests)
    fastest, _ = size_for_tail(tree, own, targets, S3, HedgingPolicy(1.0, 3), goal_s=0.01)
    assert fastest.quantile_s == min(e.quantile_s for e in all_)
    with pytest.raises(ValueError):
        size_for_tail(tree, own, [], S3, OFF)


def test_prefixes_for() -> None:
    assert prefixes_for(0) == 1
    assert prefixes_for(1750) == 1 and prefixes_for(1751) == 2
    assert prefixes_for(8246) == 5 and prefixes_for(8246, headroom=1.0) == 3
    with pytest.raises(ValueError):
        prefixes_for(1, headroom=0)
