"""Figures of overlapping checkpoints with one commit point (issue 34): the coordinator's
metrics of the interval achieved, checkpoints in flight, completion-path requests and
metadata bytes, read back from its registry as Prometheus text."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dstltree.coordinator.metrics import (
    COMPLETION_REQUEST_BUCKETS,
    METADATA_BUCKETS,
    CoordinatorMetrics,
)


@pytest.fixture
def metrics() -> Iterator[CoordinatorMetrics]:
    m = CoordinatorMetrics(None)  # recorded, not served
    yield m
    m.close()


def samples(m: CoordinatorMetrics) -> dict[str, float]:
    """Sample name (``{le=...}`` for a bucket) -> value, from the registry's text."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for s in fam.samples:
            le = s.labels.get("le")
            out[s.name + ("" if le is None else f"{{le={float(le)}}}")] = s.value
    return out


def test_nothing_observed_before_the_first_trigger(metrics: CoordinatorMetrics) -> None:
    got = samples(metrics)
    for h in (
        "dstl_checkpoint_interval_seconds",
        "dstl_checkpoint_completion_requests",
        "dstl_checkpoint_metadata_bytes",
    ):
        assert got[f"{h}_count"] == 0 and got[f"{h}_sum"] == 0, h
    assert got["dstl_checkpoints_in_flight"] == 0


def test_triggers_observe_the_interval_after_the_first_and_set_in_flight(
    metrics: CoordinatorMetrics,
) -> None:
    metrics.checkpoint_triggered(None, 1)  # the first trigger: no interval yet
    got = samples(metrics)
    assert got["dstl_checkpoint_interval_seconds_count"] == 0
    assert got["dstl_checkpoints_in_flight"] == 1
    metrics.checkpoint_triggered(0.31, 2)
    metrics.checkpoint_triggered(0.29, 3)
    metrics.checkpoint_triggered(-0.001, 2)  # a clock step back: counted as 0
    got = samples(metrics)
    assert got["dstl_checkpoint_interval_seconds_count"] == 3
    assert got["dstl_checkpoint_interval_seconds_sum"] == pytest.approx(0.6)
    assert got["dstl_checkpoints_in_flight"] == 2  # the latest trigger's
    # buckets fine enough around 0.3 s to tell 0.29 from 0.31
    assert got["dstl_checkpoint_interval_seconds_bucket{le=0.01}"] == 1
    assert got["dstl_checkpoint_interval_seconds_bucket{le=0.3}"] == 2
    assert got["dstl_checkpoint_interval_seconds_bucket{le=0.35}"] == 3


def test_commits_observe_requests_and_metadata_bytes(metrics: CoordinatorMetrics) -> None:
    for requests, size in ((1, 300), (1, 1500), (3, 5000), (40, 5 * 1024 * 1024)):
        metrics.checkpoint_committed(requests, size)
    got = samples(metrics)
    assert got["dstl_checkpoint_completion_requests_count"] == 4
    assert got["dstl_checkpoint_completion_requests_sum"] == 45
    assert [
        got[f"dstl_checkpoint_completion_requests_bucket{{le={b}}}"]
        for b in COMPLETION_REQUEST_BUCKETS
    ] == [2, 2, 3, 3, 3, 3, 3, 3]
    assert got["dstl_checkpoint_completion_requests_bucket{le=inf}"] == 4  # 40 > 32
    assert got["dstl_checkpoint_metadata_bytes_count"] == 4
    assert got["dstl_checkpoint_metadata_bytes_sum"] == 300 + 1500 + 5000 + 5 * 1024 * 1024
    assert METADATA_BUCKETS[0] == 256 and METADATA_BUCKETS[-1] == 4 * 1024 * 1024
    assert [got[f"dstl_checkpoint_metadata_bytes_bucket{{le={b}}}"] for b in METADATA_BUCKETS] == [
        0,  # 256
        1,  # 1 KiB
        2,  # 4 KiB
        3,  # 16 KiB
        3,
        3,
        3,
        3,  # 4 MiB: the 5 MiB metadata is above
    ]
    assert got["dstl_checkpoint_metadata_bytes_bucket{le=inf}"] == 4
