"""``dstl demo``: the flights job run to the end on Spark, then checked against a Spark
SQL batch query over the same rows, key by key, both for the state the tasks ended with
and for the state restored from the latest completed checkpoint."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dstltree.demo.flights import FlightsJob, batch_aggregates, compare, load_table
from dstltree.sparkplug.job import JobOptions, JobRun, Progress, restore_all, run_keyed_job
from dstltree.sparkplug.spark_session import spark_session
from dstltree.stats import percentile
from dstltree.storage.store import ObjectStore


@dataclass(frozen=True)
class DemoOptions(JobOptions):
    """Flags of ``dstl demo``: the job's options plus the input (the table replayed
    ``replay`` times; ``limit_records`` keeps only the first N flights)."""

    replay: int = 1
    limit_records: int | None = None


def run_demo(opts: DemoOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Run the main job end to end; returns the report (README, "What make demo does").
    Blocking."""
    started = time.monotonic()
    spark = spark_session(opts.master)
    job = FlightsJob(replay=opts.replay, limit_records=opts.limit_records)
    store = ObjectStore(opts.base_path, opts.storage_options)
    try:
        run = run_keyed_job(spark, job, opts, progress)
        streamed: dict[Any, Any] = {}
        for r in run.results:
            streamed.update(r["state"])
        restored = restore_all(store, run.latest, job, opts.tasks, opts.max_parallelism)
        batch = batch_aggregates(spark, load_table(opts.limit_records), opts.replay)
    finally:
        spark.stop()
    mismatched = sorted(set(compare(streamed, batch)) | set(compare(restored, batch)))
    return {
        **_report(opts, run, store, sum(job.lengths(opts.tasks, opts.max_parallelism))),
        "state_matches_batch": not mismatched,
        "mismatched_keys": mismatched[:50],
        "keys": len(batch),
        "base_path": store.base_url,
        "metrics": run.metrics,
        "wall_s": round(time.monotonic() - started, 1),
    }


def _report(opts: DemoOptions, run: JobRun, store: ObjectStore, records: int) -> dict[str, Any]:
    """The run's figures (the report's fields up to ``orphans_deleted_at_start``)."""
    stats, observed = run.stats, run.observed
    durations_ms = [d * 1000 for d in stats.checkpoint_durations_s]
    present = set(store.list_objects())
    return {
        "records": records,
        "tasks": opts.tasks,
        "master": opts.master,
        "checkpoints_completed": stats.checkpoints_completed,
        "checkpoints_aborted": stats.checkpoints_aborted,
        "checkpoint_duration_ms": {
            "p50": _ms(durations_ms, 50),
            "p99": _ms(durations_ms, 99),
        },
        "materializations": stats.materializations_completed,
        "recoveries": run.recoveries,
        "objects_written": len(observed.objects | present),
        "objects_referenced": len(observed.objects),
        "changelog_bytes": observed.segment_bytes,
        "writers": len(observed.writers),
        "nodes": run.nodes,
        "objects_per_checkpoint": round(
            len(observed.objects) / max(1, len(observed.checkpoint_ids)), 3
        ),
        "objects_deleted": stats.objects_deleted,
        "orphans_deleted_at_start": stats.orphans_deleted,
    }


def _ms(values: list[float], q: float) -> float | None:
    """A percentile in ms rounded to 0.1, None for no values (JSON null)."""
    return round(percentile(values, q), 1) if values else None
