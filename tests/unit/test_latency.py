"""Latency models and the hedging rule (topology/latency.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from dstltree.topology.latency import HedgingPolicy, LatencyModel, get_model, hedged_latency

S3 = get_model("flip158-s3")


def test_table_points_are_exact_at_reference_size() -> None:
    for p, s in {50: 0.459, 90: 0.740, 95: 0.833, 99: 1.039, 99.9: 3.202}.items():
        assert S3.quantile(p) == pytest.approx(s)
    hedged = get_model("flip158-s3-hedged")
    assert hedged.quantile(99.9) == pytest.approx(1.689)
    assert S3.reference_bytes == 5_000_000


def test_tails_below_and_above_the_table() -> None:
    assert S3.quantile(0) == pytest.approx(0.5 * 0.459)
    assert S3.quantile(25) == pytest.approx((0.5 * 0.459 + 0.459) / 2)
    slope = (3.202 - 1.039) / 0.9
    assert S3.max_s == pytest.approx(3.202 + 0.1 * slope)
    assert S3.quantile(100) == pytest.approx(S3.max_s)
    rng = random.Random(1)
    assert max(S3.sample(rng, S3.reference_bytes) for _ in range(20_000)) <= S3.max_s


def test_sampling_reproduces_the_table() -> None:
    rng = random.Random(7)
    xs = np.array([S3.sample(rng, S3.reference_bytes) for _ in range(100_000)])
    for p, s in S3.percentiles.items():
        assert np.percentile(xs, p) == pytest.approx(s, rel=0.03)


def test_size_shift_and_floor() -> None:
    assert S3.quantile(50, S3.reference_bytes + int(S3.bandwidth)) == pytest.approx(1.459)
    assert S3.quantile(0, 0) == S3.floor_s or S3.quantile(0, 0) > S3.floor_s
    tiny = LatencyModel("t", {50: 0.1}, 1000, bandwidth=100.0, floor_s=0.05)
    assert tiny.quantile(50, 0) == 0.05  # 0.1 - 10 s, floored
    assert tiny.max_s == pytest.approx(0.1)  # one point: flat above it
    with pytest.raises(ValueError):
        S3.quantile(50, -1)
    with pytest.raises(ValueError):
        S3.quantile(101)


def test_scaled() -> None:
    fast = S3.scaled(0.01)
    assert fast.quantile(99) == pytest.approx(0.01039)
    assert fast.quantile(50, S3.reference_bytes * 2) == pytest.approx(
        0.01 * S3.quantile(50, S3.reference_bytes * 2)
    )
    with pytest.raises(ValueError):
        S3.scaled(0)


def test_local_model_is_fast() -> None:
    local = get_model("local")
    assert local.quantile(99.9) < 0.05


def test_bad_models() -> None:
    with pytest.raises(ValueError, match="known: flip158-s3, flip158-s3-hedged, local"):
        get_model("gcs")
    with pytest.raises(ValueError, match="empty"):
        LatencyModel("x", {}, 1, 1.0)
    with pytest.raises(ValueError, match="non-decreasing"):
        LatencyModel("x", {50: 2.0, 90: 1.0}, 1, 1.0)
    with pytest.raises(ValueError, match=r"\(0, 100\)"):
        LatencyModel("x", {100: 2.0}, 1, 1.0)


def test_hedged_latency_rules() -> None:
    # attempt 0 is slow; attempt 1 starts at 1.0 and takes 0.3: done at 1.3
    assert hedged_latency(lambda k: [5.0, 0.3, 0.1][k], 1.0, 3) == (1.3, 2)
    # fast first attempt: no hedge
    assert hedged_latency(lambda k: 0.4, 1.0, 3) == (0.4, 1)
    # all slow: three attempts, the first still wins
    assert hedged_latency(lambda k: 2.5, 1.0, 3) == (2.5, 3)
    # max_attempts caps
    assert hedged_latency(lambda k: 9.0, 1.0, 1) == (9.0, 1)
    calls: list[int] = []

    def attempt(k: int) -> float:
        calls.append(k)
        return 0.5

    # attempts at 0, 0.2, 0.4 start; at 0.6 attempt 0 has finished (0.5)
    assert hedged_latency(attempt, 0.2, 5) == (0.5, 3)
    assert calls == [0, 1, 2]
    with pytest.raises(ValueError):
        hedged_latency(lambda k: 1.0, 0, 3)


def test_hedging_policy_cuts_the_tail() -> None:
    off, on = HedgingPolicy(None), HedgingPolicy(1.0, 3)
    rng_a, rng_b = random.Random(3), random.Random(3)
    plain = [off.run(lambda k: S3.sample(rng_a, S3.reference_bytes))[0] for _ in range(20_000)]
    hedged = [on.run(lambda k: S3.sample(rng_b, S3.reference_bytes))[0] for _ in range(20_000)]
    assert np.percentile(hedged, 99.9) < np.percentile(plain, 99.9)
    assert max(hedged) <= 1.0 + S3.max_s
    with pytest.raises(ValueError):
        HedgingPolicy(-1.0)


def test_model_pickles() -> None:
    import pickle

    copy = pickle.loads(pickle.dumps(S3))
    assert copy == S3 and copy.quantile(99.9) == S3.quantile(99.9)
