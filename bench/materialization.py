"""The materialization benchmark (``dstl bench materialization``): large keyed state
without stopping the task, figures from one run.

Cases, each on a fresh job directory, all through the public API (``StreamingJob``,
Parquet ``FileSource``, a keyed function holding a value state per key), one task on a
local Spark session, checkpoints every ``checkpoint_interval`` seconds and
materializations every ``materialization_interval``:

- ``keys``: ``small_keys`` and ``large_keys`` keys per task (every key once, then
  ``updates`` records on random keys): the longest gap between two batches of records
  the task processed, checkpoint durations (p50, p99), the synchronous part of a
  materialization and the materializations' duration, size and bytes written;
- ``throughput``: records per second with checkpoints every ``checkpoint_interval``
  against checkpoints off (one final checkpoint), both on the FLIP-158 S3 latency model
  of the fault-injecting filesystem (``flip158-s3``, unscaled);
- ``incremental``: in one process, the task's backend and materializer over
  ``large_keys`` keys: the first materialization's bytes, then ``changed_fraction`` of
  the keys changed and the second one's; beside it the pause of the whole synchronous
  snapshot the task took before (one msgpack blob written in the task loop);
- ``kill``: two tasks, materializations every 0.5 s, task 0 killed hard after a few
  checkpoints and recovered: the final state and sink rows against a run without the
  kill, and the files no retained checkpoint references once the job ended (orphans).
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dstltree.client import ChangelogClient, ObjectStore
from dstltree.sparkplug import FileSink, FileSource, KeyedProcessFunction, StreamingJob

__all__ = ["MaterializationSettings", "run_materialization"]


class LastValue(KeyedProcessFunction):
    """Per key: the last record's value and payload and how many records it saw (one
    value state, about 50 bytes per key)."""

    def open(self, ctx: Any) -> None:
        self.state = ctx.value_state("last")

    def process(self, key: Any, record: dict[str, Any], out: Any) -> None:
        seen = self.state.get()
        n = 1 if seen is None else seen[2] + 1
        self.state.set([record["value"], record["payload"], n])
        out.emit({"key": key, "value": record["value"], "n": n})


@dataclass(frozen=True)
class MaterializationSettings:
    """Keys per task of the two ``keys`` cases, their records after the load and the
    rate they are read at (records per second), the intervals (seconds), the throughput
    case's records and keys, the fraction of keys changed in the ``incremental`` case,
    the seed of the inputs."""

    small_keys: int = 10_000
    large_keys: int = 1_000_000
    updates: int = 1_200_000
    steady_rate: float = 20_000.0
    checkpoint_interval: float = 0.3
    materialization_interval: float = 3.0
    throughput_records: int = 3_000_000
    throughput_seconds: float = 20.0
    throughput_keys: int = 10_000
    changed_fraction: float = 0.01
    seed: int = 7


def write_input(
    root: Path,
    keys: int,
    updates: int,
    seed: int,
    files: int = 4,
    name: str = "part",
    complete: bool = True,
) -> int:
    """Parquet files ``<name>-*.parquet`` of ``{"key", "value", "payload"}`` (a
    32-character payload): every one of ``keys`` keys once (in a random order; none
    when ``keys`` is 0), then ``updates`` records on random keys; returns the records
    written. ``_SUCCESS`` marks the directory complete (unless not ``complete``: more
    files may land)."""
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(keys), rng.integers(0, max(keys, 1), updates)])
    return _write(root, order, files, name, complete)


def write_updates(root: Path, key_space: int, updates: int, seed: int, files: int = 4) -> int:
    """``updates`` records on random keys of ``key_space`` keys, as
    ``update-*.parquet`` beside what ``root`` holds; returns the records."""
    rng = np.random.default_rng(seed + 1)
    return _write(root, rng.integers(0, key_space, updates), files, "update")


def _write(root: Path, order: np.ndarray, files: int, name: str, complete: bool = True) -> int:
    root.mkdir(parents=True, exist_ok=True)
    for n, chunk in enumerate(np.array_split(order, files)):
        ids = chunk.tolist()
        table = pa.table(
            {
                "key": [f"k{k}" for k in ids],
                "value": chunk.astype(np.int64),
                "payload": [f"{k:032x}" for k in ids],
            }
        )
        # row groups of 50,000 rows: the reader decodes a row group at once, and a
        # large one stalls the task for as long (not what this benchmark measures)
        pq.write_table(table, root / f"{name}-{n:05d}.parquet", row_group_size=50_000)
    if complete:
        (root / "_SUCCESS").touch()
    return len(order)


def _job(spark: Any, work: Path, name: str, sink: bool = False, **opts: Any) -> StreamingJob:
    job = StreamingJob(spark, name=name, checkpoint_dir=str(work / "checkpoints"), **opts)
    stream = job.source(FileSource(str(work / "in"), format="parquet")).key_by("key")
    processed = stream.process(LastValue())
    if sink:
        processed.sink(FileSink(str(work / f"out-{name}"), format="parquet"))
    return job


def _ms(values: list[float], q: float) -> float:
    return round(1000 * float(np.percentile(values, q)), 1) if values else 0.0


def keys_case(spark: Any, work: Path, keys: int, s: MaterializationSettings) -> dict[str, Any]:
    """One task over ``keys`` keys (module docstring, ``keys``): a first run loads
    every key once at full speed; a second run of the same job resumes from its final
    checkpoint (restoring the state) and processes ``updates`` records on random keys
    at ``steady_rate`` records per second: the figures are the second run's (its first
    checkpoint, which waits for the tasks to start, left out of the percentiles)."""
    shutil.rmtree(work, ignore_errors=True)
    write_input(work / "in", keys, 0, s.seed, name="load", complete=False)
    opts: dict[str, Any] = {
        "parallelism": 1,
        "checkpoint_interval": s.checkpoint_interval,
        "materialization_interval": s.materialization_interval,
    }
    loading = _job(spark, work, "keys", progress=lambda d: loaded(d), **opts)

    def loaded(driver: Any) -> None:  # every key in a checkpoint: stop (gracefully)
        if driver.observed.records >= keys:
            loading.stop()

    load = loading.run(until=None) if keys else None
    write_updates(work / "in", keys, s.updates, s.seed)
    t0 = time.monotonic()
    result = _job(spark, work, "keys", source_rate=s.steady_rate, **opts).run(until="end")
    seconds = time.monotonic() - t0
    stats = result.run.stats
    task = result.run.tasks[0] if result.run.tasks else {}
    mats = list(stats.materializations)
    durations = list(stats.checkpoint_durations_s)[1:]
    phases = list(stats.checkpoint_phases_s)[1:]
    return {
        "keys": keys,
        "records": result.records,
        "seconds": round(seconds, 2),
        "max_gap_ms": round(1000 * task.get("max_gap_s", 0.0), 1),
        "load_max_gap_ms": _gap_ms(load),
        "checkpoints": len(durations),
        "checkpoint_p50_ms": _ms(durations, 50),
        "checkpoint_p99_ms": _ms(durations, 99),
        "durations_ms": [round(1000 * d) for d in durations],
        "checkpoint_sync_p99_ms": _ms([p[0] for p in phases], 99),
        "checkpoint_async_p99_ms": _ms([p[1] for p in phases], 99),
        "materializations": len(mats),
        "materialization_sync_max_ms": round(1000 * task.get("materialization_sync_s", 0.0), 2),
        "materialization_mean_s": round(sum(m[0] for m in mats) / len(mats), 3) if mats else 0.0,
        "state_bytes": mats[-1][1] if mats else 0,
        "written_bytes_mean": round(sum(m[2] for m in mats) / len(mats)) if mats else 0,
        "written_bytes_max": max((m[2] for m in mats), default=0),
    }


def _gap_ms(result: Any) -> float:
    tasks = [] if result is None else result.run.tasks
    return round(1000 * max((t.get("max_gap_s", 0.0) for t in tasks), default=0.0), 1)


def throughput_case(spark: Any, work: Path, s: MaterializationSettings) -> dict[str, Any]:
    """Records per second with checkpoints and without (module docstring): each run
    stops after ``throughput_seconds``; the rate is the task's own, records over the
    time from its first batch processed to its last (the job's start-up on the slow
    store, the same in both, left out). Checkpoints off: an interval longer than the
    run, materializations off too (they wait for a checkpoint)."""
    from dstltree.storage.targets import with_faults

    shutil.rmtree(work, ignore_errors=True)
    write_input(work / "in", s.throughput_keys, s.throughput_records, s.seed)
    base, options = with_faults(str(work / "dfs"), {}, "flip158-s3")
    out: dict[str, Any] = {}
    off = 1e6
    cases = (
        ("checkpoints_off", off, off),
        ("checkpoints_on", s.checkpoint_interval, s.materialization_interval),
    )
    for name, interval, materialize in cases:
        job = StreamingJob(
            spark,
            name=name,
            checkpoint_dir=base,
            storage_options=options,
            parallelism=1,
            checkpoint_interval=interval,
            materialization_interval=materialize,
        )
        job.source(FileSource(str(work / "in"), format="parquet")).key_by("key").process(
            LastValue()
        )
        result = job.run(until=s.throughput_seconds)
        task = result.run.tasks[0] if result.run.tasks else {}
        busy = task.get("busy_s", 0.0)
        records = task.get("records", 0)
        out[name] = {
            "records": records,
            "busy_s": round(busy, 2),
            "records_per_second": round(records / busy, 1) if busy else 0.0,
            "checkpoints": result.checkpoints_completed,
        }
    base_rate = out["checkpoints_off"]["records_per_second"]
    rate = out["checkpoints_on"]["records_per_second"]
    out["ratio"] = round(rate / base_rate, 3) if base_rate else 0.0
    return out


def incremental_case(keys: int, fraction: float, seed: int) -> dict[str, Any]:
    """The backend and materializer of one task in this process (module docstring)."""
    from dstltree.sparkplug.materialize import Materializer
    from dstltree.sparkplug.state_backend import KeyedStateBackend

    tmp = Path(tempfile.mkdtemp(prefix="dstl-mat-"))
    try:
        store = ObjectStore(str(tmp / "dfs"))
        client = ChangelogClient.open(str(tmp / "dfs"))
        kgs = range(128)
        backend = KeyedStateBackend(kgs, client.create_writer("bench", kgs))
        state = backend.value_state("last")
        for k in range(keys):
            backend.set_current_key(f"k{k}")
            state.set([k, f"{k:032x}", 1])
        t0 = time.monotonic()  # before: the whole state as one blob, in the task loop
        blob = backend.snapshot()
        store.put(store.new_snapshot_path(), blob)
        whole_pause = time.monotonic() - t0
        mat = Materializer(store, backend)
        first, first_steps = _materialize(mat, 1)
        rng = random.Random(seed)
        for k in rng.sample(range(keys), int(keys * fraction)):
            backend.set_current_key(f"k{k}")
            state.set([k, f"{k:032x}", 2])
        second, second_steps = _materialize(mat, 2)
        mat.close()
        client.close()
        return {
            "keys": keys,
            "changed_fraction": fraction,
            "state_bytes": first.size_bytes,
            "first_written_bytes": first.written_bytes,
            "second_written_bytes": second.written_bytes,
            "second_written_ratio": round(second.written_bytes / first.size_bytes, 4),
            "whole_snapshot_pause_ms": round(1000 * whole_pause, 1),
            "longest_step_ms": round(1000 * max(first_steps, second_steps), 2),
            "files": len(second.parts),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _materialize(mat: Any, epoch: int) -> tuple[Any, float]:
    """Run materialization ``epoch`` to its reference; (reference, longest step s)."""
    mat.begin(epoch)
    longest, ref = 0.0, None
    while ref is None:
        t = time.monotonic()
        ref = mat.step()
        longest = max(longest, time.monotonic() - t)
    mat.applied(ref)
    return ref, longest


def kill_case(spark: Any, work: Path, s: MaterializationSettings) -> dict[str, Any]:
    """A killed task against a run without failures (module docstring)."""
    from dstltree.coordinator.cleanup import list_data_info, scan_orphans
    from dstltree.coordinator.store import CheckpointStore
    from dstltree.sparkplug import CrashDrill
    from dstltree.sparkplug.restore import restore_all

    shutil.rmtree(work, ignore_errors=True)
    write_input(work / "in", 20_000, 200_000, s.seed)
    finals: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for name, drill in (("calm", None), ("killed", CrashDrill(task=0, after_checkpoints=6))):
        job = _job(
            spark,
            work,
            name,
            sink=True,
            parallelism=2,
            checkpoint_interval=s.checkpoint_interval,
            materialization_interval=0.5,
            source_rate=60_000,
            **({"crash_drill": drill} if drill else {}),
        )
        result = job.run(until="end")
        store = ObjectStore(job.options.base_path)
        latest = CheckpointStore(store).load_latest()
        finals[name] = restore_all(store, latest, 128)
        rows = pq.read_table(work / f"out-{name}").num_rows
        referenced: set[str] = set()
        for cp in CheckpointStore(store).list_retained():
            referenced |= cp.referenced_paths()
        sizes = {i.url: i.size for i in list_data_info(store)}
        orphans = [u for u in scan_orphans(store, frozenset(referenced)).orphans if sizes.get(u)]
        out[name] = {
            "recoveries": result.recoveries,
            "materializations": result.run.stats.materializations_completed,
            "sink_rows": rows,
            "orphans": len(orphans),
        }
    out["same_state"] = finals["calm"] == finals["killed"]
    out["same_sink_rows"] = out["calm"]["sink_rows"] == out["killed"]["sink_rows"]
    return out


def run_materialization(
    spark: Any, work: Path, s: MaterializationSettings, progress: Any = None
) -> dict[str, Any]:
    """Every case (module docstring) under ``work``; ``progress(name)`` before each."""

    def say(name: str) -> None:
        if progress is not None:
            progress(name)

    doc: dict[str, Any] = {"settings": s.__dict__}
    say(f"keys {s.small_keys}")
    small = keys_case(spark, work / "small", s.small_keys, s)
    say(f"keys {s.large_keys}")
    large = keys_case(spark, work / "large", s.large_keys, s)
    p99_small = small["checkpoint_p99_ms"]
    doc["keys"] = {
        "small": small,
        "large": large,
        "p99_ratio": round(large["checkpoint_p99_ms"] / p99_small, 3) if p99_small else 0.0,
    }
    say("incremental")
    doc["incremental"] = incremental_case(s.large_keys, s.changed_fraction, s.seed)
    say("throughput (flip158-s3)")
    doc["throughput"] = throughput_case(spark, work / "throughput", s)
    say("kill")
    doc["kill"] = kill_case(spark, work / "kill", s)
    return doc


HEADERS = ("figure", "10,000 keys", "1,000,000 keys", "target")


def _keys_rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    """The rows of the ``keys`` cases' table: figure, small, large, target."""
    small, large = doc["keys"]["small"], doc["keys"]["large"]

    def both(key: str, unit: str = "") -> tuple[str, str]:
        return f"{small[key]:,}{unit}", f"{large[key]:,}{unit}"

    return [
        ("longest gap between two batches processed", *both("max_gap_ms", " ms"), "<= 100 ms"),
        ("checkpoint p50", *both("checkpoint_p50_ms", " ms"), ""),
        (
            "checkpoint p99",
            *both("checkpoint_p99_ms", " ms"),
            f"ratio {doc['keys']['p99_ratio']}x <= 1.3x",
        ),
        ("checkpoint, synchronous phase p99", *both("checkpoint_sync_p99_ms", " ms"), ""),
        ("checkpoint, asynchronous phase p99", *both("checkpoint_async_p99_ms", " ms"), ""),
        (
            "synchronous part of a materialization (max)",
            *both("materialization_sync_max_ms", " ms"),
            "",
        ),
        ("materialization (mean, trigger to applied)", *both("materialization_mean_s", " s"), ""),
        ("materialized size (files referenced)", *both("state_bytes", " B"), ""),
        (
            "bytes written per materialization (mean / max)",
            f"{small['written_bytes_mean']:,} / {small['written_bytes_max']:,}",
            f"{large['written_bytes_mean']:,} / {large['written_bytes_max']:,}",
            "",
        ),
        (
            "materializations / checkpoints",
            f"{small['materializations']} / {small['checkpoints']}",
            f"{large['materializations']} / {large['checkpoints']}",
            "",
        ),
    ]


def markdown_section(doc: dict[str, Any], meta: dict[str, str]) -> str:
    """The "Materialization" section of BENCHMARKS.md for ``doc`` (run_materialization's
    figures) and ``meta`` (run_meta: command, commit, date)."""
    from dstltree.bench.hotpath import markdown_table

    inc, tp, kill = doc["incremental"], doc["throughput"], doc["kill"]

    rows = _keys_rows(doc)
    lines = [
        "## Materialization",
        "",
        f"Command: `{meta['command']}`, commit {meta['commit']}, {meta['date']}.",
        "",
        "One task; a first run loads every key once, the run measured resumes from it and "
        f"reads {doc['settings']['updates']:,} updates at {doc['settings']['steady_rate']:,.0f} "
        "records/s; checkpoints every "
        f"{doc['settings']['checkpoint_interval']} s, materializations every "
        f"{doc['settings']['materialization_interval']} s:",
        "",
        *markdown_table(HEADERS, rows),
        "",
        "The longest gap holds every stall of the task's process, whatever the state: "
        "a Parquet row group decoded, the driver, the JVM and the task sharing the "
        "machine's cores; compare it with the 10,000-key column. The state's own share is "
        "the synchronous part of a materialization, the longest packing step (below) and "
        "one copy-on-write burst after a materialization starts (a C-level dict copy per "
        "key group the next records touch).",
        "",
        f"Incremental ({inc['keys']:,} keys, {inc['state_bytes']:,} bytes of state, "
        f"{100 * inc['changed_fraction']:g} % of the keys changed): the second "
        f"materialization wrote {inc['second_written_bytes']:,} bytes, "
        f"{100 * inc['second_written_ratio']:.2f} % of the state (target <= 5 %); "
        f"the longest step of the task loop packing it {inc['longest_step_ms']} ms, "
        f"against {inc['whole_snapshot_pause_ms']:,} ms for the whole snapshot the task "
        "took before (one blob, written in the task loop).",
        "",
        f"Throughput on the FLIP-158 S3 model (`flip158-s3`, unscaled): "
        f"{tp['checkpoints_on']['records_per_second']:,} records/s with checkpoints every "
        f"{doc['settings']['checkpoint_interval']} s against "
        f"{tp['checkpoints_off']['records_per_second']:,} with checkpoints off: "
        f"{tp['ratio']}x (target >= 0.8x).",
        "",
        f"Kill: task 0 killed hard and recovered ({kill['killed']['recoveries']} recovery, "
        f"{kill['killed']['materializations']} materializations): same state as the run "
        f"without the kill: {kill['same_state']}; same sink rows: {kill['same_sink_rows']}; "
        f"orphans after the run: {kill['calm']['orphans']} (calm), "
        f"{kill['killed']['orphans']} (killed).",
        "",
    ]
    return "\n".join(lines)
