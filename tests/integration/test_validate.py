"""``dstl simulate --validate``, reduced: the real 7-node tree (node
and executor processes on loopback, faulty filesystem on the FLIP-158 model x0.1) and
the simulator (the real node core in simpy) on the same configuration, over every
checkpoint (window 0 and plan changes included). Requests must agree exactly, each
checkpoint; latency is measured and reported, not asserted (shared, noisy machine)."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from dstltree.bench.report import to_json
from dstltree.bench.validate import ValidateSettings, run_validation
from dstltree.client.batching import Batch
from dstltree.topology.latency import get_model


@pytest.mark.timeout(120)
def test_reduced_validation_requests_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    # the simulator runs in this process: count its node cores' flush reasons
    reasons: Counter[str | None] = Counter()
    take = Batch.take

    def counting_take(self: Batch, reason: str | None = None, expected_writers: int = 0) -> list:
        reasons[reason] += 1
        return take(self, reason, expected_writers)

    monkeypatch.setattr(Batch, "take", counting_take)
    vs = ValidateSettings(
        checkpoints=12,
        plan_window=4,
        calibrate=False,
        hop_latency_s=0.004,
        seed=0,
    )
    # the persist delay is far beyond scheduling noise (a writer's request late on a
    # loaded machine must not let a delay flush cut an extra object on the real side)
    assert vs.persist_delay >= 2 * vs.checkpoint_interval
    doc = run_validation(vs)
    # size cuts and the all-persisted rule decide every flush, never the delay
    assert reasons["delay"] == 0 and reasons["size"] > 0 and reasons["all-persisted"] > 0
    real, sim = doc["real"], doc["sim"]
    assert real["fallback_segments"] == 0
    assert real["uploads_total"] == real["objects_total"]  # hedging off, no retries
    assert real["requests_each_checkpoint"] == sim["requests_each_checkpoint"]
    assert real["requests_per_checkpoint"] == sim["requests_per_checkpoint"]
    assert doc["agree"]["requests_per_checkpoint"] is True
    assert doc["agree"]["requests_each_checkpoint"] is True
    assert len(real["requests_each_checkpoint"]) == len(real["persist_ms_each_checkpoint"]) == 12
    assert real["requests_per_window"] == [
        sum(real["requests_each_checkpoint"][i : i + 4]) / 4 for i in range(0, 12, 4)
    ]
    assert real["objects_total"] == sum(real["requests_each_checkpoint"])
    # every checkpoint waits for at least one PUT of the scaled model
    put_floor_ms = get_model("flip158-s3").scaled(vs.scale).floor_s * 1000
    for side in (real, sim):
        p50, p90 = side["persist_ms"]["p50"], side["persist_ms"]["p90"]
        assert put_floor_ms <= p50 <= p90 and math.isfinite(p90)
    cfg = doc["config"]
    assert (cfg["executors"], cfg["writers"], cfg["measured_checkpoints"]) == (7, 28, 12)
    assert cfg["target_between_11_and_12_segments"] is True
    assert cfg["segment_bytes"] > vs.bytes_per_writer  # changes plus encoding
    assert doc["calibration"] == {"hop_latency_s": 0.004, "cpu_per_message_s": 50e-6}
    assert set(doc["agree"]) == {
        "requests_per_checkpoint",
        "requests_each_checkpoint",
        "p50_within_25pct",
        "p90_within_25pct",
    }
    parsed = json.loads(to_json(doc))
    assert {"real", "sim", "agree", "config", "calibration"} <= parsed.keys()
