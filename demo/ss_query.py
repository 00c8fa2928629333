"""The demo's per-plane statistics as an unmodified Spark Structured Streaming query,
run in its own process (a driver that ``dstltree.demo.ss_job`` can kill hard).

The query: ``readStream`` over the landing Parquet files (dstltree.demo.producer),
``where distance > 0``, ``groupBy("tailnum").agg(count, sum(dep_delay),
sum(arr_delay), sum(distance), max(struct(event_time, origin, dest)))``, update output
mode, a ``processingTime`` trigger, the RocksDB state store with changelog
checkpointing, its state files through the tree by ``configure(builder, socket=...)``.
Nothing in the query knows about the tree.

The sink is exactly once per batch: ``foreachBatch`` writes the batch's rows
(:data:`~dstltree.demo.flights.SINK_SCHEMA`) as ONE Parquet file
``<sink>/batch-<id, 9 digits>.parquet``, atomically (a hidden temporary file renamed),
so a batch replayed after a crash replaces its own file. In update mode a batch holds
the planes it changed with their totals after it, so each plane's latest row (the most
flights) is its final statistics.

Run as ``python -m dstltree.demo.ss_query --landing ... --checkpoint ... --sink ...
--socket ... --progress FILE``: it runs with the trigger until ``<landing>/_SUCCESS``
exists, then stops the query between batches and finishes with ``availableNow`` over
every file left; exit status 0 when done, 1 on a query failure or after ``--timeout``.
Each executed batch's progress event (``StreamingQueryProgress`` as JSON, plus
``"trigger"``: ``"interval"`` or ``"availableNow"``) is appended to the progress file
as one line, flushed at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from dstltree.demo.checks import KEEP, LANDING_DDL
from dstltree.demo.flights import SINK_COLUMNS, SINK_SCHEMA
from dstltree.demo.producer import MARKER

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: the state store settings of the query (RocksDB, changelog checkpointing)
STATE_STORE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}
QUERY_NAME = "plane-stats"
POLL_S = 0.1  # seconds between looks at the query's progress and the landing marker
FINISH_TIMEOUT = 600.0  # seconds for the whole run, availableNow included


def builder(master: str, shuffle_partitions: int, app: str = "dstltree-ss-demo") -> Any:
    """A ``SparkSession.Builder`` for the query: ``master``, ``shuffle_partitions``
    (``spark.sql.shuffle.partitions``), the RocksDB state store with changelog
    checkpointing, quiet logs (the job's log4j settings), no UI, loopback addresses
    for local masters, this Python for the workers. Not yet configured for the tree."""
    from pyspark.sql import SparkSession

    from dstltree.sparkplug.spark_session import LOG4J

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    b = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.streaming.numRecentProgressUpdates", "1000")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
    )
    for key, value in STATE_STORE_CONF.items():
        b = b.config(key, value)
    if master.startswith(("local", "spark://127.")):  # a cluster on this machine too
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        b = b.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    return b


def session(
    master: str, shuffle_partitions: int, socket: str | Path, local_dir: str | None = None
) -> Any:
    """A new SparkSession from :func:`builder` set up by
    ``dstltree.structured_streaming.configure`` to send its state files to the bridge on
    ``socket``; ``local_dir``: its ``spark.local.dir`` (scratch space, RocksDB's working
    copies; None: Spark's default). Raises JarBuildError when the manager's jar cannot
    be built."""
    from dstltree.structured_streaming import configure

    b = builder(master, shuffle_partitions)
    if local_dir is not None:
        b = b.config("spark.local.dir", local_dir)
    spark = configure(b, socket=socket).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def plane_stats(spark: Any, landing: str, max_files_per_trigger: int) -> Any:
    """The streaming DataFrame of the per-plane statistics over ``landing`` (columns
    :data:`~dstltree.demo.flights.SINK_COLUMNS`), reading at most
    ``max_files_per_trigger`` new files per batch."""
    from pyspark.sql import functions as F

    stats = (
        spark.readStream.schema(LANDING_DDL)
        .option("maxFilesPerTrigger", max_files_per_trigger)
        .parquet(landing)
        .where(KEEP)
        .groupBy("tailnum")
        .agg(
            F.count(F.lit(1)).alias("flights"),
            F.sum("dep_delay").alias("dep"),
            F.sum("arr_delay").alias("arr"),
            F.sum("distance").alias("dist"),
            F.max(F.struct("event_time", "origin", "dest")).alias("last"),
        )
    )
    return stats.select(
        "tailnum",
        "flights",
        F.coalesce("dep", F.lit(0)).cast("bigint").alias("dep_delay_sum"),
        F.coalesce("arr", F.lit(0)).cast("bigint").alias("arr_delay_sum"),
        F.col("dist").cast("bigint").alias("distance_sum"),
        F.col("last.event_time").alias("last_time"),
        F.col("last.origin").alias("last_origin"),
        F.col("last.dest").alias("last_dest"),
    )


def batch_file(sink: str | Path, batch_id: int) -> Path:
    """The sink file of batch ``batch_id``: ``<sink>/batch-<9 digits>.parquet``."""
    return Path(sink) / f"batch-{batch_id:09d}.parquet"


def write_batch(sink: str | Path, batch_id: int, table: pa.Table) -> Path:
    """Write ``table`` (cast to SINK_SCHEMA) as batch ``batch_id``'s file, replacing an
    earlier one atomically (hidden temporary file, fsync, rename); returns its path.
    Raises OSError, or ArrowInvalid for rows that do not cast."""
    final = batch_file(sink, batch_id)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp")
    with open(tmp, "wb") as f:
        pq.write_table(table.select(SINK_COLUMNS).cast(SINK_SCHEMA), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def _record_new(query: Any, seen: set[tuple[str, int]], trigger: str, out: TextIO) -> None:
    """Append the query's executed batches not yet recorded (by run id and batch id)
    to ``out``; events of triggers that found no data (no ``addBatch``) are skipped."""
    for p in query.recentProgress:  # dicts on pyspark 3.5, progress objects from 4.0
        doc = json.loads(p.json) if hasattr(p, "json") else p
        key = (str(doc["runId"]), int(doc["batchId"]))
        if key in seen or "addBatch" not in (doc.get("durationMs") or {}):
            continue
        seen.add(key)
        out.write(json.dumps({**doc, "trigger": trigger}) + "\n")
        out.flush()


def to_arrow(df: Any) -> Any:
    """``df`` collected as a ``pyarrow.Table``: ``DataFrame.toArrow`` (pyspark 4.0+), or on
    3.5 the Arrow batches pyspark's ``toPandas`` collects, with the frame's schema."""
    if hasattr(df, "toArrow"):
        return df.toArrow()
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    batches = df._collect_as_arrow()
    return pa.Table.from_batches(batches) if batches else to_arrow_schema(df.schema).empty_table()


def _start(stream: Any, checkpoint: str, sink: str, trigger: dict[str, Any]) -> Any:
    def sink_batch(df: Any, batch_id: int) -> None:
        write_batch(sink, batch_id, to_arrow(df))

    return (
        stream.writeStream.outputMode("update")
        .queryName(QUERY_NAME)
        .option("checkpointLocation", checkpoint)
        .foreachBatch(sink_batch)
        .trigger(**trigger)
        .start()
    )


def run(
    spark: Any,
    *,
    landing: str,
    checkpoint: str,
    sink: str,
    trigger_s: float,
    max_files_per_trigger: int,
    progress: TextIO,
    timeout: float = FINISH_TIMEOUT,
) -> None:
    """Run the query (module docstring) until every landing file is processed, at most
    ``timeout`` s. Raises TimeoutError, or the query's StreamingQueryException."""
    deadline = time.monotonic() + timeout
    stream = plane_stats(spark, landing, max_files_per_trigger)
    seen: set[tuple[str, int]] = set()
    interval = {"processingTime": f"{int(trigger_s * 1000)} milliseconds"}
    q = _start(stream, checkpoint, sink, interval)
    try:
        marker = Path(landing) / MARKER
        if not _follow(q, seen, "interval", progress, marker.exists, deadline):
            # stop between batches (a batch stopped mid-way is run again, harmlessly)
            _follow(
                q, seen, "interval", progress, lambda: not q.status["isTriggerActive"], deadline
            )
    finally:
        q.stop()
    q = _start(stream, checkpoint, sink, {"availableNow": True})
    try:
        _follow(q, seen, "availableNow", progress, lambda: False, deadline)
        _record_new(q, seen, "availableNow", progress)
    finally:
        q.stop()


def _follow(
    q: Any,
    seen: set[tuple[str, int]],
    trigger: str,
    out: TextIO,
    until: Callable[[], bool],
    deadline: float,
) -> bool:
    """Record the query's progress (:func:`_record_new`) every POLL_S s until
    ``until()`` holds (False) or the query terminates (True). Raises TimeoutError at
    ``deadline`` (monotonic s), the query's exception when it fails."""
    while True:
        if q.awaitTermination(POLL_S):
            return True
        _record_new(q, seen, trigger, out)
        if until():
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"the query ({trigger}) did not finish in time")


def main(argv: Sequence[str] | None = None) -> int:
    """The process entry point (module docstring); returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m dstltree.demo.ss_query")
    p.add_argument("--landing", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--sink", required=True)
    p.add_argument("--socket", required=True, help="the bridge's Unix socket")
    p.add_argument("--progress", required=True, help="file the progress events go to")
    p.add_argument("--master", default="local[4]")
    p.add_argument("--shuffle-partitions", type=int, default=4)
    p.add_argument("--trigger", type=float, default=0.3, help="seconds between batches")
    p.add_argument("--max-files-per-trigger", type=int, default=8)
    p.add_argument("--timeout", type=float, default=FINISH_TIMEOUT, help="seconds")
    p.add_argument("--local-dir", default="", help="spark.local.dir (RocksDB's copies)")
    a = p.parse_args(argv)
    spark = session(a.master, a.shuffle_partitions, a.socket, a.local_dir or None)
    try:
        with open(a.progress, "a") as out:
            run(
                spark,
                landing=a.landing,
                checkpoint=a.checkpoint,
                sink=a.sink,
                trigger_s=a.trigger,
                max_files_per_trigger=a.max_files_per_trigger,
                progress=out,
                timeout=a.timeout,
            )
    except Exception as e:  # noqa: BLE001 - reported on stderr, exit status 1
        print(f"ss_query failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
