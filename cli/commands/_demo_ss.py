"""``dstl demo --engine structured-streaming``: run dstltree.demo.ss_job, write and
print its report (the default engine's rows where they apply)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from dstltree.cli.commands.demo import _figures, _verdict


def run_and_report(
    console: Any,
    opts: Any,
    shuffle_partitions: int,
    report: Path,
    hosts: int = 0,
    location: str = "files",
) -> None:
    """Run the demo on the Structured Streaming engine with ``opts`` (a DemoOptions),
    write the JSON report to ``report`` and print the summary. Raises typer.BadParameter
    for options the engine does not take, typer.Exit(2) when the run id's folder holds
    files (no --fresh), typer.Exit(1) when a check fails."""
    from dstltree.demo.job import RunExistsError
    from dstltree.demo.ss_job import LOCATIONS, passed, run_ss_demo, unsupported

    if location not in LOCATIONS:
        raise typer.BadParameter(
            f"{location!r}: one of {', '.join(LOCATIONS)}", param_hint="--checkpoint-location"
        )
    bad = unsupported(opts, location)
    if bad == ["dfs_faults"]:
        raise typer.BadParameter(
            "only with --checkpoint-location dstl (Spark writes a files location itself)",
            param_hint="--dfs-faults",
        )
    if bad:
        flags = ", ".join("--" + b.replace("_", "-") for b in bad)
        raise typer.BadParameter(f"{flags}: not with this engine", param_hint="--engine")
    console.print(f"this run's files: {opts.prefix()}/")
    try:
        result = run_ss_demo(
            opts, shuffle_partitions, progress=console.print, hosts=hosts, location=location
        )
    except RunExistsError as e:
        console.print(f"[red]{e}")
        raise typer.Exit(2) from e
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(result, indent=2) + "\n")
    console.print(summary(result))
    console.print(f"report written to {report}")
    if not passed(result):
        raise typer.Exit(1)


def summary(r: dict[str, Any]) -> Any:
    """The report as a rich Table."""
    from rich.table import Table

    t = Table(title="dstltree demo --engine structured-streaming", show_header=True)
    t.add_column("measure")
    t.add_column("value", justify="right")
    rows = [
        ("records", f"{r['records']:,}"),
        ("source files", str(r["source_files"])),
        (
            "master / shuffle partitions / nodes",
            f"{r['master']} / {r['shuffle_partitions']} / {r['nodes']}",
        ),
        ("batches completed (checkpoints)", str(r["checkpoints_completed"])),
        ("batch duration p50 / p99 (ms)", _figures(r["batch_duration_ms"])),
        (
            f"batch interval p50 / p99 (ms), trigger {r['trigger_interval_s']} s",
            _figures(r["batch_interval_ms"]),
        ),
        ("checkpoint location", str(r.get("location"))),
        (
            "files in the checkpoint location / per batch",
            f"{r['checkpoint_files']} / {r['checkpoint_files_per_batch']}",
        ),
        ("plain files (on a file system)", str(r.get("plain_files"))),
        ("state files left there", _state_files(r["state_files"])),
        ("driver killed", _killed(r["killed"])),
        ("recoveries", str(r["recoveries"])),
        ("objects written / per batch", f"{r['objects_written']} / {r['objects_per_batch']}"),
        (
            "manifests written / per batch",
            f"{r.get('manifests_written')} / {r.get('manifests_per_batch')}",
        ),
        ("sink rows / duplicates", f"{r['sink_rows']:,} / {r['sink_duplicate_rows']}"),
        ("state matches batch", _verdict(r["state_matches_batch"], r)),
        ("sink matches batch", _verdict(r["sink_matches_batch"], r)),
        ("orphans / missing objects", f"{r['orphans']} / {r['missing']}"),
        ("run prefix", str(r["run_prefix"])),
        ("wall time (s)", str(r["wall_s"])),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def _state_files(counts: dict[str, int]) -> str:
    """``2 .sst, 1 .zip``: the kinds present, or ``none``."""
    return ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "none"


def _killed(k: dict[str, Any] | None) -> str:
    if not k:
        return "-"
    mid = " (a batch in flight)" if k["mid_batch"] else ""
    return f"pid {k['pid']} after {k['after_batches']} batches{mid}"
