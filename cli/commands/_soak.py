"""``dstl bench soak``: node processes serving steady writers for minutes while one node
a minute is restarted (dstltree/bench/soak.py); each minute every node and task process
is sampled; printed as tables, optionally written as JSON and as the "Soak" section of
BENCHMARKS.md."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["soak"]


def soak(
    minutes: Annotated[int, typer.Option(min=1, help="Minutes to run.")] = 30,
    seed: Annotated[int, typer.Option(help="Seed of the restart schedule.")] = 7,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Also write the report as JSON here.")
    ] = None,
    markdown: Annotated[
        Path | None,
        typer.Option(help="Replace (or append) the 'Soak' section of this markdown file."),
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Directory for the nodes and the store (default: TMPDIR).")
    ] = None,
    minute_s: Annotated[
        float, typer.Option("--minute-s", min=0.5, hidden=True, help="Seconds a minute (tests).")
    ] = 60.0,
) -> None:
    """Nodes restarted for minutes, watched for leaks.

    Runs 16 writers in 4 task processes through 7 node processes (a DAG) with
    checkpoints every 0.3 s, a shared state registry deleting what no retained
    checkpoint references, and one node (the root included) stopped with SIGTERM or
    SIGKILL and restarted every minute. Prints per minute the RSS, descriptors and
    threads of every node and task process, the objects in the store, persist p50/p99,
    failed persists and restarts; at the end a verdict per process and metric (flat:
    the last minute within 10 % of minute 5) and the orphans. Exit code 1 when an object
    a retained checkpoint references is missing or an orphan survived the sweep."""
    from rich.console import Console
    from rich.table import Table

    from dstltree.bench.hotpath import run_meta, write_markdown
    from dstltree.bench.soak import (
        HEADERS,
        ROLE_NOTE,
        VERDICT_HEADERS,
        SoakSettings,
        markdown_section,
        minute_cells,
        run_soak,
        summary_lines,
        verdict_rows,
    )

    command = f"dstl bench soak --minutes {minutes} --seed {seed}"
    if minute_s != 60.0:
        command += f" --minute-s {minute_s:g}"
    meta = run_meta(command)
    err = Console(stderr=True)
    if not err.is_terminal:  # a log file: a minute's line on one line
        err.width = max(err.width, 180)
    err.print(f"soak: {minutes} minute(s) of {minute_s:g} s...")
    report = run_soak(
        SoakSettings(minutes=minutes, minute_s=minute_s, seed=seed),
        str(workdir) if workdir else None,
        progress=lambda row: err.print(" | ".join(minute_cells(row))),
    )
    out = Console()
    if not out.is_terminal:  # a log file: the tables keep their rows on one line
        out.width = max(out.width, 180)
    table = Table(
        title=f"dstl bench soak (commit {meta['commit']}, {meta['date']})", caption=ROLE_NOTE
    )
    for h in HEADERS:
        table.add_column(h)
    for r in report.minutes:
        table.add_row(*minute_cells(r))
    out.print(table)
    verdicts = Table(title="verdicts (baseline -> last minute)")
    for h in VERDICT_HEADERS:
        verdicts.add_column(h)
    for row in verdict_rows(report):
        verdicts.add_row(*row)
    out.print(verdicts)
    for line in summary_lines(report):
        out.print(line)
    if json_file is not None:
        json_file.write_text(json.dumps({"meta": meta, **report.to_dict()}, indent=2) + "\n")
    if markdown is not None:
        write_markdown(markdown, markdown_section(report, meta, os.cpu_count() or 0), "Soak")
        err.print(f"wrote the 'Soak' section of {markdown}")
    if report.missing_objects or report.orphans_after_sweep:
        raise typer.Exit(1)
