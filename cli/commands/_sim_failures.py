"""``dstl simulate --node-failures-per-hour R``: a tree and a DAG of the same cluster,
each without and with node failures (dstltree/simulations/failures.py), as a table or
JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from dstltree.cli.commands._common import echo_json, wide_console

if TYPE_CHECKING:
    from dstltree.simulations.cluster import SimResult
    from dstltree.simulations.config import SimConfig

__all__ = ["failure_rows", "run_failures"]

_COLUMNS = (
    "layout",
    "node failures",
    "deaths",
    "p50",
    "p99",
    "p999",
    "p99 vs none",
    "direct writes",
    "failovers",
    "late acks",
)


def failure_rows(runs: dict[str, dict[str, SimResult]]) -> list[dict[str, Any]]:
    """One row per layout and case: percentiles in ms, the p99 over the same layout's
    run without failures, the writers' direct writes, client failovers, late acks."""
    rows = []
    for layout, cases in runs.items():
        calm = cases["without"].checkpoint_ms["p99"]
        for case, r in cases.items():
            ms = r.checkpoint_ms
            rows.append(
                {
                    "layout": layout,
                    "case": case,
                    "node_failures_per_hour": r.node_failures_per_hour,
                    "restart_s": r.restart_s,
                    "node_deaths": r.node_deaths,
                    **{k: round(ms[k], 1) for k in ("p50", "p99", "p999")},
                    "p99_vs_without": round(ms["p99"] / calm, 3) if calm else None,
                    "fallback_segments": r.fallback_segments,
                    "failovers": r.failovers,
                    "late_acks": r.late_acks,
                }
            )
    return rows


def run_failures(base: SimConfig, designs: list[str], as_json: bool) -> None:
    """Compare a tree and a DAG of ``base`` with and without its node failures for each
    tree design of ``designs``; print a table per design, or JSON keyed by design."""
    from dataclasses import replace

    from dstltree.simulations.failures import compare_layouts
    from dstltree.topology.designs import TREE_DESIGNS

    chosen = [d for d in designs if d in TREE_DESIGNS]
    if not chosen:
        raise typer.BadParameter(
            "node failures need a tree design (tree, tree-noplan)", param_hint="--design"
        )
    out = {d: failure_rows(compare_layouts(replace(base, design=d))) for d in chosen}
    if as_json:
        echo_json(out)
        return
    for design, rows in out.items():
        _print(design, base, rows)


def _print(design: str, base: SimConfig, rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    t = Table(
        title=f"dstl simulate, node failures ({design}; checkpoint latency in ms): "
        f"{base.node_failures_per_hour:g} per node-hour, back after {base.restart_s:g} s, "
        f"noticed after {base.failure_detection_s:g} s"
    )
    for col in _COLUMNS:
        t.add_column(col, justify="left" if col == "layout" else "right")
    for r in rows:
        t.add_row(
            r["layout"],
            "yes" if r["case"] == "with" else "no",
            str(r["node_deaths"]),
            *(f"{r[k]:.0f}" for k in ("p50", "p99", "p999")),
            f"{r['p99_vs_without']:.2f}x" if r["p99_vs_without"] is not None else "-",
            str(r["fallback_segments"]),
            str(r["failovers"]),
            str(r["late_acks"]),
        )
    wide_console(160).print(t)
