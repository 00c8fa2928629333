"""``dstl simulate --validate``, reduced: the real 7-node tree (node
and executor processes on loopback, faulty filesystem on the FLIP-158 model x0.1) and
the simulator on the same configuration. Requests per checkpoint must agree exactly;
latency is measured and reported, not asserted (shared, noisy machine)."""

from __future__ import annotations

import json
import math

import pytest

from dstltree.bench.report import to_json
from dstltree.bench.validate import ValidateSettings, run_validation
from dstltree.simulations import SimConfig, simulate
from dstltree.topology.latency import get_model
from dstltree.topology.tree import kary_tree

KiB = 1024


def test_node_rules_count_whole_batches() -> None:
    """With the real node's rules a writer node writes each batch as one object: 12
    segments against a target of 11.5 give one object per inner node (a size cut that
    completes the checkpoint) and one at the root: 3 per checkpoint."""
    seg = 64 * KiB
    cfg = SimConfig(
        executors=7,
        tree=kary_tree(7, 2),
        tasks_per_executor=4,
        bytes_per_checkpoint=seg,
        target_object_bytes=int(11.5 * seg),
        checkpoints=8,
        plan_window=2,
        warmup_checkpoints=6,
        design="tree",
        hedge_timeout_s=None,
        dfs_latency_scale=0.1,
        node_rules=True,
    )
    r = simulate(cfg)
    assert r.requests_per_checkpoint == 3
    assert r.relay_fraction == 0


@pytest.mark.timeout(120)
def test_reduced_validation_requests_agree() -> None:
    vs = ValidateSettings(
        checkpoints=16,
        plan_window=4,
        warmup_windows=3,
        calibrate=False,
        hop_latency_s=0.004,
        seed=0,
    )
    doc = run_validation(vs)
    real, sim = doc["real"], doc["sim"]
    assert real["fallback_segments"] == 0
    assert real["uploads_total"] == real["objects_total"]  # hedging off, no retries
    assert real["requests_per_checkpoint"] == sim["requests_per_checkpoint"]
    assert doc["agree"]["requests_per_checkpoint"] is True
    assert len(real["requests_each_checkpoint"]) == len(real["persist_ms_each_checkpoint"]) == 16
    assert real["requests_per_window"] == [
        sum(real["requests_each_checkpoint"][i : i + 4]) / 4 for i in range(0, 16, 4)
    ]
    assert real["requests_per_checkpoint"] == real["requests_per_window"][3]  # after warm-up
    assert real["objects_total"] == sum(real["requests_each_checkpoint"])
    # after the warm-up, per checkpoint: one object of 12 segments (>= the 11.5-segment
    # target) from each inner node and one of its own 4 from the root
    assert real["requests_each_checkpoint"][vs.warmup :] == [3] * 4
    # every checkpoint waits for at least one PUT of the scaled model
    put_floor_ms = get_model("flip158-s3").scaled(vs.scale).floor_s * 1000
    for side in (real, sim):
        p50, p90 = side["persist_ms"]["p50"], side["persist_ms"]["p90"]
        assert put_floor_ms <= p50 <= p90 and math.isfinite(p90)
    cfg = doc["config"]
    assert (cfg["executors"], cfg["writers"], cfg["measured_checkpoints"]) == (7, 28, 4)
    assert cfg["target_between_11_and_12_segments"] is True
    assert cfg["segment_bytes"] > vs.bytes_per_writer  # changes plus encoding
    assert doc["calibration"] == {"hop_latency_s": 0.004, "cpu_per_message_s": 50e-6}
    assert set(doc["agree"]) == {"requests_per_checkpoint", "p50_within_25pct", "p90_within_25pct"}
    parsed = json.loads(to_json(doc))
    assert {"real", "sim", "agree", "config", "calibration"} <= parsed.keys()
