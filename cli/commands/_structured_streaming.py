"""``dstl bench structured-streaming``: the same Structured Streaming query with and
without the tree, side by side (dstltree/bench/structured_streaming.py)."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from dstltree.bench.structured_streaming import SsBenchSettings, SsRun

__all__ = ["structured_streaming", "table_rows"]

WIDTH = 132  # columns of the printed table at least
COLUMNS = (
    "engine",
    "P",
    "batches",
    "files/batch",
    "KiB/batch",
    "changelogs",
    "p50 s",
    "p99 s",
    "records/s",
    "trigger held",
    "tree objects",
    "written/batch",
)


def _partitions(text: str) -> tuple[int, ...]:
    """The shuffle partition counts of ``--partitions`` (comma list of ints >= 1)."""
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise typer.BadParameter(f"comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"integers >= 1, got {text!r}")
    return values


def table_rows(runs: list[SsRun]) -> list[tuple[str, ...]]:
    """One row per run, in :data:`COLUMNS` order: files and KiB per batch under the
    checkpoint location, ``*.changelog`` files there, batch duration p50/p99 (s),
    records/s, whether every batch started within the held factor of the trigger
    (with the fraction that did), objects the tree wrote per batch (total), and files
    written per batch in all (under the checkpoint plus the tree's objects)."""

    def num(x: float, fmt: str) -> str:
        return "-" if math.isnan(x) else format(x, fmt)

    rows: list[tuple[str, ...]] = []
    for r in runs:
        f = r.figures
        held = "-" if math.isnan(f.held) else f"{'yes' if f.held == 1 else 'no'} {f.held:.0%}"
        objects = (
            "-" if r.engine == "spark" else f"{r.tree_objects / f.batches:.2f} ({r.tree_objects})"
        )
        rows.append(
            (
                r.engine,
                str(r.partitions),
                str(f.batches),
                f"{f.checkpoint_files / f.batches:.1f}",
                f"{f.checkpoint_bytes / f.batches / 1024:.1f}",
                str(f.changelog_files),
                num(f.batch_p50_s, ".3f"),
                num(f.batch_p99_s, ".3f"),
                num(f.records_per_s, ".0f"),
                held,
                objects,
                f"{(f.checkpoint_files + r.tree_objects) / f.batches:.1f}",
            )
        )
    return rows


def _title(s: SsBenchSettings) -> str:
    model = s.dfs_model if s.scale == 1 else f"{s.dfs_model} x{s.scale:g}"
    where = f"local[{s.cores}]" if not s.hosts else f"{s.hosts} worker hosts x {s.cores} cores"
    return (
        f"structured streaming: {s.batches} batches of {s.rows} rows over {s.keys} keys, "
        f"trigger {s.trigger_s * 1000:.0f} ms (held: every start within "
        f"{s.held_factor:g}x), {where}, RocksDB changelog, DFS model {model}, "
        f"maintenance every {s.maintenance_s:g} s, "
        f"tree persist delay {s.persist_delay_s:g} s, p50/p99/held without the first "
        f"{s.warmup} batch(es)"
    )


def structured_streaming(
    partitions: Annotated[
        str, typer.Option(help="Shuffle partition counts, comma-separated.")
    ] = "4,200",
    dfs_model: Annotated[
        str,
        typer.Option(
            help="Latency model of Spark's checkpoint location and the tree's DFS: "
            "flip158-s3 | none (any topology.latency model)."
        ),
    ] = "none",
    scale: Annotated[float, typer.Option(min=0.001, help="Latencies times this.")] = 1.0,
    batches: Annotated[int, typer.Option(min=1, help="Input files, one per batch.")] = 20,
    rows: Annotated[int, typer.Option(min=1, help="Rows per input file.")] = 2000,
    keys: Annotated[int, typer.Option(min=1, help="Distinct keys.")] = 1000,
    trigger: Annotated[
        float, typer.Option(min=0.01, help="Trigger interval (s); files land at it.")
    ] = 0.3,
    cores: Annotated[
        int, typer.Option(min=1, help="Cores: local[N], or of each worker host with --hosts.")
    ] = 4,
    hosts: Annotated[
        int,
        typer.Option(
            min=0,
            max=8,
            help="0: local[N]; else a standalone cluster of this many worker hosts, each "
            "with its own node and bridge, the driver on a third host.",
        ),
    ] = 0,
    engines: Annotated[
        str, typer.Option(help="Some of spark, tree (state files only), dstl (a dstl:// location).")
    ] = "spark,tree,dstl",
    persist_delay: Annotated[
        float, typer.Option(min=0.0, help="The tree's persist delay (s).")
    ] = 0.05,
    warmup: Annotated[
        int, typer.Option(min=0, help="First batches left out of p50/p99 and held.")
    ] = 1,
    maintenance: Annotated[
        float,
        typer.Option(min=0.1, help="State maintenance interval (s): snapshots every 10 versions."),
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the input and the latencies.")] = 0,
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds per run at most.")] = 900.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead.")] = False,
) -> None:
    """Structured Streaming: Spark, tree, dstl://.

    The same query, groupBy(k).agg(count, sum) over files landing over time, RocksDB with changelog
    checkpointing, one run per engine and partition count: files and bytes under the
    checkpoint per batch, batch duration p50/p99, records/s, whether the trigger was
    held, the tree's objects."""
    from rich.console import Console
    from rich.table import Table

    from dstltree.bench.structured_streaming import ENGINES, SsBenchSettings, run_ss_bench

    chosen = tuple(e.strip() for e in engines.split(",") if e.strip())
    if not chosen or any(e not in ENGINES for e in chosen):
        raise typer.BadParameter(
            f"some of {', '.join(ENGINES)}, got {engines!r}", param_hint="--engines"
        )
    try:
        settings = SsBenchSettings(
            partitions=_partitions(partitions),
            batches=batches,
            rows=rows,
            keys=keys,
            trigger_s=trigger,
            dfs_model=dfs_model,
            scale=scale,
            seed=seed,
            cores=cores,
            timeout_s=timeout,
            persist_delay_s=persist_delay,
            warmup=warmup,
            maintenance_s=maintenance,
            hosts=hosts,
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    console = Console(stderr=True)
    runs = run_ss_bench(
        settings, chosen, progress=None if as_json else lambda m: console.print(f"running {m}...")
    )
    if as_json:
        doc = {"settings": asdict(settings), "runs": [r.to_dict() for r in runs]}
        typer.echo(_json(doc))
        return
    table = Table(title=_title(settings))
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "engine" else "right")
    for row in table_rows(runs):
        table.add_row(*row)
    wide = Console(width=max(WIDTH, Console().width))  # 12 columns: never squeezed
    wide.print(table)
    for r in runs:
        for who, counts in (("Spark's", r.spark_requests), ("the tree's", r.tree_requests)):
            per = ", ".join(f"{k} {n / r.figures.batches:.2f}" for k, n in counts.items() if n)
            if per:
                wide.print(f"{r.engine} P={r.partitions}: {who} requests per batch: {per}")
        if r.critical_per_batch is not None:
            wide.print(
                f"{r.engine} P={r.partitions}: PUTs on a batch's critical path: "
                f"{r.critical_per_batch:.2f} (sources' log, offsets, commit with the state)"
            )


def _json(doc: dict[str, Any]) -> str:
    """``doc`` as JSON, NaN as null."""
    from dstltree.bench.report import to_json

    return to_json(doc, indent=1)
