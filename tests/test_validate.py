"""``dstl simulate --validate`` (issue 5, "Proof"), reduced: the real 7-node tree (node
and executor processes on loopback, faulty filesystem on the FLIP-158 model x0.1) and
the simulator on the same configuration. Requests per checkpoint must agree exactly;
latency is measured and reported, not asserted (shared, noisy machine)."""

from __future__ import annotations

import json
import math

import pytest

from simulations import SimConfig, simulate
from sparkplug.bench.report import to_json
from sparkplug.validate import ValidateSettings, run_validation
from topology.tree import kary_tree

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
    for side in (real, sim):
        for k in ("p50", "p90"):
            assert side["persist_ms"][k] > 0 and math.isfinite(side["persist_ms"][k])
    assert set(doc["agree"]) == {"requests_per_checkpoint", "p50_within_25pct", "p90_within_25pct"}
    parsed = json.loads(to_json(doc))
    assert {"real", "sim", "agree", "config", "calibration"} <= parsed.keys()
