"""``dstl bridge``: the structured-streaming bridge of this host (a Unix socket
server between Spark's checkpoint file manager and the host's aggregator node)."""

from __future__ import annotations

from pathlib import Path

import typer

from dstltree.cli.commands._common import TOPOLOGY_HELP, topology_file


def register(app: typer.Typer) -> None:
    app.command("bridge")(bridge)


def bridge(
    topology: Path = typer.Option(..., help=TOPOLOGY_HELP, callback=topology_file),
    socket: Path | None = typer.Option(
        None, help="Unix socket (default: /tmp/dstltree-UID/bridge.sock)."
    ),
    node: list[str] = typer.Option(
        [], help="The host's node endpoint; repeat for fallbacks (none: write to DFS)."
    ),
    base_path: str = typer.Option("", help="Override the topology's base_path."),
    ack_timeout: float = typer.Option(10.0, help="Seconds before a write goes to DFS."),
    metrics_port: int | None = typer.Option(
        None, help="Serve Prometheus metrics on this port (0: a free one)."
    ),
    metrics_host: str = typer.Option("127.0.0.1", help="Address of the metrics endpoint."),
) -> None:
    """Serve Spark state files into the tree.

    Prints 'bridge ready on SOCKET' once it serves."""
    from dstltree.structured_streaming.bridge import (
        BridgeInUse,
        bridge_from_topology,
        default_socket_path,
        serve,
    )

    try:
        b = bridge_from_topology(
            topology, socket or default_socket_path(), node, base_path, ack_timeout
        )
        serve(b, metrics_port, metrics_host)
    except BridgeInUse as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
