"""A real Structured Streaming query on ``local[4]`` through ``configure(...)``: a file
source over small JSON files, ``groupBy().agg(count, sum)``, with the RocksDB provider
(changelog checkpointing on) and with the default HDFS-backed provider. Its state files
go through the bridge into the tree (no ``*.changelog``/``*.delta`` under the checkpoint
directory), the result equals a batch aggregation, and the query restarted from its
checkpoint in a new Spark session continues correctly with more input. Without a bridge
the query still succeeds with plain files, and a restart with the bridge up reads them.

One set of nodes and one bridge serve the module; every session is stopped after use.
"""

from __future__ import annotations

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

QUERY_TIMEOUT = 120.0  # seconds for one availableNow run


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServices]:
    s = start_tree(tmp_path_factory.mktemp("tree"))
    try:
        yield s
    finally:
        s.stop()


def _write_input(folder: Path, n: int) -> None:
    """File ``n`` of the input: 30 rows over 5 keys (values depend on ``n``)."""
    rows = [{"k": f"k{i % 5}", "v": i * n} for i in range(30)]
    write_json_input(folder, n, rows)


def _run(spark: Any, source: Path, checkpoint: Path, conf: dict[str, str]) -> set[tuple]:
    """Run the aggregation over ``source`` until every file is processed (one file per
    batch), from ``checkpoint``; returns the sink's rows."""
    from pyspark.sql import functions as F

    for k, v in conf.items():
        spark.conf.set(k, v)
    stream = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .groupBy("k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("s"))
    )
    q = (
        stream.writeStream.outputMode("complete")
        .format("memory")
        .queryName("agg")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(QUERY_TIMEOUT), "the query did not finish in time"
        assert q.exception() is None, q.exception()
        return {tuple(r) for r in spark.sql("SELECT k, n, s FROM agg").collect()}
    finally:
        q.stop()


def _batch(spark: Any, source: Path) -> set[tuple]:
    """The same aggregation as a batch query over every file of ``source``."""
    from pyspark.sql import functions as F

    df = spark.read.schema("k string, v long").json(str(source))
    rows = df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("s")).collect()
    return {tuple(r) for r in rows}


def _state_files(checkpoint: Path) -> list[Path]:
    return [p for p in checkpoint.rglob("*") if p.is_file() and p.name.endswith(STATE_SUFFIXES)]


def _bridge_ssts(spark: Any, checkpoint: Path) -> bool:
    """Whether the manager lists an SST file of some partition (from the bridge)."""
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    cfm = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    for p in range(4):
        d = jvm.org.apache.hadoop.fs.Path(f"file:{checkpoint}/state/0/{p}/SSTs")
        try:
            if any(s.getPath().getName().endswith(".sst") for s in cfm.create(d, conf).list(d)):
                return True
        except Exception:  # noqa: BLE001 - no such directory yet
            continue
    return False


def _plain_state_files(spark: Any) -> int:
    return int(spark._jvm.io.dstltree.spark.DstlCheckpointFileManager.plainStateFiles())


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_query_state_goes_through_the_tree_and_restarts(
    services: LocalServices, tmp_path: Path, provider: str
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    conf = {
        **PROVIDERS[provider],
        "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",  # snapshots too
        "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
    }
    for n in (1, 2, 3):
        _write_input(source, n)
    base = Path(services.nodes.local_tree.topology.base_path)
    spark = ss_session(socket=services.socket)
    try:
        got = _run(spark, source, checkpoint, conf)
        assert got == _batch(spark, source)
        if provider == "rocksdb":  # maintenance (every second, session alive) uploads a
            # snapshot whose SST files reach the bridge (DstlLocalFileSystem); held for
            # the next commit, so seen through the manager's listing, not in manifests
            wait_until(lambda: _bridge_ssts(spark, checkpoint), timeout=120, interval=0.5)
        # none fell back to a plain file (on disk, not the JVM-wide count of plain
        # files: a stopped session's state stores of an earlier test in this JVM may
        # still write snapshots, without their bridge)
        assert _state_files(checkpoint) == []
    finally:
        spark.stop()
    assert (checkpoint / "commits" / "2").exists()  # three batches committed
    assert _state_files(checkpoint) == []
    objects = list(base.rglob("*.dstl"))
    assert objects, "no object written into the tree"

    _write_input(source, 4)
    spark = ss_session(socket=services.socket)  # a new session: the state is read back
    try:
        got = _run(spark, source, checkpoint, conf)
        assert got == _batch(spark, source)
        assert {n for _, n, _ in got} == {24}  # 4 files x 30 rows / 5 keys
    finally:
        spark.stop()
    assert (checkpoint / "commits" / "3").exists()
    assert _state_files(checkpoint) == []


def test_without_a_bridge_the_query_writes_plain_files(
    services: LocalServices, tmp_path: Path
) -> None:
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    _write_input(source, 1)
    _write_input(source, 2)
    spark = ss_session(socket=tmp_path / "no-bridge" / "bridge.sock")
    try:
        plain = _plain_state_files(spark)
        got = _run(spark, source, checkpoint, PROVIDERS["hdfs"])
        assert got == _batch(spark, source)
        assert _plain_state_files(spark) >= plain + 4  # 2 batches x 4 partitions
    finally:
        spark.stop()
    assert len([p for p in _state_files(checkpoint) if p.suffix == ".delta"]) == 8

    _write_input(source, 3)  # restart with the bridge up: it reads the plain files
    spark = ss_session(socket=services.socket)
    try:
        got = _run(spark, source, checkpoint, PROVIDERS["hdfs"])
        assert got == _batch(spark, source)
    finally:
        spark.stop()
    assert (checkpoint / "commits" / "2").exists()
    assert not (checkpoint / "state" / "0" / "0" / "3.delta").exists()  # in the tree
