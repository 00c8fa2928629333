"""Spark sessions for the Structured Streaming tests: quiet, loopback, our Python, the
log4j settings of the job's sessions, set up through ``configure(...)``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from dstltree.sparkplug.spark_session import LOG4J
from dstltree.structured_streaming import configure
from dstltree.structured_streaming.configure import LocalServices, start_local


def ss_builder(master: str = "local[4]", partitions: int = 4) -> Any:
    """A SparkSession.Builder on ``master`` with ``partitions`` shuffle partitions."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    return (
        SparkSession.builder.master(master)
        .appName("dstltree-ss-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        # Spark's defaults off local[N]; explicit: a JVM reused from a sparkplug session
        # (maxFailures 1, maxConsecutiveAttempts 1) must not make a killed executor's
        # task, or the fetch failure its lost shuffle output causes, fail the query
        .config("spark.task.maxFailures", "4")
        .config("spark.stage.maxConsecutiveAttempts", "4")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )


def ss_session(master: str = "local[4]", partitions: int = 4, **kw: Any) -> Any:
    """A new SparkSession set up by ``configure(builder, **kw)``."""
    spark = configure(ss_builder(master, partitions), **kw).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
#: the state store providers the tests run with (RocksDB with changelog checkpointing)
PROVIDERS = {
    "rocksdb": {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    },
    "hdfs": {"spark.sql.streaming.stateStore.providerClass": HDFS},
}
# what a state store writes per partition: changelogs, deltas, snapshots (HDFS-backed)
# and RocksDB snapshots' zip files through the checkpoint file manager, RocksDB's SST
# files through Hadoop's FileSystem.copyFromLocalFile (DstlLocalFileSystem)
STATE_SUFFIXES = (".changelog", ".delta", ".snapshot", ".zip", ".sst")


def start_tree(folder: Path) -> LocalServices:
    """A 2-node tree (root and one child, persist delay 0.02 s) and a bridge on this
    machine, its objects under ``folder/dstl``; stop it with ``stop()``."""
    topology = folder / "topology.yaml"
    topology.write_text(
        "base_path: dstl\n"
        "persist_delay: 0.02\n"
        "nodes:\n"
        "  - {id: root, bind: auto}\n"
        "  - {id: a, bind: auto, parent: root}\n"
    )
    return start_local(topology, base_path=str(folder / "dstl"))


def write_json_input(folder: Path, n: int, rows: list[dict[str, Any]]) -> None:
    """``rows`` as input file ``n`` (JSON lines), renamed into place whole: the file
    source never sees half a file."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".part-{n}.json.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(folder / f"part-{n}.json")


def listed(spark: Any, location: str, d: str) -> set[str]:
    """The names in directory ``d`` of checkpoint ``location`` as Spark's checkpoint file
    manager lists them (the bridge's files and plain ones); empty when there is none."""
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    cfm = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    path = jvm.org.apache.hadoop.fs.Path(f"{location.rstrip('/')}/{d}")
    try:
        return {s.getPath().getName() for s in cfm.create(path, conf).list(path)}
    except Exception:  # noqa: BLE001 - no such directory
        return set()


def plain_files(checkpoint: Path, d: str) -> list[Path]:
    """Plain files (checksums aside) in directory ``d`` of a ``file:`` checkpoint."""
    folder = checkpoint / d
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if p.is_file() and not p.name.endswith(".crc")]
