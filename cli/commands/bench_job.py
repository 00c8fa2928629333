"""``dstl bench-job``: records per second through a job on the public API with the
changelog and with the minimal changelog, in one run (dstltree.bench.job)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from dstltree.cli.commands._common import TOPOLOGY_HELP, check_topology, topology_file

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("bench-job")(bench_job)


def bench_job(
    files: Annotated[int, typer.Option(min=1, help="Input Parquet files.")] = 50,
    per_file: Annotated[int, typer.Option(min=1, help="Records per file.")] = 10000,
    keys: Annotated[int, typer.Option(min=1, help="Distinct keys.")] = 5000,
    parallelism: Annotated[int, typer.Option(min=1, max=128, help="Tasks.")] = 4,
    topology: Annotated[Path, typer.Option(help=TOPOLOGY_HELP, callback=topology_file)] = Path(
        "local"
    ),
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[4]",
    workdir: Annotated[Path, typer.Option(help="Input, checkpoints and sinks.")] = Path(
        "data/bench-job"
    ),
    rounds: Annotated[int, typer.Option(min=1, help="Alternating rounds of both runs.")] = 2,
) -> None:
    """Job throughput with the changelog and the minimal one.

    Runs the same job with the changelog and with the minimal changelog, alternating
    after one uncounted warm-up run, and prints records per second (wall and steady)
    and the ratio of the best steady rates (JSON)."""
    from dstltree.bench.job import run_one, write_input
    from dstltree.sparkplug.spark_session import spark_session

    if not topology.exists():
        raise typer.BadParameter(f"topology file {topology} not found", param_hint="--topology")
    check_topology(topology)
    records = write_input(workdir / "in", files, per_file, keys)
    spark = spark_session(master, app="dstl-bench-job")
    results = []
    try:  # a first run warms Spark's Python workers up; it is not counted
        run_one(spark, workdir, "warm-up", topology, parallelism, False)
        for _ in range(rounds):
            results.append(run_one(spark, workdir, "changelog", topology, parallelism, True))
            results.append(run_one(spark, workdir, "minimal", topology, parallelism, False))
    finally:
        spark.stop()
    best = {
        name: max(r.steady_records_per_second for r in results if r.name == name)
        for name in ("changelog", "minimal")
    }
    out = {
        "records": records,
        "parallelism": parallelism,
        "runs": [asdict(r) for r in results],
        "best_steady_records_per_second": best,
        "ratio_changelog_to_minimal": round(best["changelog"] / best["minimal"], 3),
    }
    typer.echo(json.dumps(out, indent=2))
