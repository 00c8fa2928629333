"""Writes tests/golden/ss-e9b3d4a/: a Structured Streaming query's checkpoint location
and its tree as e9b3d4a left them (state files in the tree, the metadata logs plain
files with their ``.crc``, the bridge's manifests in format 2, naming objects by
absolute path), so that tests/integration/test_ss_location.py checks this version
still restores it. Three batches of ``groupBy(k).agg(count, sum)`` over
``in/part-{1,2,3}.json`` (RocksDB, changelog checkpointing, a 2-node tree). Run once,
on a checkout of e9b3d4a with its jar, from that checkout's root:
``python tests/golden/make_ss_e9b3d4a.py``; the files it wrote are committed.

Spark's logs and the manifests name absolute paths: everything is written below
:data:`PLACE`, where the test puts the copy back before restoring it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dstltree.structured_streaming.configure import start_local
from tests.support.ss_session import PROVIDERS, ss_session, write_json_input

PLACE = Path("/tmp/dstl-golden-e9b3d4a")
OUT = Path(__file__).parent / "ss-e9b3d4a"
TOPOLOGY = (
    "base_path: dstl\n"
    "persist_delay: 0.02\n"
    "nodes:\n"
    "  - {id: root, bind: auto}\n"
    "  - {id: a, bind: auto, parent: root}\n"
)


def rows(n: int) -> list[dict[str, Any]]:
    """Input file ``n``'s rows (the test's ``_rows``)."""
    return [{"k": f"k{i % 5}", "v": i * n} for i in range(30)]


def main() -> None:
    from pyspark.sql import functions as F

    shutil.rmtree(PLACE, ignore_errors=True)
    PLACE.mkdir()
    (PLACE / "topology.yaml").write_text(TOPOLOGY)
    for n in (1, 2, 3):
        write_json_input(PLACE / "in", n, rows(n))
    services = start_local(PLACE / "topology.yaml", base_path=str(PLACE / "tree"))
    try:
        spark = ss_session(socket=services.socket)
        for k, v in PROVIDERS["rocksdb"].items():
            spark.conf.set(k, v)
        stream = (
            spark.readStream.schema("k string, v long")
            .option("maxFilesPerTrigger", 1)
            .json(str(PLACE / "in"))
            .groupBy("k")
            .agg(F.count("*").alias("n"), F.sum("v").alias("s"))
        )
        q = (
            stream.writeStream.outputMode("complete")
            .format("memory")
            .queryName("agg")
            .option("checkpointLocation", str(PLACE / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(300)
        spark.stop()
    finally:
        services.stop()  # the bridge writes its last manifest
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    for part in ("in", "checkpoint", "tree"):
        shutil.copytree(PLACE / part, OUT / part)
    shutil.rmtree(PLACE)


if __name__ == "__main__":
    main()
