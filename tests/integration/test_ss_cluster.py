"""A Structured Streaming query through the tree on ``local-cluster[2,1,1024]`` (two
executor JVMs besides the driver), RocksDB provider with changelog checkpointing:

1. an executor JVM is killed hard (SIGKILL by its PID) while a batch's tasks run; Spark
   reruns the lost tasks on the other executor and the replacement, whose state stores
   load their state back from the tree; the query finishes;
2. the query is restarted from its checkpoint with the tree's nodes down (the bridge
   writes straight to the DFS, or the manager falls back to plain files): it finishes.

After each, the sink and the state read back with the ``statestore`` source equal the
batch answer, and no changelog file is under the checkpoint after the first.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dstltree.structured_streaming.configure import LocalServices
from tests.support.ss_session import (
    PROVIDERS,
    STATE_SUFFIXES,
    ss_session,
    start_tree,
    write_json_input,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.spark

MASTER = "local-cluster[2,1,1024]"
CONF = PROVIDERS["rocksdb"]
QUERY_TIMEOUT = 240.0  # seconds for one availableNow run (task retries included)
KILL_TIMEOUT = 120.0  # seconds to see a batch's tasks running after batch 1 committed
POLL_S = 0.02  # seconds between looks at the running query


@pytest.fixture()
def services(tmp_path: Path) -> Iterator[LocalServices]:
    s = start_tree(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def _write_input(folder: Path, n: int) -> None:
    """File ``n`` of the input: 200 rows over 20 keys (values depend on ``n``)."""
    rows = [{"k": f"k{i % 20}", "v": i * n} for i in range(200)]
    write_json_input(folder, n, rows)


def _start(
    spark: Any, source: Path, checkpoint: Path, name: str, available_now: bool = True
) -> Any:
    """Start the aggregation over ``source`` (one file per batch, ``availableNow``, or
    as fast as batches run when ``available_now`` is False: the query then keeps
    running) from ``checkpoint`` into the memory table ``name``; returns the query."""
    from pyspark.sql import functions as F

    for k, v in CONF.items():
        spark.conf.set(k, v)
    stream = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .groupBy("k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("s"))
    )
    return (
        stream.writeStream.outputMode("complete")
        .format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**({"availableNow": True} if available_now else {"processingTime": "0 seconds"}))
        .start()
    )


def _finish(spark: Any, q: Any, name: str, timeout: float = QUERY_TIMEOUT) -> set[tuple]:
    """Wait for ``q`` to end (at most ``timeout`` s); returns its sink's rows."""
    try:
        assert q.awaitTermination(timeout), "the query did not finish in time"
        assert q.exception() is None, q.exception()
        return {tuple(r) for r in spark.sql(f"SELECT k, n, s FROM {name}").collect()}
    finally:
        q.stop()


def _expected(spark: Any, source: Path) -> set[tuple]:
    from pyspark.sql import functions as F

    df = spark.read.schema("k string, v long").json(str(source))
    rows = df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s")).collect()
    return {tuple(r) for r in rows}


def _state(spark: Any, checkpoint: Path) -> set[tuple]:
    """The aggregation state read back with the ``statestore`` source: (k, n, s)."""
    rows = spark.read.format("statestore").load(str(checkpoint)).collect()
    return {(r.key.k, r.value["count"], r.value["sum"]) for r in rows}


def _executor_pids(app_id: str) -> list[int]:
    """PIDs of this application's executor JVMs (``CoarseGrainedExecutorBackend``
    processes whose command line names ``app_id``), from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd and (
            app_id.encode() in cmd
        ):
            pids.append(int(entry.name))
    return sorted(pids)


def _kill_mid_batch(spark: Any, checkpoint: Path) -> int:
    """Once batch 1 is committed, wait for a stage with running tasks (the next batch),
    SIGKILL one executor JVM and return its PID. Fails after KILL_TIMEOUT s."""
    tracker = spark.sparkContext.statusTracker()
    found: list[int] = []

    def batch_running() -> bool:
        if not (checkpoint / "commits" / "1").exists():
            return False
        running = [
            s
            for s in tracker.getActiveStageIds()
            if (info := tracker.getStageInfo(s)) is not None and info.numActiveTasks > 0
        ]
        pids = _executor_pids(spark.sparkContext.applicationId)
        if running and pids:
            found.append(pids[0])
        return bool(found)

    wait_until(batch_running, timeout=KILL_TIMEOUT, interval=POLL_S)
    os.kill(found[0], signal.SIGKILL)
    return found[0]


def test_executor_killed_mid_batch_then_restart_with_the_nodes_down(
    services: LocalServices, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    for n in range(1, 9):
        _write_input(source, n)
    spark = ss_session(master=MASTER, socket=services.socket)
    try:
        app = spark.sparkContext.applicationId
        # the executors register after the session is up (slowly on a busy machine)
        wait_until(lambda: len(_executor_pids(app)) == 2, timeout=120.0, interval=0.2)
        q = _start(spark, source, checkpoint, "agg1")
        killed = _kill_mid_batch(spark, checkpoint)
        got = _finish(spark, q, "agg1")
        assert killed not in _executor_pids(spark.sparkContext.applicationId)
        expected = _expected(spark, source)
        assert got == expected
        assert _state(spark, checkpoint) == expected
        assert (checkpoint / "commits" / "7").exists()  # 8 batches
        assert [p for p in checkpoint.rglob("*") if p.name.endswith(STATE_SUFFIXES)] == []

        services.nodes.stop()  # the bridge stays; no node answers it
        _write_input(source, 9)
        got = _finish(spark, _start(spark, source, checkpoint, "agg2"), "agg2")
        expected = _expected(spark, source)
        assert got == expected
        assert _state(spark, checkpoint) == expected
        assert (checkpoint / "commits" / "8").exists()
    finally:
        spark.stop()
