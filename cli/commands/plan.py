"""``dstl plan``: the plan a cluster would get: which nodes are writer nodes,
their expected object sizes and every node's route, for a given change rate."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dstltree.cli.commands._common import (
    TOPOLOGY_HELP,
    echo_json,
    load_tree,
    parse_size,
    target_bytes,
    topology_file,
    wide_console,
)

if TYPE_CHECKING:
    from rich.console import Console

    from dstltree.topology.plan import TreePlan
    from dstltree.topology.tree import Tree

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
    topology: Annotated[Path, typer.Argument(help=TOPOLOGY_HELP, callback=topology_file)],
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
    """Print which nodes write, object sizes and routes.

    The plan of the topology: the nodes that write objects, the expected object sizes
    and the nodes' routes (docs/design.md, "The plan")."""
    from dstltree.topology.plan import compute_plan

    topo, tree = load_tree(topology, executors)
    per_exec = parse_size(bytes_per_executor)
    target = target_bytes(target_object_bytes, topo)
    own = _own_bytes(tree.nodes, per_exec, *_skew(skew))
    dead = [d.strip() for d in down.split(",")] if down else []
    try:
        plan = compute_plan(tree, own, target, plan_window=topo.plan_window, down=dead)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if as_json:
        echo_json(_plan_json(plan, target))
        return
    console = wide_console(160)
    _print_writers(console, plan, tree, target)
    if routes or (routes is None and len(plan.nodes) <= 64):
        _print_routes(console, plan, tree, own)


def _own_bytes(nodes: Sequence[str], per_exec: int, frac: float, factor: float) -> dict[str, float]:
    """Bytes per checkpoint of each node's own executor: ``per_exec``, times ``factor``
    for the hot fraction ``frac`` of the nodes (spread evenly over ``nodes``, the
    breadth-first order)."""
    hot = set()
    if frac > 0:
        k = math.ceil(frac * len(nodes))
        hot = {nodes[int(j * len(nodes) / k)] for j in range(k)}
    return {n: per_exec * (factor if n in hot else 1.0) for n in nodes}


def _objects(nbytes: float, target: int) -> int:
    """Objects a writer node holding ``nbytes`` per checkpoint writes (at least one)."""
    return max(1, math.ceil(nbytes / target))


def _routed(plan: TreePlan) -> dict[str, list[str]]:
    """Writer node id -> ids of the nodes routed to it (itself included)."""
    routed: dict[str, list[str]] = {w: [] for w in plan.expected_object_bytes()}
    for n, w in plan.routes().items():
        routed[w].append(n)
    return routed


def _plan_json(plan: TreePlan, target: int) -> dict[str, Any]:
    """The ``--json`` document: sizes in bytes per checkpoint, routes node -> writer."""
    writers = plan.expected_object_bytes()
    routed = _routed(plan)
    return {
        "target_object_bytes": target,
        "nodes": len(plan.nodes),
        "total_bytes": sum(writers.values()),
        "writers": {w: {"expected_bytes": b, "nodes": len(routed[w])} for w, b in writers.items()},
        "objects_per_checkpoint": sum(_objects(b, target) for b in writers.values()),
        "routes": plan.routes(),
    }


def _print_writers(console: Console, plan: TreePlan, tree: Tree, target: int) -> None:
    """The writer nodes table (sizes in MiB) and the per-checkpoint total line."""
    from rich.table import Table

    writers = plan.expected_object_bytes()
    routed = _routed(plan)
    total = sum(writers.values())
    objects = sum(_objects(b, target) for b in writers.values())
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
            str(_objects(b, target)),
        )
    console.print(t)
    console.print(
        f"total {total / 2**20:.2f} MiB per checkpoint -> about {objects} objects "
        f"per checkpoint, mean {total / max(objects, 1) / 2**20:.2f} MiB"
    )


def _print_routes(console: Console, plan: TreePlan, tree: Tree, own: dict[str, float]) -> None:
    """Every live node's parent, own bytes and residual (MiB per checkpoint), whether it
    writes and its writer node."""
    from rich.table import Table

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
            p.collector,
        )
    console.print(rt)


def register(app: typer.Typer) -> None:
    """Add ``dstl plan`` to ``app``."""
    app.command("plan")(plan_command)
