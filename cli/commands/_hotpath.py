"""``dstl bench hotpath``: the hot-path suite (each figure against its floor, in one
run), printed as a table, optionally written as JSON and as the "Hot path" section of
BENCHMARKS.md."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["hotpath"]


def _command(
    seconds: float,
    restore_changes: int,
    small_change_bytes: int,
    demo_records: int,
    forward_dir: Path | None = None,
) -> str:
    """The command line that reproduces a run with these settings."""
    line = (
        f"dstl bench hotpath --seconds {seconds:g} --restore-changes {restore_changes} "
        f"--small-change-bytes {small_change_bytes} --demo-records {demo_records}"
    )
    return line if forward_dir is None else f"{line} --forward-dir {forward_dir}"


def hotpath(
    seconds: Annotated[
        float,
        typer.Option(
            min=0.05,
            help="Seconds per throughput figure (the task loop and each latency pair get "
            "twice that); the default run takes about 1.5 minutes.",
        ),
    ] = 6.0,
    restore_changes: Annotated[
        int, typer.Option(min=1000, help="Changes logged for the restore figure.")
    ] = 300_000,
    small_change_bytes: Annotated[
        int, typer.Option(min=100, help="Bytes of 100-byte changes in one checkpoint.")
    ] = 1_000_000,
    demo_records: Annotated[
        int,
        typer.Option(min=100, help="Flights of the demo replayed for the restore against 9a5af1e."),
    ] = 336_776,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Also write the figures as JSON here.")
    ] = None,
    markdown: Annotated[
        Path | None,
        typer.Option(
            help="Replace (or append) the 'Hot path' section of this markdown file, "
            "e.g. BENCHMARKS.md."
        ),
    ] = None,
    forward_dir: Annotated[
        Path | None,
        typer.Option(
            help="Directory for the forwarding figures' stores (default: the workdir), "
            "e.g. /dev/shm to take the disk's fsync bandwidth out of them."
        ),
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Directory for the temporary stores (default: TMPDIR).")
    ] = None,
) -> None:
    """The changelog's hot path against its floors.

    Measures the hot path next to its floors in one run and prints the ratios: task loop
    with / without the changelog, node and chain forwarding / a raw pyzmq hop, persist
    latency / one round trip plus one fsynced write, restore by replay / snapshot-only,
    restore / the replay of 9a5af1e, zstd-compressed / uncompressed segment bytes."""
    from rich.console import Console

    from dstltree.bench.hotpath import (
        HotpathSettings,
        markdown_section,
        print_figures,
        run_hotpath,
        run_meta,
        to_json,
        write_markdown,
    )

    settings = HotpathSettings(
        seconds,
        restore_changes,
        small_change_bytes,
        demo_records,
        str(forward_dir) if forward_dir else None,
    )
    meta = run_meta(
        _command(seconds, restore_changes, small_change_bytes, demo_records, forward_dir)
    )
    console = Console(stderr=True)
    figures = run_hotpath(
        settings,
        str(workdir) if workdir else None,
        progress=lambda name: console.print(f"measuring {name}..."),
    )
    print_figures(figures, f"dstl bench hotpath (commit {meta['commit']}, {meta['date']})")
    if json_file is not None:
        json_file.write_text(to_json(figures, settings, meta) + "\n")
    if markdown is not None:
        write_markdown(markdown, markdown_section(figures, meta, os.cpu_count() or 0))
        console.print(f"wrote the 'Hot path' section of {markdown}")
