"""The sweep's recommendation (:func:`best`), the tail floor, the plot and the emitted
topology's hedging fields, on hand-made results (no simulation) and one tiny sweep
through the node core."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dstltree.simulations.cluster import SimResult
from dstltree.simulations.config import SimConfig
from dstltree.simulations.emit import recommended_topology, write_topology
from dstltree.simulations.sweep import best, floor_ms, plot, sweep
from dstltree.topology.config import load_topology

MiB = 2**20


def _result(
    p99: float, requests: float, throttled: int = 0, branching: int = 4, target: int = 4 * MiB
) -> SimResult:
    return SimResult(
        design="tree",
        executors=500,
        tasks_per_executor=4,
        branching=branching,
        target_object_bytes=target,
        checkpoints=20,
        checkpoint_interval_s=1.0,
        checkpoint_ms={"p50": p99 / 2, "p90": p99 * 0.9, "p99": p99},
        requests_per_checkpoint=requests,
        objects_per_checkpoint=requests,
        mean_object_bytes=float(target),
        relay_fraction=0.5,
        throttled_requests=throttled,
        hedged_requests=0,
        put_rate_limit=3500.0,
        wall_s=1.0,
    )


def test_best_takes_fewest_requests_among_the_near_lowest_p99() -> None:
    fast_costly = _result(1000.0, 400.0, branching=2)
    near_cheap = _result(1040.0, 150.0, branching=8)  # within 5 %: chosen
    slow_cheapest = _result(1200.0, 50.0, branching=16)
    assert best([fast_costly, near_cheap, slow_cheapest]) is near_cheap
    assert best([fast_costly, near_cheap, slow_cheapest], p99_slack=0.0) is fast_costly
    assert best([fast_costly, near_cheap, slow_cheapest], p99_slack=0.25) is slow_cheapest


def test_best_skips_throttled_and_counts_the_limit_per_prefix() -> None:
    throttled = _result(900.0, 100.0, throttled=3)
    over_one_prefix = _result(950.0, 4000.0)  # 4,000 PUT/s: over 3,500, under 4 x 3,500
    slow = _result(1500.0, 100.0)
    assert best([throttled, over_one_prefix, slow]) is slow
    assert best([throttled, over_one_prefix, slow], prefixes=4) is over_one_prefix
    assert best([throttled]) is None
    with pytest.raises(ValueError):
        best([slow], prefixes=0)


def test_floor_is_one_hedged_requests_p99() -> None:
    assert floor_ms() == pytest.approx(937.0)  # FLIP-158, hedged table
    assert floor_ms("flip158-s3-hedged") == pytest.approx(937.0)


def test_plot_marks_floor_and_limit(tmp_path: Path) -> None:
    rs = [_result(1000.0, 200.0, branching=b, target=t) for b in (4, 8) for t in (MiB, 6 * MiB)]
    out = plot(rs, tmp_path / "p.png", title="t", prefixes=4, floor_ms=937.0)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_emitted_topology_carries_hedging_and_prefixes(tmp_path: Path) -> None:
    cfg = SimConfig(
        executors=500,
        hedge_copies=2,
        hedge_adaptive_percentile=75.0,
        prefixes=4,
        target_object_bytes=6 * MiB,
    )
    r = _result(950.0, 200.0, branching=8, target=6 * MiB)
    topo = recommended_topology(r, cfg)
    assert (topo.upload_copies, topo.upload_adaptive_percentile) == (2, 75.0)
    assert topo.object_prefixes >= 4 and topo.branching == 8
    path = write_topology(tmp_path / "t.yaml", r, cfg)
    doc = yaml.safe_load(path.read_text())
    assert doc["upload_copies"] == 2 and doc["upload_adaptive_percentile"] == 75.0
    loaded = load_topology(path)
    assert loaded.upload_copies == 2 and int(loaded.target_object_bytes) == 6 * MiB


def test_sweep_runs_the_node_core_with_hedging() -> None:
    base = SimConfig(
        executors=6,
        checkpoints=2,
        warmup_checkpoints=0,
        hedge_copies=2,
        hedge_adaptive_percentile=75.0,
    )
    rs = sweep(base, [2, 4], [MiB], designs=("executor", "tree"))
    assert [(r.design, r.branching) for r in rs] == [
        ("executor", base.branching),
        ("tree", 2),
        ("tree", 4),
    ]
    assert all(r.hedge_copies > 0 for r in rs if r.design == "tree")  # copies were written
    chosen = best(rs)
    assert chosen is not None and chosen in rs
