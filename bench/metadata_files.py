"""Checkpoint metadata of a keyed job against the number of its input files ("a job
over 10x as many input files keeps it as small"; BENCHMARKS.md, "Checkpoints on
object stores").

A keyed count (``StreamingJob``, 4 tasks, ``deploy/local.yaml``, local disk, 0.3 s
interval) over ``files`` Parquet files of 20 rows each (500 keys), written under
``root`` before the job starts, read at ``rate`` records per second per reader so that
runs over different file counts last alike. Prints one JSON line: files, records,
checkpoints, and the metadata bytes of the checkpoints (first, median, last, max; the
empty ones of a subsumed-at-once checkpoint left out)::

    python -m dstltree.bench.metadata_files 365 /tmp/m365 30
    python -m dstltree.bench.metadata_files 3650 /tmp/m3650 300
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dstltree.sparkplug import FileSink, FileSource, KeyedProcessFunction, StreamingJob
from dstltree.sparkplug.spark_session import spark_session

ROWS_PER_FILE = 20
KEYS = 500


class Count(KeyedProcessFunction):
    """Per key: records seen so far."""

    def open(self, ctx: Any) -> None:
        self.n = ctx.value_state("n")

    def process(self, key: Any, record: dict[str, Any], out: Any) -> None:
        n = (self.n.get() or 0) + 1
        self.n.set(n)
        out.emit({"k": key, "n": n})


def write_input(landing: Path, files: int) -> None:
    """``files`` Parquet files of ``ROWS_PER_FILE`` rows, then ``_SUCCESS``."""
    landing.mkdir(parents=True)
    for i in range(files):
        keys = [f"k{(i * 7 + j) % KEYS}" for j in range(ROWS_PER_FILE)]
        pq.write_table(
            pa.table({"k": keys, "v": list(range(ROWS_PER_FILE))}),
            landing / f"part-{i:05d}.parquet",
        )
    (landing / "_SUCCESS").touch()


def run(files: int, root: Path, rate: float, topology: str = "deploy/local.yaml") -> dict[str, Any]:
    """Run the job once over a fresh ``root``; returns the figures (module docstring)."""
    shutil.rmtree(root, ignore_errors=True)
    write_input(root / "landing", files)
    spark = spark_session("local[4]")
    try:
        job = StreamingJob(
            spark,
            name="metadata-files",
            checkpoint_dir=str(root / "checkpoints"),
            topology=topology,
            parallelism=4,
            checkpoint_interval=0.3,
            materialization_interval=3.0,
            source_rate=rate,
        )
        schema = pa.schema([("k", pa.string()), ("n", pa.int64())])
        (
            job.source(FileSource(str(root / "landing"), format="parquet"))
            .key_by("k")
            .process(Count())
            .sink(FileSink(str(root / "sink"), format="parquet", schema=schema))
        )
        result = job.run(until="end")
    finally:
        spark.stop()
    sizes = [b for b in result.run.stats.metadata_bytes if b > 0]
    return {
        "files": files,
        "records": result.records,
        "checkpoints": result.checkpoints_completed,
        "metadata_first": sizes[0],
        "metadata_p50": sorted(sizes)[len(sizes) // 2],
        "metadata_last": sizes[-1],
        "metadata_max": max(sizes),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", type=int, help="input files")
    p.add_argument("root", type=Path, help="a scratch folder (deleted first)")
    p.add_argument("rate", type=float, help="records per second per reader")
    a = p.parse_args()
    print(json.dumps(run(a.files, a.root, a.rate)))


if __name__ == "__main__":
    main()
