"""``dstl node`` (one aggregator node) and ``dstl up`` (every node of a topology here)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from dstltree.cli.commands._common import TOPOLOGY_HELP, topology_file

if TYPE_CHECKING:
    from dstltree.aggregator.workdirs import WorkdirOwner
    from dstltree.topology.config import TopologyConfig


def register(app: typer.Typer) -> None:
    app.command("node")(node)
    app.command("up")(up)


def node(
    topology: Path = typer.Option(..., help=TOPOLOGY_HELP, callback=topology_file),
    node_id: str = typer.Option(..., help="This node's id in the topology."),
    bind: str = typer.Option(
        "", help="ZeroMQ endpoint (default: the topology's; 'auto' = free loopback port)."
    ),
    advertise: str = typer.Option(
        "", help="Endpoint others connect to (default: the topology's, else from --bind)."
    ),
    parent: list[str] = typer.Option(
        [],
        help="A parent's endpoint; repeat for a DAG's further parents, in order of "
        "preference (default: the parents' advertised endpoints in the topology).",
    ),
    depth: int | None = typer.Option(
        None, min=0, help="Depth below the root (default: from the topology's tree)."
    ),
    address_file: Path | None = typer.Option(None, help="Write the advertised endpoint here."),
    base_path: str = typer.Option("", help="Override the topology's base_path."),
    exit_with_pid: int | None = typer.Option(None, help="Stop when this process is gone."),
    stats_file: Path | None = typer.Option(None, help="Final statistics (JSON) at exit."),
    snapshot_file: Path | None = typer.Option(None, help="Statistics (JSON) on SIGUSR1."),
    no_plans: bool = typer.Option(False, help="Forward hop by hop (no plans)."),
    respawn_pid_file: Path | None = typer.Option(
        None,
        help="Run the node as a child and start it again when it dies without being "
        "asked to; this file holds the running node's PID (SIGTERM it to stop both).",
    ),
    remove_dir: Path | None = typer.Option(
        None,
        file_okay=False,
        help="A directory deleted when the node stops for good (with --respawn-pid-file: "
        "when the respawner ends): the work directory a launcher made for it, with its "
        "topology copy, key files and statistics.",
    ),
) -> None:
    """Run one aggregator node until SIGTERM or SIGINT.

    The one entry point of a node process (blocking): supervisors run it, and so do
    dstl up and the launchers.

    On a host of a cluster, 'dstl node --topology F --node-id ID' takes the node's
    bind and advertised endpoint, its parent's advertised endpoint and its depth from
    the topology; --bind, --advertise, --parent and --depth override.

    CURVE is on unless the topology says 'security: {curve: false}': the cluster key
    directory comes from $DSTL_KEYS or security.keys (exit 2 naming security.keys
    when neither names one)."""
    with _removed_at_exit(remove_dir) as owner:
        if respawn_pid_file is not None:
            _respawn(respawn_pid_file, exit_with_pid, () if owner is None else (owner.fileno(),))
        given = _Given(bind, advertise, tuple(parent), depth)
        files = _NodeFiles(address_file, stats_file, snapshot_file)
        _run(topology, node_id, given, base_path, no_plans, exit_with_pid, files)


@dataclass(frozen=True)
class _NodeFiles:
    """Where a node writes its advertised endpoint, its final statistics and its
    statistics on SIGUSR1 (None: not written)."""

    address: Path | None
    stats: Path | None
    snapshot: Path | None


def _run(
    topology: Path,
    node_id: str,
    given: _Given,
    base_path: str,
    no_plans: bool,
    exit_with_pid: int | None,
    files: _NodeFiles,
) -> None:
    """Run the node in this process until SIGTERM/SIGINT (see :func:`node`)."""
    from dstltree.aggregator.process import node_security, run_node
    from dstltree.cli.commands._common import exit_topology_error
    from dstltree.topology.config import TopologyError, load_topology

    try:
        topo = load_topology(
            topology, base_path=base_path or None, plans=False if no_plans else None
        )
    except TopologyError as e:
        exit_topology_error(e, "--topology")
    place = _place(topo, topology, node_id, given)
    try:  # CURVE (the default): the key directory of $DSTL_KEYS or security.keys
        security = node_security(topo, str(topology))
    except TopologyError as e:
        exit_topology_error(e, "--topology")
    assert place.depth is not None  # _place gives the depth or refuses
    endpoint = "tcp://127.0.0.1:0" if place.bind in ("", "auto") else place.bind
    run_node(
        topo,
        node_id,
        place.depth,
        endpoint,
        place.parent,
        files.address,
        exit_with_pid,
        files.stats,
        files.snapshot,
        advertise=place.advertise or None,
        security=security,
    )


@contextlib.contextmanager
def _removed_at_exit(directory: Path | None) -> Iterator[WorkdirOwner | None]:
    """Delete ``directory`` (and what is in it) when the block ends, however it ends;
    meanwhile this process owns it (``dstltree.aggregator.workdirs``), so that after a
    SIGKILL whoever starts nodes on the host next deletes it. Yields the owner (None
    without a directory, or when it cannot be owned)."""
    from dstltree.aggregator.workdirs import own_workdir

    owner = None if directory is None else own_workdir(directory)
    try:
        yield owner
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        if owner is not None:
            owner.release()


def _respawn(pid_file: Path, exit_with_pid: int | None, owner_fds: tuple[int, ...]) -> None:
    """Be the node's respawner (dstltree.aggregator.respawn): this command without
    ``--respawn-pid-file`` runs as the node, started again after each death. The node
    inherits ``owner_fds`` (the work directory's owner lock: the directory stays owned
    while the node runs, even if this respawner is SIGKILLed)."""
    import sys

    from dstltree.aggregator.respawn import STOPPED, respawn

    args, skip = [], False
    for a in sys.argv[1:]:  # the node gets neither: the respawner keeps the file and dir
        if skip or a.startswith(("--respawn-pid-file=", "--remove-dir=")):
            skip = False
            continue
        if a in ("--respawn-pid-file", "--remove-dir"):
            skip = True
            continue
        args.append(a)
    cmd = [sys.executable, "-m", "dstltree.cli", *args]
    code = respawn(cmd, pid_file, exit_with_pid, pass_fds=owner_fds)
    raise typer.Exit(0 if code in STOPPED else 1)


@dataclass(frozen=True)
class _Given:
    """Where a node runs: bind and advertised endpoints ("" = none), the parents'
    endpoints in order of preference (() = none), depth."""

    bind: str
    advertise: str
    parent: tuple[str, ...]
    depth: int | None


def _place(topo: TopologyConfig, topology: Path, node_id: str, given: _Given) -> _Given:
    """``given`` completed from the topology's listed nodes (explicit or from ``hosts``):
    the node's bind and advertised endpoint, its parent's advertised endpoint, its
    depth. A branching topology places nodes at run time: --depth (and --parent below
    the root) are needed. Raises typer.BadParameter naming the node and the field."""
    from dstltree.topology.config import TopologyError
    from dstltree.topology.endpoints import derive_advertise

    try:
        tree = topo.tree()
    except TopologyError as e:
        if given.depth is not None:
            return given
        raise typer.BadParameter(
            f"{e}; or give --depth and --parent", param_hint="--topology"
        ) from e
    if node_id not in tree:
        raise typer.BadParameter(f"node {node_id!r} is not in {topology}", param_hint="--node-id")
    spec = topo.spec(node_id)
    parent = given.parent or _topology_parents(topo, node_id, tree.parents(node_id))
    advertise = given.advertise or spec.advertised or ""
    if given.bind and given.bind != spec.bind and not given.advertise:
        try:  # another bind than the topology's: advertise what it names
            advertise = derive_advertise(given.bind, spec.host) or ""
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--bind") from e
    depth = tree.depth(node_id) if given.depth is None else given.depth
    return _Given(given.bind or spec.bind, advertise, parent, depth)


def _topology_parents(topo: TopologyConfig, node_id: str, ids: tuple[str, ...]) -> tuple[str, ...]:
    """The advertised endpoints of ``ids`` (the node's parents in order of preference);
    further parents without one are left out. Raises typer.BadParameter when the
    first parent has none."""
    out = tuple(e for i in ids if (e := topo.advertised(i)))
    if ids and topo.advertised(ids[0]) is None:
        k = [n.id for n in topo.nodes or ()].index(ids[0])
        raise typer.BadParameter(
            f"node {node_id!r}: its parent {ids[0]!r} has no advertised endpoint "
            f"(nodes[{k}].bind is {topo.spec(ids[0]).bind!r}, no nodes[{k}].advertise): "
            "give --parent",
            param_hint="--parent",
        )
    return out


def up(
    name: Path | None = typer.Argument(
        None,
        help=f"{TOPOLOGY_HELP} The same as --topology.",
        callback=topology_file,
        show_default=False,
        metavar="TOPOLOGY",
    ),
    topology: Path | None = typer.Option(None, help=TOPOLOGY_HELP, callback=topology_file),
    base_path: str = typer.Option("", help="Override the topology's base_path."),
) -> None:
    """Start every node of a topology on this machine.

    Root first, until Ctrl-C: a development tree. A topology by host starts here only
    when its hosts are loopback addresses (127.0.0.x standing for machines), each node
    bound to its host; other hosts are refused (run 'dstl node --topology F
    --node-id ID' on each host)."""
    from rich.console import Console
    from rich.table import Table

    from dstltree.aggregator.launcher import start_tree
    from dstltree.cli.commands._common import exit_topology_error
    from dstltree.topology.config import TopologyError, load_topology

    if (name is None) == (topology is None):
        raise typer.BadParameter("give one topology: a name (dstl up local) or --topology FILE")
    topology = name if topology is None else topology
    assert topology is not None
    try:
        topo = load_topology(topology, base_path=base_path or None)
        running = start_tree(topo, topology, base_path=base_path or None)
        running.supervise()  # a node that dies is started again
    except TopologyError as e:
        exit_topology_error(e, "--topology")
    table = Table(title=f"dstltree nodes ({topology})")
    for col in ("node", "parents", "address", "pid"):
        table.add_column(col)
    for nid in running.tree.nodes:
        h = running.nodes[nid]
        table.add_row(nid, ", ".join(running.tree.parents(nid)) or "-", h.address, str(h.pid))
    console = Console()
    console.print(table)
    if running.keys is not None:  # CURVE: clients need writer.key_secret and node.key
        console.print(f"CURVE keys in {running.keys.directory} (clients: writer.key_secret)")
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
