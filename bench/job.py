"""``dstl bench-job``: records per second through a user's job on the public API, with
the changelog (every state change persisted through the node tree at each checkpoint)
and with changelog persistence reduced to the minimum (``persist_changelog=False``:
no state change is logged, checkpoints hold only split offsets and sink output), side
by side in one run on the same input and Spark session.

The job: generated Parquet files of ``{"key": str, "value": int}``, keyed by ``key``,
per key a count and a sum (value state), one row emitted per record to a FileSink.
Rate = records / seconds of ``job.run(until="end")`` (stage start and the final
checkpoint included, the same in both runs).
"""

from __future__ import annotations

import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dstltree.sparkplug import FileSink, FileSource, KeyedProcessFunction, StreamingJob


class CountAndSum(KeyedProcessFunction):
    """Per key: ``[count, sum]``; emits ``{"key", "count", "sum"}`` per record."""

    def open(self, ctx: Any) -> None:
        self.state = ctx.value_state("agg")

    def process(self, key: Any, record: dict[str, Any], out: Any) -> None:
        agg = self.state.get() or [0, 0]
        agg = [agg[0] + 1, agg[1] + record["value"]]
        self.state.set(agg)
        out.emit({"key": key, "count": agg[0], "sum": agg[1]})


@dataclass(frozen=True)
class JobBenchResult:
    """One configuration's run: records, wall seconds of ``run``, records per wall
    second, the steady rate (records per second between the first checkpoint holding
    records and the last checkpoint: start-up and the end excluded), checkpoints."""

    name: str
    records: int
    seconds: float
    records_per_second: float
    steady_records_per_second: float
    checkpoints: int


def write_input(root: Path, files: int, per_file: int, keys: int, seed: int = 7) -> int:
    """``files`` Parquet files of ``per_file`` records over ``keys`` keys, then
    ``_SUCCESS``; returns the record count."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for n in range(files):
        table = pa.table(
            {
                "key": [f"k{rng.randrange(keys)}" for _ in range(per_file)],
                "value": [rng.randrange(100) for _ in range(per_file)],
            }
        )
        pq.write_table(table, root / f"part-{n:05d}.parquet")
    (root / "_SUCCESS").touch()
    return files * per_file


def run_one(
    spark: Any, work: Path, name: str, topology: Path | None, parallelism: int, persist: bool
) -> JobBenchResult:
    """Run the job once over ``work/in`` into a fresh sink and checkpoint directory
    (nodes of ``topology`` started for the run in both cases: the same start-up)."""
    for d in (work / f"out-{name}", work / "checkpoints" / name):
        shutil.rmtree(d, ignore_errors=True)
    job = StreamingJob(
        spark,
        name=name,
        checkpoint_dir=str(work / "checkpoints"),
        topology=topology,
        parallelism=parallelism,
        checkpoint_interval=0.3,
        materialization_interval=3.0,
        persist_changelog=persist,
    )
    (
        job.source(FileSource(str(work / "in"), format="parquet"))
        .key_by("key")
        .process(CountAndSum())
        .sink(FileSink(str(work / f"out-{name}"), format="parquet"))
    )
    started = time.monotonic()
    result = job.run(until="end")
    seconds = time.monotonic() - started
    return JobBenchResult(
        name,
        result.records,
        round(seconds, 2),
        round(result.records / seconds, 1),
        round(steady_rate(result.run.observed.samples), 1),
        result.checkpoints_completed,
    )


def steady_rate(samples: list[tuple[float, int]]) -> float:
    """Records per second between the first sample with records and the last one
    (0 with fewer than two such samples)."""
    busy = [s for s in samples if s[1] > 0]
    if len(busy) < 2 or busy[-1][0] <= busy[0][0]:
        return 0.0
    return (busy[-1][1] - busy[0][1]) / (busy[-1][0] - busy[0][0])
