"""``dstl plan``: the plan a cluster would get (issue 3): which nodes are writer nodes,
their expected object sizes and every node's route, for a given change rate."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["register"]


def _skew(text: str | None) -> tuple[float, float]:
    if text is None:
        return 0.0, 1.0
    try:
        frac, factor = (float(x) for x in text.split(":"))
    except ValueError:
        raise typer.BadParameter(
            f"--skew: expected FRACTION:FACTOR (e.g. 0.1:10), got {text!r}"
        ) from None
    if not 0 <= frac <= 1 or factor < 0:
        raise typer.BadParameter("--skew: FRACTION in [0, 1], FACTOR >= 0")
    return frac, factor


def plan_command(
    topology: Annotated[Path, typer.Argument(help="Topology YAML.", exists=True, dir_okay=False)],
    bytes_per_executor: Annotated[
        str, typer.Option(help="Changed bytes per executor per checkpoint, e.g. 1MiB.")
    ],
    skew: Annotated[
        str | None,
        typer.Option(
            help="FRACTION:FACTOR: that fraction of executors (spread evenly over the "
            "breadth-first order) changes FACTOR times as much."
        ),
    ] = None,
    executors: Annotated[
        int | None, typer.Option(help="Executors, for a topology given by branching.")
    ] = None,
    target_object_bytes: Annotated[
        str | None, typer.Option(help="Override the topology's target object size.")
    ] = None,
    down: Annotated[str | None, typer.Option(help="Comma-separated node ids to exclude.")] = None,
    routes: Annotated[
        bool | None, typer.Option(help="Print every node's route (default: only for <= 64 nodes).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print which nodes write, the expected object sizes and the routes of a plan
    (DESIGN.md, "The plan")."""
    from rich.console import Console
    from rich.table import Table

    from sparkplug.commands.simulate import parse_size
    from topology.config import TopologyError, load_topology
    from topology.plan import compute_plan

    try:
        topo = load_topology(topology)
        tree = topo.tree(executors)
    except TopologyError as e:
        raise typer.BadParameter(str(e)) from None
    per_exec = parse_size(bytes_per_executor)
    target = (
        parse_size(target_object_bytes) if target_object_bytes else int(topo.target_object_bytes)
    )
    frac, factor = _skew(skew)
    nodes = tree.nodes
    hot = set()
    if frac > 0:
        k = math.ceil(frac * len(nodes))
        hot = {nodes[int(j * len(nodes) / k)] for j in range(k)}
    own = {n: per_exec * (factor if n in hot else 1.0) for n in nodes}
    dead = [d.strip() for d in down.split(",")] if down else []
    try:
        plan = compute_plan(tree, own, target, plan_window=topo.plan_window, down=dead)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    writers = plan.expected_object_bytes()
    routed: dict[str, list[str]] = {w: [] for w in writers}
    for n, w in plan.routes().items():
        routed[w].append(n)
    total = sum(writers.values())
    objects = sum(max(1, math.ceil(b / target)) for b in writers.values())
    if as_json:
        out: dict[str, Any] = {
            "target_object_bytes": target,
            "nodes": len(plan.nodes),
            "total_bytes": total,
            "writers": {
                w: {"expected_bytes": b, "nodes": len(routed[w])} for w, b in writers.items()
            },
            "objects_per_checkpoint": objects,
            "routes": plan.routes(),
        }
        typer.echo(json.dumps(out, indent=2))
        return
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    t = Table(
        title=f"writer nodes ({len(writers)} of {len(plan.nodes)} live nodes, "
        f"target {target / 2**20:.2f} MiB)"
    )
    for col in ("writer", "depth", "nodes routed", "expected bytes/checkpoint", "objects"):
        t.add_column(col, justify="left" if col == "writer" else "right")
    for w, b in writers.items():
        t.add_row(
            w,
            str(tree.depth(w)),
            str(len(routed[w])),
            f"{b / 2**20:.2f} MiB",
            str(max(1, math.ceil(b / target))),
        )
    console.print(t)
    console.print(
        f"total {total / 2**20:.2f} MiB per checkpoint -> about {objects} objects "
        f"per checkpoint, mean {total / max(objects, 1) / 2**20:.2f} MiB"
    )
    if routes or (routes is None and len(plan.nodes) <= 64):
        rt = Table(title="routes")
        for col in ("node", "parent", "own bytes", "residual", "writes", "writer"):
            rt.add_column(col)
        for n, p in plan.nodes.items():
            rt.add_row(
                n,
                tree.parent(n) or "-",
                f"{own[n] / 2**20:.2f} MiB",
                f"{p.residual_bytes / 2**20:.2f} MiB",
                "yes" if p.writes else "",
                p.writer,
            )
        console.print(rt)


def register(app: typer.Typer) -> None:
    """Add ``dstl plan`` to ``app``."""
    app.command("plan")(plan_command)
