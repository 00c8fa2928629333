"""``dstl node`` (one aggregator node) and ``dstl up`` (every node of a topology here)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import typer


def register(app: typer.Typer) -> None:
    app.command("node")(node)
    app.command("up")(up)


def node(
    topology: Path = typer.Option(..., exists=True, dir_okay=False, help="Topology YAML."),
    node_id: str = typer.Option(..., help="This node's id in the topology."),
    bind: str = typer.Option(
        "", help="ZeroMQ endpoint (default: the topology's; 'auto' = free loopback port)."
    ),
    parent: str = typer.Option("", help="The parent's endpoint (needed when its bind is 'auto')."),
    depth: int | None = typer.Option(
        None, min=0, help="Depth below the root (default: from the topology's tree)."
    ),
    address_file: Path | None = typer.Option(None, help="Write the bound endpoint here."),
    base_path: str = typer.Option("", help="Override the topology's base_path."),
    exit_with_pid: int | None = typer.Option(None, help="Stop when this process is gone."),
    stats_file: Path | None = typer.Option(None, help="Final statistics (JSON) at exit."),
    snapshot_file: Path | None = typer.Option(None, help="Statistics (JSON) on SIGUSR1."),
    no_plans: bool = typer.Option(False, help="Forward hop by hop (no plans)."),
) -> None:
    """Run one aggregator node (blocking; stops on SIGTERM/SIGINT). The one entry point
    of a node process: supervisors run it, and so do ``dstl up`` and the launchers."""
    from dstltree.aggregator.process import run_node
    from dstltree.topology.config import TopologyError, load_topology

    try:
        topo = load_topology(
            topology, base_path=base_path or None, plans=False if no_plans else None
        )
    except TopologyError as e:
        raise typer.BadParameter(str(e), param_hint="--topology") from e
    if depth is None:
        depth, bind, parent = _place(topo, topology, node_id, bind, parent)
    endpoint = "tcp://127.0.0.1:0" if bind in ("", "auto") else bind
    run_node(
        topo,
        node_id,
        depth,
        endpoint,
        parent or None,
        address_file,
        exit_with_pid,
        stats_file,
        snapshot_file,
    )


def _place(topo: Any, topology: Path, node_id: str, bind: str, parent: str) -> tuple[int, str, str]:
    """(depth, bind, parent endpoint) of ``node_id`` from the topology's explicit nodes."""
    from dstltree.topology.config import TopologyError

    try:
        tree = topo.tree()
    except TopologyError as e:
        raise typer.BadParameter(
            f"{e}; or give --depth and --parent", param_hint="--topology"
        ) from e
    if node_id not in tree:
        raise typer.BadParameter(f"node {node_id!r} is not in {topology}", param_hint="--node-id")
    specs = {n.id: n for n in topo.nodes or []}
    parent_id = tree.parent(node_id)
    if not parent and parent_id is not None:
        parent = specs[parent_id].bind
        if parent == "auto":
            raise typer.BadParameter(
                f"parent {parent_id!r} binds 'auto': give --parent", param_hint="--parent"
            )
    return tree.depth(node_id), bind or specs[node_id].bind, parent


def up(
    topology: Path = typer.Option(..., exists=True, dir_okay=False, help="Topology YAML."),
    base_path: str = typer.Option("", help="Override the topology's base_path."),
) -> None:
    """Start every node of the topology on this machine (root first) until Ctrl-C."""
    from rich.console import Console
    from rich.table import Table

    from dstltree.aggregator.launcher import start_tree
    from dstltree.topology.config import TopologyError, load_topology

    try:
        topo = load_topology(topology, base_path=base_path or None)
    except TopologyError as e:
        raise typer.BadParameter(str(e), param_hint="--topology") from e
    running = start_tree(topo, topology, base_path=base_path or None)
    table = Table(title=f"dstltree nodes ({topology})")
    for col in ("node", "parent", "address", "pid"):
        table.add_column(col)
    for nid in running.tree.nodes:
        h = running.nodes[nid]
        table.add_row(nid, running.tree.parent(nid) or "-", h.address, str(h.pid))
    console = Console()
    console.print(table)
    console.print(
        f"address files in {running.workdir}: "
        f"dstl status --topology {topology} --workdir {running.workdir}"
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        running.stop()
