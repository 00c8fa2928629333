"""The simulated store (simulations/storage.py): the real uploader's hedging rule under
throttling, prefixes, copies, and its counters."""

from __future__ import annotations

import random

from dstltree.simulations.storage import SimulatedStore, StoreCounters, Throttle
from dstltree.topology.latency import HedgingPolicy, get_model

S3 = get_model("flip158-s3")
MiB = 1 << 20


def _burst(policy: HedgingPolicy, prefixes: int = 1, n: int = 4000, rounds: int = 3):  # noqa: ANN202
    """``rounds`` bursts of ``n`` objects of 2.5 MiB, one per second, 3,500 PUT/s per
    prefix: (store, latest completion per round)."""
    store = SimulatedStore(S3, policy, Throttle(3500.0), random.Random(1), prefixes=prefixes)
    done = [max(store.put(r, float(r), int(2.5 * MiB)) for _ in range(n)) for r in range(rounds)]
    return store, done


def test_throttling_stops_hedges() -> None:
    store, _ = _burst(HedgingPolicy(1.0, 3))
    tot = store.totals(range(3))
    assert tot.throttled > 0 and tot.skipped_throttled > 0
    assert tot.repeated_throttled == 0, "no upload repeated because of throttling"
    assert tot.requests == tot.objects + tot.hedged
    blind, _ = _burst(HedgingPolicy(1.0, 3, throttle_aware=False))
    old = blind.totals(range(3))
    assert old.repeated_throttled > 0 and old.hedged > 10 * max(tot.hedged, 1)
    assert old.throttled > tot.throttled


def test_prefixes_keep_each_under_its_limit() -> None:
    store, done = _burst(HedgingPolicy(1.0, 3), prefixes=4)
    tot = store.totals(range(3))
    assert tot.throttled == 0 and tot.objects == 12_000
    assert max(d - r for r, d in enumerate(done)) < S3.max_s + 1.0 + 0.1


def test_copies_go_to_other_prefixes_and_are_counted() -> None:
    policy = HedgingPolicy(1.0, 3, copies=2)
    store, _ = _burst(policy, prefixes=2, n=3000, rounds=1)
    tot = store.totals([0])
    # 3,000 objects x 2 copies = 6,000 requests: within 2 x 3,500 only if split evenly
    assert tot.copies == 3000 and tot.throttled == 0
    assert tot.requests == tot.objects + tot.copies + tot.hedged


def test_counters_add_up() -> None:
    a, b = StoreCounters(objects=1, copies=2), StoreCounters(objects=3, skipped_throttled=4)
    a.add(b)
    assert (a.objects, a.copies, a.skipped_throttled) == (4, 2, 4)
