"""``dstl bench backpressure``: aligned against unaligned checkpoints in a keyed job
slowed on one task (dstltree/bench/backpressure.py), printed as JSON and as a table,
optionally written as a section of BENCHMARKS.md."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["backpressure"]


def backpressure(
    sleeps: Annotated[
        str, typer.Option(help="Comma-separated ms per record slept on task 0.")
    ] = "0,0.01,0.1",
    seconds: Annotated[float, typer.Option(min=2.0, help="Seconds per run.")] = 20.0,
    tasks: Annotated[int, typer.Option(min=2, help="Tasks of the job.")] = 4,
    interval: Annotated[float, typer.Option(min=0.05, help="Checkpoint interval, s.")] = 0.3,
    records: Annotated[int, typer.Option(min=1000, help="Records of the input.")] = 3_000_000,
    repeats: Annotated[
        int, typer.Option(min=1, help="Runs per mode and sleep, in the order A B B A.")
    ] = 2,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures as JSON here.")
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option(help="Replace (or append) this benchmark's section here.")
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Directory for the input and the jobs (default: TMPDIR).")
    ] = None,
) -> None:
    """Checkpoint durations under back-pressure.

    Aligned and unaligned checkpoints (FLIP-76) of a keyed job whose function sleeps
    on one task, side by side at each sleep."""
    from rich.console import Console

    from dstltree.bench.backpressure import (
        SECTION,
        BackpressureSettings,
        markdown_section,
        run_backpressure,
    )
    from dstltree.bench.hotpath import run_meta, write_markdown
    from dstltree.sparkplug.spark_session import spark_session

    try:
        sleeps_ms = tuple(float(x) for x in sleeps.split(",") if x.strip())
    except ValueError as e:
        raise typer.BadParameter(f"--sleeps {sleeps!r}: {e}") from e
    if not sleeps_ms or min(sleeps_ms) < 0:
        raise typer.BadParameter("--sleeps: one or more values >= 0")
    settings = BackpressureSettings(
        sleeps_ms=sleeps_ms,
        seconds=seconds,
        parallelism=tasks,
        checkpoint_interval=interval,
        records=records,
        repeats=repeats,
    )
    meta = run_meta(
        f"dstl bench backpressure --sleeps {sleeps} --seconds {seconds:g} --tasks {tasks} "
        f"--interval {interval:g} --records {records} --repeats {repeats}"
    )
    console = Console(stderr=True)
    spark = spark_session(f"local[{tasks}]", "dstl-bench-backpressure")
    try:
        with tempfile.TemporaryDirectory(prefix="dstl-bp-", dir=workdir) as tmp:
            doc = run_backpressure(spark, Path(tmp), settings, progress=console.print)
    finally:
        spark.stop()
    doc["meta"] = meta
    text = json.dumps(doc, indent=2)
    typer.echo(text)
    section = markdown_section(doc, meta)
    console.print(section)
    if json_file is not None:
        json_file.write_text(text + "\n")
    if markdown is not None:
        write_markdown(markdown, section, SECTION)
        console.print(f"wrote the '{SECTION}' section of {markdown}")
