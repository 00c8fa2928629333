"""``dstl node`` (one aggregator node) and ``dstl up`` (every node of a topology here)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

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
    address_file: Path | None = typer.Option(None, help="Write the bound endpoint here."),
    base_path: str = typer.Option("", help="Override the topology's base_path."),
) -> None:
    """Run one aggregator node (blocking; stops on SIGTERM/SIGINT)."""
    from aggregator.process import run_node
    from topology.config import TopologyError, load_topology

    try:
        topo = load_topology(topology, base_path=base_path or None)
        tree = topo.tree()
    except TopologyError as e:
        raise typer.BadParameter(str(e), param_hint="--topology") from e
    if node_id not in tree:
        raise typer.BadParameter(f"node {node_id!r} is not in {topology}", param_hint="--node-id")
    specs = {n.id: n for n in topo.nodes or []}
    endpoint = bind or specs[node_id].bind
    parent_id = tree.parent(node_id)
    if not parent and parent_id is not None:
        parent = specs[parent_id].bind
        if parent == "auto":
            raise typer.BadParameter(
                f"parent {parent_id!r} binds 'auto': give --parent", param_hint="--parent"
            )
    endpoint = "tcp://127.0.0.1:0" if endpoint == "auto" else endpoint
    run_node(topo, node_id, tree.depth(node_id), endpoint, parent or None, address_file)


def up(
    topology: Path = typer.Option(..., exists=True, dir_okay=False, help="Topology YAML."),
    base_path: str = typer.Option("", help="Override the topology's base_path."),
) -> None:
    """Start every node of the topology on this machine (root first) until Ctrl-C."""
    from rich.console import Console
    from rich.table import Table

    from aggregator.launcher import start_tree
    from topology.config import TopologyError, load_topology

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
    console.print(f"address files in {running.workdir}: "
                  f"dstl status --topology {topology} --workdir {running.workdir}")  # fmt: skip
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        running.stop()
