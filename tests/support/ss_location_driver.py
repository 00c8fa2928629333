"""A Structured Streaming driver process for tests of ``dstl://`` locations:
``python -m tests.support.ss_location_driver SOCKET LOCATION INPUT OUT [MODE]``.

Runs ``groupBy(k).agg(count, sum)`` over the JSON files of INPUT (one file per batch)
with the RocksDB provider, checkpointing to LOCATION through the bridge on SOCKET, its
complete output of each batch written to ``OUT/result-<batch>.json``. MODE
``availableNow`` (default) runs until every file is processed and exits 0; ``hang-at-N``
runs with a processing-time trigger and, in batch N's sink (after the batch's state
files were written, before its commit), creates ``OUT/in-batch-N`` and waits there (at
most 120 s) for the test to SIGKILL this process.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.ss_session import PROVIDERS, ss_session

HANG_S = 120.0


def main(argv: list[str]) -> int:
    socket, location, source, out = argv[:4]
    mode = argv[4] if len(argv) > 4 else "availableNow"
    hang_at = int(mode.removeprefix("hang-at-")) if mode.startswith("hang-at-") else -1
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    from pyspark.sql import functions as F

    spark = ss_session(socket=socket)
    for k, v in PROVIDERS["rocksdb"].items():
        spark.conf.set(k, v)

    def sink(df: Any, batch: int) -> None:
        rows = sorted([r.k, r.n, r.s] for r in df.collect())
        (folder / f"result-{batch}.json").write_text(json.dumps(rows))
        if batch == hang_at:
            (folder / f"in-batch-{batch}").touch()
            time.sleep(HANG_S)  # bounded: the test kills this process first

    stream = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .json(source)
        .groupBy("k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("s"))
    )
    writer = stream.writeStream.outputMode("complete").foreachBatch(sink)
    writer = writer.option("checkpointLocation", location)
    if hang_at >= 0:
        q = writer.trigger(processingTime="200 milliseconds").start()
    else:
        q = writer.trigger(availableNow=True).start()
    q.awaitTermination(HANG_S + 60)
    error = q.exception()
    q.stop()
    spark.stop()
    if error is not None:
        print(f"query failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
