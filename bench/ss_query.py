"""One run of the ``dstl bench structured-streaming`` query and its figures.

The query: JSON files landing in a folder, one read per micro-batch
(``maxFilesPerTrigger=1``), ``groupBy(k).agg(count, sum(v))`` into the ``noop`` sink in
update mode, a processing-time trigger. A lander thread writes two files before the
query starts and then one file per trigger interval, so a query that keeps up always
finds one. The figures come from the query's progress (``durationMs.triggerExecution``,
batch start timestamps, input rows) and from the files under the checkpoint location
after the run.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from dstltree.stats import percentile

__all__ = ["QueryFigures", "QueryInput", "checkpoint_files", "land_files", "run_query"]

POLL_S = 0.2  # seconds between looks at the query's progress


@dataclass(frozen=True)
class QueryInput:
    """The input: ``files`` files (one per batch) of ``rows`` rows over ``keys`` keys,
    landing one per ``trigger_s`` seconds (two before the start); ``seed`` fixes the
    rows."""

    files: int
    rows: int
    keys: int
    trigger_s: float
    seed: int = 0


@dataclass(frozen=True)
class QueryFigures:
    """What one run measured. Durations in seconds (without the warm-up batches);
    ``held`` is the fraction of the
    intervals between consecutive batch starts that stayed within ``held_factor`` times
    the trigger interval; files and bytes are those under the checkpoint location after
    the run (Hadoop ``.crc`` files excluded), ``changelog_files`` the ``*.changelog``
    among them."""

    batches: int
    rows: int
    batch_p50_s: float
    batch_p99_s: float
    batch_max_s: float
    records_per_s: float
    held: float
    checkpoint_files: int
    checkpoint_bytes: int
    changelog_files: int


def _write_file(folder: Path, i: int, spec: QueryInput) -> None:
    """File ``i``: ``spec.rows`` JSON rows, written aside then renamed (the source never
    sees half a file)."""
    rng = random.Random(spec.seed * 1_000_003 + i)
    lines = (
        json.dumps({"k": f"k{rng.randrange(spec.keys)}", "v": rng.randrange(1000)})
        for _ in range(spec.rows)
    )
    tmp = folder / f".part-{i:06d}.json.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(folder / f"part-{i:06d}.json")


def land_files(folder: Path, spec: QueryInput, stop: threading.Event, first: int = 2) -> None:
    """Write files ``first``.. of ``spec`` into ``folder``, one per trigger interval
    from now (files before ``first`` are the caller's); returns when all are written or
    ``stop`` is set."""
    start = time.monotonic()
    for i in range(first, spec.files):
        due = start + (i - first + 1) * spec.trigger_s
        if stop.wait(max(0.0, due - time.monotonic())):
            return
        _write_file(folder, i, spec)


def run_query(
    spark: Any,
    source: Path,
    checkpoint: str,
    spec: QueryInput,
    held_factor: float = 1.5,
    timeout_s: float = 900.0,
    warmup: int = 0,
) -> QueryFigures:
    """Run the query of this module from ``checkpoint`` (a Hadoop URI, e.g.
    ``file:/...`` or ``latency:/...``; its local folder is the path part) until every
    file of ``spec`` is processed, then stop it (a ``dstl://`` location has no folder:
    no files are counted). Raises TimeoutError when that takes
    more than ``timeout_s`` seconds, RuntimeError when the query fails. ``warmup``:
    batches left out of the duration and interval figures (see :func:`_figures`)."""
    from pyspark.sql import functions as F

    source.mkdir(parents=True, exist_ok=True)
    for i in range(min(2, spec.files)):
        _write_file(source, i, spec)
    agg = (
        spark.readStream.schema("k string, v long")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .groupBy("k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("s"))
    )
    q = (
        agg.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{int(spec.trigger_s * 1000)} milliseconds")
        .start()
    )
    stop = threading.Event()
    lander = threading.Thread(target=land_files, args=(source, spec, stop), daemon=True)
    lander.start()
    try:
        progress = _await_rows(q, spec.files * spec.rows, timeout_s)
    finally:
        stop.set()
        q.stop()
        lander.join(timeout=10.0)
    scheme, _, rest = checkpoint.partition(":")
    folder = None if scheme == "dstl" else Path(rest)  # dstl://: no file outside the tree
    return _figures(progress, spec, held_factor, folder, warmup)


def _await_rows(q: Any, rows: int, timeout_s: float) -> list[dict[str, Any]]:
    """The progress of every batch with input, once they sum to ``rows`` input rows."""
    deadline = time.monotonic() + timeout_s
    while True:
        if q.exception() is not None:
            raise RuntimeError(f"the query failed: {q.exception()}")
        done = [p for p in q.recentProgress if (p.get("numInputRows") or 0) > 0]
        if sum(p["numInputRows"] for p in done) >= rows:
            return sorted(done, key=lambda p: p["batchId"])
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(done)} batches in {timeout_s:.0f} s, input not done")
        q.awaitTermination(POLL_S)  # returns after POLL_S s while the query runs


def _start(p: dict[str, Any]) -> float:
    """A batch's start (epoch seconds) from its progress timestamp."""
    return datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()


def _figures(
    progress: list[dict[str, Any]],
    spec: QueryInput,
    held_factor: float,
    folder: Path | None,
    warmup: int = 0,
) -> QueryFigures:
    """The figures of ``progress`` (batches in order); batch durations and start
    intervals leave out the first ``warmup`` batches (all kept when there are no
    more), records/s covers every batch."""
    durations = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    starts = [_start(p) for p in progress]
    elapsed = starts[-1] + durations[-1] - starts[0]
    skip = warmup if len(progress) > warmup else 0
    durations, starts = durations[skip:], starts[skip:]
    intervals = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    within = [d <= held_factor * spec.trigger_s for d in intervals]
    rows = sum(int(p["numInputRows"]) for p in progress)
    files, size, changelogs = (0, 0, 0) if folder is None else checkpoint_files(folder)
    return QueryFigures(
        batches=len(progress),
        rows=rows,
        batch_p50_s=percentile(durations, 50),
        batch_p99_s=percentile(durations, 99),
        batch_max_s=max(durations),
        records_per_s=rows / elapsed if elapsed > 0 else float("nan"),
        held=sum(within) / len(within) if within else float("nan"),
        checkpoint_files=files,
        checkpoint_bytes=size,
        changelog_files=changelogs,
    )


def checkpoint_files(folder: Path) -> tuple[int, int, int]:
    """(files, bytes, ``*.changelog`` files) under ``folder``, Hadoop's ``.crc``
    checksum files and hidden temporary files (a write in flight, e.g. by state store
    maintenance, which may go on after the query stopped) excluded."""
    files, size, changelogs = 0, 0, 0
    for p in folder.rglob("*"):
        if p.name.startswith(".") or p.name.endswith(".crc"):
            continue
        try:
            if not p.is_file():
                continue
            size += p.stat().st_size
        except FileNotFoundError:  # renamed or deleted meanwhile
            continue
        files += 1
        changelogs += p.name.endswith(".changelog")
    return files, size, changelogs
