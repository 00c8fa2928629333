"""The run figures of the demo's report, from the job's results: one
``JobResult`` per run (two with a rescale: the run stopped, then the run that resumed
with another parallelism), summed or merged across runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dstltree.stats import percentile


def run_figures(
    results: Sequence[Any], tasks: int, master: str, present_objects: set[str]
) -> dict[str, Any]:
    """The report's figures up to ``rescaled_from`` for ``results`` (``JobResult`` s in
    run order, at least one; each ``.run`` a ``JobRun``). ``present_objects``: the
    changelog objects under the checkpoint directory now. Durations in ms (a
    checkpoint's synchronous and asynchronous phases, its alignment and start delay:
    the longest at any task; in-flight bytes: all tasks', per checkpoint; the
    interval achieved, trigger to trigger, within each run); the completion path and
    metadata per checkpoint and the checkpoints in flight (:func:`completion_figures`);
    materializations: their duration, the last one's size and the bytes written and
    reused (referenced again from earlier ones) over all, bytes; counts
    summed over runs; objects, segments and writers merged (a rescaled run refers to
    objects of the run before); ``tasks`` is the last run's parallelism,
    ``rescaled_from`` the parallelism it restored from where that differed (None
    otherwise). Raises ValueError for no results."""
    if not results:
        raise ValueError("no job results")
    stats = [r.run.stats for r in results]
    observed = [r.run.observed for r in results]
    durations_ms = [d * 1000 for s in stats for d in s.checkpoint_durations_s]
    intervals_ms = [d * 1000 for s in stats for d in s.checkpoint_intervals_s]
    sync_ms = [p[0] * 1000 for s in stats for p in s.checkpoint_phases_s]
    async_ms = [p[1] * 1000 for s in stats for p in s.checkpoint_phases_s]
    epochs = [m for s in stats for m in s.materializations]
    objects: set[str] = set().union(*(o.objects for o in observed))
    segments: set[tuple[str, int, int]] = set().union(*(o.segments for o in observed))
    writers: set[str] = set().union(*(o.writers for o in observed))
    checkpoints = sum(len(o.checkpoint_ids) for o in observed)
    last = results[-1]
    return {
        "records": sum(r.records for r in results),
        "tasks": tasks,
        "master": master,
        "checkpoints_completed": sum(r.checkpoints_completed for r in results),
        "checkpoints_aborted": sum(r.checkpoints_aborted for r in results),
        "checkpoint_duration_ms": {"p50": _ms(durations_ms, 50), "p99": _ms(durations_ms, 99)},
        "checkpoint_interval_ms": {"p50": _ms(intervals_ms, 50), "p99": _ms(intervals_ms, 99)},
        "checkpoint_sync_ms": {"p50": _ms(sync_ms, 50), "p99": _ms(sync_ms, 99)},
        # every checkpoint's figures, in completion (and trigger) order, for plots
        "per_checkpoint_ms": {
            "duration": [round(d, 1) for d in durations_ms],
            "interval": [round(i, 1) for i in intervals_ms],
        },
        "checkpoint_async_ms": {"p50": _ms(async_ms, 50), "p99": _ms(async_ms, 99)},
        **alignment_figures(stats),
        **completion_figures(stats),
        "materializations": sum(s.materializations_completed for s in stats),
        "materialization_ms": {"p50": _ms([m[0] * 1000 for m in epochs], 50)},
        "materialized_bytes_last": epochs[-1][1] if epochs else 0,
        "materialization_written_bytes": sum(m[2] for m in epochs),
        "materialization_reused_bytes": sum(m[1] - m[2] for m in epochs),
        "recoveries": sum(r.recoveries for r in results),
        "objects_written": len(objects | present_objects),
        "objects_referenced": len(objects),
        "changelog_bytes": sum(length for _, _, length in segments),
        "writers": len(writers),
        "nodes": max(r.run.nodes for r in results),
        "tasks_without_node": max(s.tasks_without_node for s in stats),
        "objects_per_checkpoint": round(len(objects) / max(1, checkpoints), 3),
        "objects_deleted": sum(s.objects_deleted for s in stats),
        "deletes_refused": sum(s.deletes_refused for s in stats),
        "shared_objects_kept": sum(s.shared_objects_kept for s in stats),
        "orphans_deleted_at_start": stats[0].orphans_deleted,
        "source_files": last.source_files,
        "rescaled_from": last.rescaled_from,
    }


def alignment_figures(stats: Sequence[Any]) -> dict[str, Any]:
    """FLIP-76 figures of the runs' checkpoints (``CoordinatorStatistics`` s): the
    longest alignment and start delay at any task (ms, p50 and p99), the in-flight bytes
    persisted with each (all tasks; mean and p99) and how many were taken unaligned."""
    aligns = [a for s in stats for a in s.checkpoint_alignments]
    align_ms = [a[0] * 1000 for a in aligns]
    delay_ms = [a[1] * 1000 for a in aligns]
    inflight = [float(a[2]) for a in aligns]
    return {
        "checkpoint_alignment_ms": {"p50": _ms(align_ms, 50), "p99": _ms(align_ms, 99)},
        "checkpoint_start_delay_ms": {"p50": _ms(delay_ms, 50), "p99": _ms(delay_ms, 99)},
        "inflight_bytes": {
            "mean": round(sum(inflight) / len(inflight)) if inflight else 0,
            "p99": round(percentile(inflight, 99)) if inflight else 0,
        },
        "checkpoints_unaligned": sum(1 for a in aligns if a[3]),
    }


def completion_figures(stats: Sequence[Any]) -> dict[str, Any]:
    """Of overlapping checkpoints with one commit point, over the runs' statistics
    (``CoordinatorStatistics`` in run order): storage requests on a checkpoint's
    completion path (mean rounded to 0.01, max), its metadata bytes as written (the
    first and last checkpoint's, the largest), the bound on checkpoints in flight and
    the most seen at once (the largest of any run). None for no checkpoint."""
    requests = [n for s in stats for n in s.completion_requests]
    metadata = [n for s in stats for n in s.metadata_bytes]
    return {
        "completion_requests_per_checkpoint": {
            "mean": round(sum(requests) / len(requests), 2) if requests else None,
            "max": max(requests, default=None),
        },
        "checkpoint_metadata_bytes": {
            "first": metadata[0] if metadata else None,
            "last": metadata[-1] if metadata else None,
            "max": max(metadata, default=None),
        },
        "max_concurrent_checkpoints": max(s.max_concurrent_checkpoints for s in stats),
        "checkpoints_in_flight_max": max(s.checkpoints_in_flight_max for s in stats),
    }


def _ms(values: list[float], q: float) -> float | None:
    """A percentile in ms rounded to 0.1, None for no values (JSON null)."""
    return round(percentile(values, q), 1) if values else None
