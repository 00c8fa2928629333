"""``dstl bench chaos``: nodes killed hard and restarted, or stopped for a while, under
writers, for a DAG and a tree (dstltree/bench/chaos.py), printed as a table, optionally
written as JSON and as the "Chaos" section of BENCHMARKS.md."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from dstltree.bench.chaos import ChaosSettings

__all__ = ["chaos"]


def chaos(
    seconds: Annotated[
        float, typer.Option(min=1.0, help="Seconds per case (three cases run).")
    ] = 120.0,
    seed: Annotated[int, typer.Option(help="Seed of the fault schedule.")] = 7,
    faults: Annotated[
        str,
        typer.Option(
            help="Faults chosen at random per event, comma-separated: kills, stops, "
            "partitions, oneway (the last two put every node on a host of its own: "
            "network namespaces, as root)."
        ),
    ] = "kills,stops",
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures as JSON here.")
    ] = None,
    markdown: Annotated[
        Path | None,
        typer.Option(help="Replace (or append) the 'Chaos' section of this markdown file."),
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Directory for the nodes and stores (default: TMPDIR).")
    ] = None,
    spare_root: Annotated[
        bool, typer.Option(help="Faults on the nodes below the root only.")
    ] = False,
    one_at_a_time: Annotated[
        bool,
        typer.Option(help="A fault only while no other lasts (default: they may overlap)."),
    ] = False,
) -> None:
    """Nodes killed or stopped under writers.

    Every 1-2 s a random node (the root included) is killed hard and restarted, or
    stopped (SIGSTOP) for 1-5 s, or (network faults) its host cut off for 1-10 s, or
    one direction to its parent dropped for 1-10 s, under 16 writers, for a DAG with
    two nodes per writer and for a tree with one; beside the DAG without faults. Prints
    persist latencies (p99 against the run without faults), the faults and how soon a
    faulty node was left, changes lost, duplicated or out of order, missing handle
    objects, direct DFS writes, failovers and orphans before and after the sweep. Exit
    code 1 when a change was lost, duplicated or reordered or an object is missing."""
    from rich.console import Console
    from rich.table import Table

    from dstltree.bench.chaos import run_chaos
    from dstltree.bench.chaos_report import HEADERS, markdown_section, table_rows
    from dstltree.bench.hotpath import run_meta, write_markdown

    settings = _settings(seconds, seed, faults, spare_root, one_at_a_time)
    kinds = settings.faults
    meta = run_meta(
        f"dstl bench chaos --seconds {seconds:g} --seed {seed} --faults {','.join(kinds)}"
        + (" --spare-root" if spare_root else "")
        + (" --one-at-a-time" if one_at_a_time else "")
    )
    console = Console(stderr=True)
    results = run_chaos(
        settings,
        str(workdir) if workdir else None,
        progress=lambda name: console.print(f"case {name} ({seconds:g} s)..."),
    )
    table = Table(title=f"dstl bench chaos (commit {meta['commit']}, {meta['date']})")
    for h in HEADERS:
        table.add_column(h)
    for row in table_rows(results):
        table.add_row(*row)
    Console().print(table)
    if json_file is not None:
        doc = {"meta": meta, "cases": [r.figures() for r in results]}
        json_file.write_text(json.dumps(doc, indent=2) + "\n")
    if markdown is not None:
        section = _section(settings)
        text = markdown_section(results, meta, os.cpu_count() or 0, section)
        write_markdown(markdown, text, section)
        console.print(f"wrote the 'Chaos' section of {markdown}")
    if any(r.lost or r.duplicated or r.out_of_order or r.missing_objects for r in results):
        raise typer.Exit(1)


def _settings(
    seconds: float, seed: int, faults: str, spare_root: bool, one_at_a_time: bool
) -> ChaosSettings:
    """The run's settings from the options; typer.BadParameter for unknown faults, or
    network faults where no namespaces can be made."""
    from dstltree.bench.chaos import ChaosSettings, parse_faults

    try:
        kinds = parse_faults(faults)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--faults") from None
    settings = ChaosSettings(
        seconds=seconds, seed=seed, faults=kinds, spare_root=spare_root, overlap=not one_at_a_time
    )
    if settings.netns:
        from dstltree.bench.netns import unavailable

        why = unavailable()
        if why is not None:
            raise typer.BadParameter(
                f"partitions and oneway need network namespaces: {why}", param_hint="--faults"
            )
    return settings


def _section(settings: ChaosSettings) -> str:
    """The BENCHMARKS.md section a run writes: one per kind of run."""
    from dstltree.bench.chaos_report import NET_SECTION, SECTION

    return (
        (NET_SECTION if settings.netns else SECTION)
        + (", root spared" if settings.spare_root else "")
        + (", one at a time" if not settings.overlap else "")
    )
