"""``dstl status``: a live table of a running tree from the nodes' Prometheus metrics;
with ``--coordinator URL`` the job's checkpoints and materializations below it from the
coordinator's metrics (cli/commands/_status_job.py), or alone without ``--topology``.

Where each node's ``/metrics`` is found, first match wins:

1. ``--endpoints``: URLs, comma-separated or repeated; ``NODE=URL`` names the node,
   a plain URL goes to the next node in breadth-first order;
2. ``--workdir``: the address files ``<node>.addr`` that ``start_tree`` (``dstl up``,
   the local demo) writes, whose second line is the metrics URL;
3. the topology's ``metrics_port``: node k (breadth-first) on ``--host``:base + k.

A node that does not answer (or answers garbage) is shown as down.
"""

from __future__ import annotations

import math
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dstltree.cli.commands._common import topology_file

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from rich.table import Table

__all__ = ["NodeRow", "endpoints_for", "p99_from_buckets", "register", "scrape"]


def register(app: typer.Typer) -> None:
    app.command("status")(status)


def scrape(url: str, timeout: float = 1.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of one ``/metrics`` page. Raises OSError or
    ValueError when the node does not answer or the text is not Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def p99_from_buckets(buckets: list[tuple[float, float]], q: float = 0.99) -> float | None:
    """The ``q`` quantile of a histogram from its cumulative ``(upper bound, count)``
    buckets (``+Inf`` included), interpolating linearly inside the bucket that holds
    it (as Prometheus' histogram_quantile). None without observations; the largest
    finite bound if the quantile falls in the ``+Inf`` bucket. Same unit as the bounds."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


@dataclass(frozen=True)
class NodeRow:
    """One node of the table; ``up`` False when its metrics could not be read. Bytes in
    bytes, latency in seconds (None: no uploads yet)."""

    node_id: str
    parent: str | None
    depth: int
    url: str | None
    up: bool
    role: str = "-"
    queued_bytes: float = 0.0
    objects_written: float = 0.0
    bytes_relayed: float = 0.0
    p99_latency_s: float | None = None
    errors: float = 0.0


def endpoints_for(
    nodes: list[str],
    metrics_port: int | None,
    endpoints: list[str] | None = None,
    workdir: Path | None = None,
    host: str = "127.0.0.1",
) -> dict[str, str | None]:
    """Node id (breadth-first order) -> metrics URL or None (unknown)."""
    out: dict[str, str | None] = dict.fromkeys(nodes)
    if endpoints:
        plain = iter(nodes)
        for item in (e.strip() for arg in endpoints for e in arg.split(",")):
            if not item:
                continue
            name, sep, url = item.partition("=")
            if sep and not name.startswith(("http:", "https:")):
                if name not in out:
                    raise typer.BadParameter(f"unknown node {name!r}", param_hint="--endpoints")
                out[name] = url
            else:
                nid = next(plain, None)
                if nid is None:
                    raise typer.BadParameter("more URLs than nodes", param_hint="--endpoints")
                out[nid] = item
        return out
    if workdir is not None:
        for nid in nodes:
            f = workdir / f"{nid}.addr"
            lines = f.read_text().splitlines() if f.exists() else []
            out[nid] = lines[1] if len(lines) > 1 else None
        return out
    if metrics_port is None or metrics_port == 0:
        why = "is not set" if metrics_port is None else "is 0 (free ports)"
        raise typer.BadParameter(
            f"the topology's metrics_port {why}: give --workdir or --endpoints",
            param_hint="--topology",
        )
    h = f"[{host}]" if ":" in host else host
    return {nid: f"http://{h}:{metrics_port + k}/metrics" for k, nid in enumerate(nodes)}


def _value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    return sum(v for _, v in samples.get(name, []))


def node_row(
    node_id: str, parent: str | None, depth: int, url: str | None, timeout: float
) -> NodeRow:
    """Scrape one node; down (not an exception) when it cannot be read."""
    if url is None:
        return NodeRow(node_id, parent, depth, url, up=False)
    try:
        s = scrape(url, timeout)
    except (OSError, ValueError):
        return NodeRow(node_id, parent, depth, url, up=False)
    buckets = [
        (float(labels["le"]), v)
        for labels, v in s.get("dstl_dfs_request_latency_seconds_bucket", [])
        if "le" in labels
    ]
    if parent is None:
        role = "root"
    elif _value(s, "dstl_writes_for_window") >= 1:
        role = "writer"
    else:
        role = "forwarder"
    return NodeRow(
        node_id,
        parent,
        depth,
        url,
        up=True,
        role=role,
        queued_bytes=_value(s, "dstl_queued_bytes"),
        objects_written=_value(s, "dstl_objects_written_total"),
        bytes_relayed=_value(s, "dstl_bytes_relayed_total"),
        p99_latency_s=p99_from_buckets(buckets),
        errors=_value(s, "dstl_dfs_errors_total"),
    )


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def render(rows: list[NodeRow], title: str) -> Table:
    """The rich table of ``rows`` (tree order, node ids indented by depth)."""
    from rich.table import Table

    table = Table(title=title)
    for col, justify in (
        ("node", "left"),
        ("parent", "left"),
        ("role", "left"),
        ("queued", "right"),
        ("objects", "right"),
        ("relayed", "right"),
        ("p99 upload", "right"),
        ("errors", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        name = "  " * r.depth + r.node_id
        if not r.up:
            table.add_row(name, r.parent or "-", "[red]down[/red]", *["-"] * 5)
            continue
        p99 = "-" if r.p99_latency_s is None else f"{r.p99_latency_s * 1000:.0f} ms"
        errors = f"[red]{r.errors:.0f}[/red]" if r.errors else "0"
        table.add_row(
            name,
            r.parent or "-",
            r.role,
            _bytes(r.queued_bytes),
            f"{r.objects_written:.0f}",
            _bytes(r.bytes_relayed),
            p99,
            errors,
        )
    return table


def _nodes_view(
    topology: Path,
    executors: int | None,
    endpoints: list[str] | None,
    workdir: Path | None,
    host: str,
    timeout: float,
) -> tuple[Callable[[str], Table], ThreadPoolExecutor]:
    """The function drawing the nodes' table (its title ending in the time given) and
    the pool scraping them (shut it down when done); exits 2 for a bad topology."""
    from concurrent.futures import ThreadPoolExecutor

    from dstltree.cli.commands._common import exit_topology_error
    from dstltree.topology.config import TopologyError, load_topology

    try:
        topo = load_topology(topology)
        tree = topo.tree(executors)
    except TopologyError as e:
        exit_topology_error(e, "--topology")
    nodes = tree.nodes
    urls = endpoints_for(nodes, topo.metrics_port, endpoints, workdir, host)
    pool = ThreadPoolExecutor(max(1, min(32, len(nodes))), thread_name_prefix="dstl-status")

    def table(when: str) -> Table:
        rows = list(
            pool.map(lambda n: node_row(n, tree.parent(n), tree.depth(n), urls[n], timeout), nodes)
        )
        down = sum(not r.up for r in rows)
        return render(
            rows, f"dstltree {topology.name}: {len(rows) - down}/{len(rows)} nodes up{when}"
        )

    return table, pool


def status(
    topology: Annotated[
        Path | None,
        typer.Option(
            help="Topology: a shipped name (local, s3, ...) or a YAML file (optional with"
            " --coordinator or --bridges).",
            callback=topology_file,
        ),
    ] = None,
    watch: Annotated[float, typer.Option(min=0.1, help="Seconds between refreshes.")] = 2.0,
    once: Annotated[bool, typer.Option(help="Print the table once and exit.")] = False,
    endpoints: Annotated[
        list[str] | None,
        typer.Option(help="Metrics URLs (NODE=URL or plain, breadth-first), comma-separated."),
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(file_okay=False, help="Directory of the nodes' address files (dstl up)."),
    ] = None,
    host: Annotated[str, typer.Option(help="Host of the nodes for metrics_port.")] = "127.0.0.1",
    executors: Annotated[
        int | None, typer.Option(help="Executors, for a topology given by branching.")
    ] = None,
    timeout: Annotated[float, typer.Option(min=0.05, help="Seconds to wait per node.")] = 1.0,
    coordinator: Annotated[
        str | None,
        typer.Option(help="The job coordinator's metrics URL: checkpoints and materializations."),
    ] = None,
    bridges: Annotated[
        bool, typer.Option(help="This host's Structured Streaming bridges and their queries.")
    ] = False,
    bridge: Annotated[
        list[Path] | None,
        typer.Option(help="A bridge's Unix socket (implies --bridges; repeat for more)."),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the bridges and queries once as JSON.")
    ] = False,
) -> None:
    """Show a running tree and its job's checkpoints.

    Every node of the tree: role (root / writer for the current plan window /
    forwarder), queued bytes, objects written, bytes relayed, p99 DFS upload latency
    and upload errors, from each node's Prometheus metrics.

    With --coordinator, the job's checkpoints (completed and aborted, in flight,
    the interval achieved and the duration p50 / p99, the phases, completion-path
    requests and metadata size per checkpoint) and materializations below, or alone
    without --topology.

    With --bridges (or --bridge SOCKET), the Structured Streaming bridges of this host
    (those running dstl bridge or started by configure()) and the queries they serve:
    last batch, commits, objects written per batch, held bytes and the state files
    Spark wrote as plain files because no bridge answered. --json prints them once."""
    from rich.console import Console, Group
    from rich.live import Live

    from dstltree.cli.commands._status_bridges import bridge_statuses, bridges_view
    from dstltree.cli.commands._status_job import job_table

    bridges = bridges or bool(bridge) or json_out
    if topology is None and coordinator is None and not bridges:
        raise typer.BadParameter(
            "give --topology, --coordinator, --bridges or several", param_hint="--topology"
        )
    if json_out:
        import json

        typer.echo(json.dumps({"bridges": bridge_statuses(bridge or [], timeout)}, indent=2))
        return
    nodes_table, pool = (
        (None, None)
        if topology is None
        else _nodes_view(topology, executors, endpoints, workdir, host, timeout)
    )

    def view() -> Any:
        when = time.strftime(" at %H:%M:%S")
        parts: list[Any] = [] if nodes_table is None else [nodes_table(when)]
        if coordinator is not None:
            parts.append(job_table(coordinator, timeout, "" if parts else when))
        if bridges:
            parts.append(
                bridges_view(bridge_statuses(bridge or [], timeout), "" if parts else when)
            )
        return parts[0] if len(parts) == 1 else Group(*parts)

    console = Console()
    try:
        if once:
            console.print(view())
            return
        with Live(view(), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(watch)
                live.update(view(), refresh=True)
    except KeyboardInterrupt:
        pass
    finally:
        if pool is not None:
            pool.shutdown(wait=False)
