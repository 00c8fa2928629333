"""``dstl bench materialization``: large keyed state without stopping the task
(dstltree/bench/materialization.py), printed as JSON, optionally written as the
"Materialization" section of BENCHMARKS.md."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["materialization"]


def materialization(
    large_keys: Annotated[int, typer.Option(min=1, help="Keys of the large case.")] = 1_000_000,
    small_keys: Annotated[int, typer.Option(min=1, help="Keys of the small case.")] = 10_000,
    updates: Annotated[int, typer.Option(min=1, help="Records of the measured run.")] = 1_200_000,
    rate: Annotated[
        float, typer.Option(min=1.0, help="Records per second of the measured run.")
    ] = 20_000.0,
    seed: Annotated[int, typer.Option(help="Seed of the inputs.")] = 7,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures as JSON here.")
    ] = None,
    markdown: Annotated[
        Path | None,
        typer.Option(help="Replace (or append) the 'Materialization' section of this file."),
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Directory for inputs and jobs (default: TMPDIR).")
    ] = None,
) -> None:
    """Checkpoints and materializations of a keyed job.

    With 10,000 and 1,000,000 keys per task: the longest gap between two batches a task
    processed, checkpoint percentiles, materialization figures; the bytes a materialization
    writes when 1 % of the keys changed; records per second with and without checkpoints on
    the FLIP-158 S3 model; a killed task's recovery and the orphans left."""
    from rich.console import Console

    from dstltree.bench.hotpath import run_meta, write_markdown
    from dstltree.bench.materialization import (
        MaterializationSettings,
        markdown_section,
        run_materialization,
    )
    from dstltree.sparkplug.spark_session import spark_session

    settings = MaterializationSettings(
        small_keys=small_keys, large_keys=large_keys, updates=updates, steady_rate=rate, seed=seed
    )
    meta = run_meta(
        f"dstl bench materialization --large-keys {large_keys} --small-keys {small_keys} "
        f"--updates {updates} --rate {rate:g} --seed {seed}"
    )
    console = Console(stderr=True)
    spark = spark_session("local[2]", "dstl-bench-materialization")
    try:
        with tempfile.TemporaryDirectory(prefix="dstl-mat-", dir=workdir) as tmp:
            doc = run_materialization(
                spark, Path(tmp), settings, progress=lambda n: console.print(f"{n}...")
            )
    finally:
        spark.stop()
    doc["meta"] = meta
    text = json.dumps(doc, indent=2)
    typer.echo(text)
    if json_file is not None:
        json_file.write_text(text + "\n")
    if markdown is not None:
        write_markdown(markdown, markdown_section(doc, meta), "Materialization")
        console.print(f"wrote the 'Materialization' section of {markdown}")
