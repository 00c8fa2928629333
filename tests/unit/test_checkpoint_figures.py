"""Figures of overlapping checkpoints with one commit point: the coordinator's
metrics of the interval achieved, checkpoints in flight, completion-path requests and
metadata bytes, read back from its registry as Prometheus text; its metrics of
unaligned checkpoints (FLIP-76: alignment, start delay, in-flight bytes) and the lines
``dstl status`` prints from them; the demo report's figures from the runs' statistics
and the summary that prints them."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from dstltree.cli.commands import status as status_command
from dstltree.cli.commands._status_job import job_rows, job_table
from dstltree.cli.commands.demo import _summary
from dstltree.client.handle import SegmentRef
from dstltree.coordinator import CoordinatorStatistics
from dstltree.coordinator.checkpoint import CompletedCheckpoint, checkpoint_alignment
from dstltree.coordinator.metrics import (
    COMPLETION_REQUEST_BUCKETS,
    INFLIGHT_BUCKETS,
    METADATA_BUCKETS,
    CoordinatorMetrics,
)
from dstltree.coordinator.testing import handle, task_checkpoint
from dstltree.demo.report import run_figures


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


# -- unaligned checkpoints (FLIP-76) -----------------------------------------------


def _unaligned_checkpoint(
    cid: int, figures: dict[int, tuple[float, float, int, bool]]
) -> CompletedCheckpoint:
    """Checkpoint ``cid`` whose task ``t`` reports ``figures[t]`` = (alignment s, start
    delay s, in-flight bytes, unaligned), its in-flight records in one segment of that
    many bytes in object ``cs-<cid>`` (none when 0), its state changes in
    ``st-<cid>-<t>``."""
    tasks = {}
    for t, (align, delay, size, unaligned) in figures.items():
        tc = task_checkpoint(t, 0, [f"o/st-{cid}-{t}"])
        cs = handle(f"log-{t}-cs", [f"o/cs-{cid}"])
        cs = replace(cs, segments=tuple(_sized(sg, size, t) for sg in cs.segments))
        tasks[t] = replace(
            tc,
            channel_state=(cs,) if size else (),
            unaligned=unaligned,
            alignment_s=align,
            start_delay_s=delay,
            inflight_bytes=size,
        )
    return CompletedCheckpoint(cid, 0, 0, 0.0, 0.1, tasks)


def _sized(seg: SegmentRef, length: int, task: int) -> SegmentRef:
    return replace(seg, offset=100 * task, meta=replace(seg.meta, length=length))


def test_checkpoint_alignment_takes_the_longest_waits_and_the_bytes_of_all_tasks() -> None:
    cp = _unaligned_checkpoint(1, {0: (0.2, 0.01, 3000, True), 1: (0.05, 0.3, 1000, False)})
    assert checkpoint_alignment(cp) == (0.2, 0.3, 4000, True)
    aligned = _unaligned_checkpoint(2, {0: (0.01, 0.02, 0, False), 1: (0.03, 0.0, 0, False)})
    assert checkpoint_alignment(aligned) == (0.03, 0.02, 0, False)
    assert checkpoint_alignment(CompletedCheckpoint(3, 0, 0, 0.0, 0.0)) == (0.0, 0.0, 0, False)


def _observe_unaligned(m: CoordinatorMetrics) -> None:
    """Four checkpoints, two of them unaligned at some task (one after an aligned
    timeout of 0.2 s), with 5000 and 64 KiB in flight; the others aligned."""
    for cid, figures in (
        (1, {0: (0.004, 0.002, 0, False), 1: (0.003, 0.001, 0, False)}),
        (2, {0: (0.0, 0.003, 4000, True), 1: (0.002, 0.004, 1000, True)}),
        (3, {0: (0.2, 0.002, 65536, True), 1: (0.006, 0.002, 0, False)}),
        (4, {0: (0.007, 0.02, 0, False), 1: (0.004, 0.001, 0, False)}),
    ):
        m.checkpoint_completed(_unaligned_checkpoint(cid, figures), 0.1)


def test_completed_checkpoints_observe_alignment_start_delay_and_in_flight_bytes(
    metrics: CoordinatorMetrics,
) -> None:
    _observe_unaligned(metrics)
    got = samples(metrics)
    assert got["dstl_checkpoints_unaligned_total"] == 2
    assert got["dstl_checkpoint_alignment_seconds_count"] == 4
    assert got["dstl_checkpoint_alignment_seconds_sum"] == pytest.approx(
        0.004 + 0.002 + 0.2 + 0.007
    )
    assert got["dstl_checkpoint_alignment_seconds_bucket{le=0.01}"] == 3
    assert got["dstl_checkpoint_alignment_seconds_bucket{le=0.25}"] == 4
    assert got["dstl_checkpoint_start_delay_seconds_count"] == 4
    assert got["dstl_checkpoint_start_delay_seconds_sum"] == pytest.approx(
        0.002 + 0.004 + 0.002 + 0.02
    )
    assert got["dstl_checkpoint_inflight_bytes_count"] == 4
    assert got["dstl_checkpoint_inflight_bytes_sum"] == 5000 + 65536
    assert INFLIGHT_BUCKETS[:3] == (0.0, 1024.0, 4096.0)
    # the two aligned checkpoints in the bucket of 0 bytes, 5000 B in (4 KiB, 16 KiB]
    assert got["dstl_checkpoint_inflight_bytes_bucket{le=0.0}"] == 2
    assert got["dstl_checkpoint_inflight_bytes_bucket{le=4096.0}"] == 2
    assert got["dstl_checkpoint_inflight_bytes_bucket{le=16384.0}"] == 3
    assert got["dstl_checkpoint_inflight_bytes_bucket{le=65536.0}"] == 4
    # in-flight segments are new bytes of their checkpoint, as changelog segments:
    # 10 B of state changes per task, and the in-flight bytes
    assert got["dstl_checkpoint_size_bytes_sum"] == 4 * 2 * 10 + 5000 + 65536


def _scraped(m: CoordinatorMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    """What ``dstl status`` reads from the coordinator's endpoint (status.scrape)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for smp in fam.samples:
            out.setdefault(smp.name, []).append((dict(smp.labels), float(smp.value)))
    return out


def test_the_status_panel_gives_alignment_start_delay_in_flight_and_unaligned(
    metrics: CoordinatorMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    _observe_unaligned(metrics)
    rows = dict(job_rows(_scraped(metrics)))
    # p99 interpolated in the buckets: alignment in (0.1, 0.25], start delay in
    # (0.01, 0.025], in-flight bytes in (16 KiB, 64 KiB]
    assert rows["  alignment / start delay p99"] == "244.0 / 24.4 ms"
    assert rows["unaligned checkpoints"] == "2"
    assert rows["in-flight data / checkpoint"] == "17.2 KiB mean / 62.1 KiB p99"
    assert rows["  sync / async phase p99"] == "9.9 / 9.9 ms"  # the figures before stay
    # the panel still reads at 80 columns
    monkeypatch.setattr(status_command, "scrape", lambda url, timeout: _scraped(metrics))
    text = summary_text_of(job_table("http://127.0.0.1:9464/metrics", 1.0, " at 12:00:00"))
    assert max(len(r) for r in text.splitlines()) <= 80, text
    lines = summary_lines(text)
    assert "alignment / start delay p99 244.0 / 24.4 ms" in lines
    assert "unaligned checkpoints 2" in lines


def test_the_status_panel_without_unaligned_figures_shows_dashes(
    metrics: CoordinatorMetrics,
) -> None:
    rows = dict(job_rows(_scraped(metrics)))  # nothing completed yet
    assert rows["  alignment / start delay p99"] == "-"
    assert rows["in-flight data / checkpoint"] == "-"
    assert rows["unaligned checkpoints"] == "0"
    old = {k: v for k, v in _scraped(metrics).items() if "unaligned" not in k}
    assert dict(job_rows(old))["unaligned checkpoints"] == "-"  # an older coordinator


def summary_text_of(table: Any) -> str:
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


# -- the demo's report and summary -------------------------------------------------


def stats(**issue34: Any) -> CoordinatorStatistics:
    """Statistics of one run: two checkpoints of 20 and 40 ms, and ``issue34``'s
    fields (their defaults, as before the coordinator filled them in, otherwise)."""
    return CoordinatorStatistics(
        checkpoints_completed=2,
        checkpoints_aborted=0,
        checkpoint_durations_s=(0.02, 0.04),
        materializations_completed=0,
        materializations_abandoned=0,
        objects_deleted=0,
        orphans_deleted=0,
        stale_metadata_deleted=0,
        messages_fenced=0,
        messages_rejected=0,
        last_checkpoint_id=2,
        last_materialization_epoch=0,
        retained_checkpoint_ids=(2,),
        attempt=0,
        checkpoint_phases_s=((0.001, 0.01), (0.002, 0.03)),
        **issue34,
    )


def job_result(s: CoordinatorStatistics, cps: list[int]) -> Any:
    observed = SimpleNamespace(
        objects={f"o{c}" for c in cps},
        segments={(f"o{c}", 0, 10) for c in cps},
        writers={"w"},
        checkpoint_ids=set(cps),
    )
    return SimpleNamespace(
        records=10,
        checkpoints_completed=len(cps),
        checkpoints_aborted=0,
        recoveries=0,
        source_files=1,
        rescaled_from=None,
        run=SimpleNamespace(stats=s, observed=observed, nodes=3),
    )


def test_the_report_gives_interval_completion_path_and_metadata_over_runs() -> None:
    first = stats(
        checkpoint_intervals_s=(0.3, 0.31),
        completion_requests=(1, 1),
        metadata_bytes=(1200, 1300),
        max_concurrent_checkpoints=3,
        checkpoints_in_flight_max=2,
    )
    second = stats(  # rescaled: the interval restarts with the run
        checkpoint_intervals_s=(0.29, 0.6),
        completion_requests=(1, 4),
        metadata_bytes=(900, 1000),
        max_concurrent_checkpoints=3,
        checkpoints_in_flight_max=3,
    )
    f = run_figures([job_result(first, [1, 2]), job_result(second, [3, 4])], 2, "local[2]", set())
    # linear between ranks: 290, 300, 310, 600 ms
    assert f["checkpoint_interval_ms"] == {"p50": 305.0, "p99": 591.3}
    assert f["completion_requests_per_checkpoint"] == {"mean": 1.75, "max": 4}
    assert f["checkpoint_metadata_bytes"] == {"first": 1200, "last": 1000, "max": 1300}
    assert f["max_concurrent_checkpoints"] == 3 and f["checkpoints_in_flight_max"] == 3
    # the existing figures stay
    assert f["checkpoint_duration_ms"]["p99"] == pytest.approx(40.0, abs=0.5)
    assert f["checkpoints_completed"] == 4 and f["objects_per_checkpoint"] == 1.0
    assert json.loads(json.dumps(f)) == f  # the report is JSON


def test_the_report_before_the_coordinator_fills_the_figures_in() -> None:
    f = run_figures([job_result(stats(), [1, 2])], 2, "local[2]", set())
    assert f["checkpoint_interval_ms"] == {"p50": None, "p99": None}
    assert f["completion_requests_per_checkpoint"] == {"mean": None, "max": None}
    assert f["checkpoint_metadata_bytes"] == {"first": None, "last": None, "max": None}
    assert f["max_concurrent_checkpoints"] == 1 and f["checkpoints_in_flight_max"] == 0


def report(figures: dict[str, Any]) -> dict[str, Any]:
    """A whole report around ``figures``: the verdicts and the run's own fields."""
    return {
        **figures,
        "state_matches_batch": True,
        "sink_matches_batch": True,
        "sink_rows": 10,
        "sink_duplicate_rows": 0,
        "mismatched_keys": [],
        "wall_s": 12.5,
    }


def summary_text(r: dict[str, Any]) -> str:
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(_summary(r))
    return console.export_text()


def summary_lines(text: str) -> list[str]:
    return [" ".join(row.replace("│", " ").split()) for row in text.splitlines()]


def test_the_summary_prints_the_interval_next_to_the_duration() -> None:
    s = stats(
        checkpoint_intervals_s=(0.3, 0.3, 0.3),
        completion_requests=(1, 1),
        metadata_bytes=(1500, 2500),
        max_concurrent_checkpoints=2,
        checkpoints_in_flight_max=2,
    )
    text = summary_text(report(run_figures([job_result(s, [1, 2])], 2, "local[2]", set())))
    lines = summary_lines(text)
    duration = lines.index("checkpoint p50 / p99 (ms) 30.0 / 39.8")
    assert lines[duration + 1] == "checkpoint interval p50 / p99 (ms) 300.0 / 300.0"
    assert "completion-path requests mean / max 1.0 / 1" in lines
    assert "checkpoint metadata bytes first / last / max 1,500 / 2,500 / 2,500" in lines
    assert "checkpoints in flight max / allowed 2 / 2" in lines


def test_the_summary_of_a_report_without_the_figures_shows_dashes() -> None:
    figures = run_figures([job_result(stats(), [1, 2])], 2, "local[2]", set())
    lines = summary_lines(summary_text(report(figures)))
    assert "checkpoint interval p50 / p99 (ms) - / -" in lines
    assert "completion-path requests mean / max - / -" in lines
    assert "checkpoint metadata bytes first / last / max - / - / -" in lines
    assert "checkpoints in flight max / allowed 0 / 1" in lines
    older = {k: v for k, v in figures.items() if k != "checkpoint_interval_ms"}
    assert "checkpoint interval p50 / p99 (ms) -" in summary_lines(summary_text(report(older)))
