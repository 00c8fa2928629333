"""Latency models and the hedging rule (topology/latency.py)."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from dstltree.topology.latency import (
    HedgeState,
    HedgingPolicy,
    LatencyModel,
    get_model,
    hedge_timeline,
    hedged_latency,
)

MiB = 1 << 20

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


def test_policy_size_term_and_validation() -> None:
    p = HedgingPolicy(1.0, 3, bandwidth=1e6)
    assert HedgeState(p).timeout(2_000_000) == pytest.approx(3.0)
    assert HedgeState(HedgingPolicy(1.0, bandwidth=None)).timeout(10**9) == 1.0
    assert HedgeState(HedgingPolicy(None)).timeout(1) is None
    assert HedgingPolicy(copies=2).copies_for(MiB) == 2
    assert HedgingPolicy(copies=2, copies_max_bytes=10).copies_for(11) == 1
    assert HedgingPolicy(max_attempts=1, copies=2).copies_for(1) == 1
    for bad in ({"copies": 0}, {"bandwidth": 0.0}, {"quiet_s": -1.0}, {"adaptive_percentile": 0}):
        with pytest.raises(ValueError):
            HedgingPolicy(**bad)  # type: ignore[arg-type]


def test_throttle_spans_merge_and_expire() -> None:
    s = HedgeState(HedgingPolicy(quiet_s=2.0))
    assert s.hedge_at(5.0) == 5.0
    s.note_throttle(10.0)
    s.note_throttle(11.0, 12.0)  # overlaps: one span [10, 14)
    s.note_throttle(20.0)
    assert s.hedge_at(9.9) == 9.9 and s.hedge_at(10.0) == 14.0 and s.hedge_at(13.0) == 14.0
    assert s.hedge_at(14.0) == 14.0 and s.hedge_at(21.0) == 22.0
    s.note_throttle(13.5, 19.0)  # bridges both: [10, 22)
    assert s.hedge_at(15.0) == 22.0
    s.forget_before(23.0)
    assert s.hedge_at(21.0) == 21.0
    blind = HedgeState(HedgingPolicy(throttle_aware=False))
    blind.note_throttle(1.0)
    assert blind.hedge_at(1.5) == 1.5


def test_adaptive_timeout_ignores_the_size_term() -> None:
    p = HedgingPolicy(5.0, bandwidth=1e6, adaptive_percentile=50, adaptive_min_samples=3)
    s = HedgeState(p)
    for size in (0, 1_000_000, 2_000_000):  # each 0.2 s beyond its size term
        s.note_latency(0.2 + size / 1e6, size)
        assert s.timeout(0) == (5.0 if size < 2_000_000 else pytest.approx(0.2))
    assert s.timeout(4_000_000) == pytest.approx(4.2)
    floor = HedgeState(replace(p, adaptive_floor_s=0.5))
    for _ in range(3):
        floor.note_latency(0.01, 0)
    assert floor.timeout(0) == 0.5


def _attempts(durations: list[float], throttled: dict[int, float] | None = None):  # noqa: ANN202
    calls: list[tuple[int, float]] = []

    def attempt(k: int, offset: float) -> tuple[float, float | None]:
        calls.append((k, offset))
        return durations[k], (throttled or {}).get(k)

    return attempt, calls


def test_timeline_matches_the_plain_rule_without_throttling() -> None:
    state = HedgeState(HedgingPolicy(1.0, 3, bandwidth=None))
    attempt, calls = _attempts([5.0, 0.3, 0.1])
    out = hedge_timeline(state, 100, 0.0, attempt)
    assert (out.latency_s, out.attempts, out.skipped, out.repeated) == (1.3, 2, 0, 0)
    assert calls == [(0, 0.0), (1, 1.0)]


def test_a_large_object_is_not_hedged_for_its_size() -> None:
    state = HedgeState(HedgingPolicy(1.0, 3, bandwidth=1e6))
    attempt, calls = _attempts([2.5, 0.1, 0.1])  # 3 MB at 1 MB/s: 2.5 s is on time
    assert hedge_timeline(state, 3_000_000, 0.0, attempt).attempts == 1
    assert calls == [(0, 0.0)]


def test_a_throttled_request_is_never_hedged() -> None:
    state = HedgeState(HedgingPolicy(1.0, 3, bandwidth=None))
    attempt, calls = _attempts([5.0, 0.1, 0.1], {0: 0.01})
    out = hedge_timeline(state, 1, 0.0, attempt)
    assert (out.latency_s, out.attempts, out.skipped, out.repeated) == (5.0, 1, 1, 0)
    blind = HedgeState(HedgingPolicy(1.0, 3, bandwidth=None, throttle_aware=False))
    attempt, calls = _attempts([5.0, 3.0, 0.1], {0: 0.01, 1: 0.01})
    out = hedge_timeline(blind, 1, 0.0, attempt)
    assert (out.attempts, out.skipped, out.repeated) == (3, 0, 2)


def test_hedges_wait_for_the_quiet_period() -> None:
    state = HedgeState(HedgingPolicy(1.0, 3, bandwidth=None, quiet_s=2.0, copies=2))
    state.note_throttle(9.0)  # another request was throttled: blocked until 11.0
    attempt, calls = _attempts([4.0, 0.5, 0.1])
    out = hedge_timeline(state, 1, 9.5, attempt)  # copies blocked; hedge due at 10.5
    assert calls == [(0, 0.0), (1, 1.5)], "the hedge starts when the quiet period ends"
    assert (out.latency_s, out.attempts, out.copies, out.skipped) == (2.0, 2, 1, 2)


def test_copies_start_together() -> None:
    state = HedgeState(HedgingPolicy(1.0, 3, bandwidth=None, copies=2))
    attempt, calls = _attempts([0.9, 0.4, 0.1])
    out = hedge_timeline(state, 1, 0.0, attempt)
    assert calls == [(0, 0.0), (1, 0.0)]
    assert (out.latency_s, out.attempts, out.copies) == (0.4, 2, 2)


def test_no_hedge_is_counted_skipped_without_throttling() -> None:
    state = HedgeState(HedgingPolicy(0.3, 3, bandwidth=None))
    for i in range(1000):  # late start times: t + offset - t is not offset
        attempt, _ = _attempts([1.0, 1.0, 0.2])
        out = hedge_timeline(state, 1, 8.1 + i * 0.37, attempt)
        assert (out.attempts, out.skipped) == (3, 0)
