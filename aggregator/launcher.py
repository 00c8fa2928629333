"""Starting the nodes of a topology on this machine, root first (``dstl up``, the local
demo, the tests). Each node is a separate process stopped by its PID."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dstltree.aggregator.ports import stable_port
from dstltree.aggregator.supervisor import NodeSupervisor
from dstltree.aggregator.workdirs import (
    TREE_WORKDIR_PREFIX,
    WorkdirOwner,
    own_workdir,
    sweep_stale_workdirs,
)
from dstltree.security.curve import Curve
from dstltree.security.keys import ClusterKeys, generate_key_dir, load_key_dir
from dstltree.security.settings import KEYS_ENV, SecuritySettings, cluster_keys_for_nodes
from dstltree.topology.config import NodeSpec, TopologyConfig
from dstltree.topology.endpoints import is_loopback, is_wildcard, split_tcp, tcp_endpoint
from dstltree.topology.tree import TopologyError, Tree


@dataclass
class NodeHandle:
    node_id: str
    depth: int
    address: str
    process: subprocess.Popen[bytes]
    metrics_url: str | None = None  # http://host:port/metrics, None when not served
    stats_file: Path | None = None  # final statistics, written on SIGTERM
    snapshot_file: Path | None = None  # statistics written on SIGUSR1

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL the node (chaos tests)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@dataclass
class LocalTree:
    """The running nodes of a topology, by node id; ``keys``: the cluster keys they
    use (None: plaintext, the topology says ``security.curve: false``)."""

    topology: TopologyConfig
    tree: Tree
    nodes: dict[str, NodeHandle] = field(default_factory=dict)
    workdir: Path | None = None
    keys: ClusterKeys | None = None
    topology_file: Path | None = None  # what start_tree started them from (restart)
    base_path: str | None = None
    plans: bool = True
    supervisor: NodeSupervisor | None = None  # restarts dead nodes (supervise())
    remove_workdir: bool = False  # stop() deletes workdir (its key files included)
    owner: WorkdirOwner | None = None  # held while workdir is to be deleted (workdirs.py)
    # node id -> command prefix it runs under (e.g. ``ip netns exec NS``: its own host)
    prefixes: dict[str, list[str]] = field(default_factory=dict)

    @property
    def client_security(self) -> Curve | None:
        """What a client of these nodes passes as ``security`` (writer keys)."""
        return None if self.keys is None else Curve.for_writer(self.keys)

    def address(self, node_id: str) -> str:
        return self.nodes[node_id].address

    def metrics_url(self, node_id: str) -> str | None:
        """The node's metrics URL (topology ``metrics_port``), or None."""
        return self.nodes[node_id].metrics_url

    def parent_addresses(self, node_id: str) -> tuple[str, ...]:
        """The running endpoints of ``node_id``'s parents, in order of preference."""
        return tuple(self.nodes[p].address for p in self.tree.parents(node_id))

    def restart(self, node_id: str, timeout: float = 30.0) -> NodeHandle:
        """Start node ``node_id`` again after it died (or kill it first): same id,
        depth, endpoint and parents, so that its children and writers reconnect to
        it. Raises RuntimeError unless the tree was started by :func:`start_tree`."""
        old = self.nodes[node_id]
        old.kill()
        return self.start_node(node_id, old.address, timeout)

    def start_node(self, node_id: str, bind: str, timeout: float = 30.0) -> NodeHandle:
        """Start node ``node_id`` of this tree bound to ``bind``, with its parents'
        running endpoints, and hold its handle. Raises RuntimeError unless the tree was
        started by :func:`start_tree`."""
        if self.workdir is None or self.topology_file is None:
            raise RuntimeError("this tree was not started by start_tree")
        h = start_node_process(
            self.topology_file,
            node_id,
            self.tree.depth(node_id),
            self.parent_addresses(node_id),
            self.workdir,
            bind=bind,
            base_path=self.base_path,
            exit_with_pid=os.getpid(),
            timeout=timeout,
            plans=self.plans,
            keys_dir=None if self.keys is None else self.keys.directory,
            prefix=self.prefixes.get(node_id, ()),
        )
        self.nodes[node_id] = h
        return h

    def supervise(self, interval: float = 0.2) -> NodeSupervisor:
        """Restart every node that dies from now on until :meth:`stop`
        (:class:`~dstltree.aggregator.supervisor.NodeSupervisor`, polled every
        ``interval`` seconds)."""
        if self.supervisor is None:
            self.supervisor = NodeSupervisor(self, interval).start()
        return self.supervisor

    def stop(self, timeout: float = 10.0) -> None:
        """Stop restarting nodes, then SIGTERM every node (leaves first), SIGKILL after
        ``timeout`` seconds; then delete the work directory if :attr:`remove_workdir`."""
        if self.supervisor is not None:
            self.supervisor.stop()
        stop_nodes(self.tree, self.nodes, timeout)
        if self.remove_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self.owner is not None:
            self.owner.release()

    def __enter__(self) -> LocalTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_nodes(tree: Tree, nodes: dict[str, NodeHandle], timeout: float) -> None:
    """SIGTERM the node processes (leaves first), SIGKILL those still running after
    ``timeout`` seconds. Blocking."""
    for node_id in tree.post_order():
        h = nodes.get(node_id)
        if h is not None and h.process.poll() is None:
            h.process.terminate()
    deadline = time.monotonic() + timeout
    for h in nodes.values():
        try:
            h.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            h.kill()


def start_node_process(
    topology_file: Path,
    node_id: str,
    depth: int,
    parent: str | Sequence[str] | None,
    workdir: Path,
    bind: str = "tcp://127.0.0.1:0",
    base_path: str | None = None,
    exit_with_pid: int | None = None,
    timeout: float = 30.0,
    plans: bool = True,
    keys_dir: Path | None = None,
    respawn_pid_file: Path | None = None,
    remove_workdir: bool = False,
    prefix: Sequence[str] = (),
) -> NodeHandle:
    """Start ``python -m aggregator`` and wait (at most ``timeout`` s) for its address
    file (advertised endpoint, then metrics URL when the topology sets ``metrics_port``).
    ``parent``: the parent's endpoint, or the parents' in order of preference.
    The node writes its final statistics to ``workdir/<node_id>.stats.json`` on SIGTERM
    and a snapshot to ``workdir/<node_id>.snapshot.json`` on SIGUSR1. ``keys_dir``: the
    cluster key directory, passed in ``$DSTL_KEYS`` (never on the command line; it wins
    over the topology's ``security.keys``). ``respawn_pid_file``: the node is started
    again whenever it dies (dstltree.aggregator.respawn); the handle's process is the
    respawner, the file holds the running node's PID. ``remove_workdir``: the node's
    process deletes ``workdir`` when it stops for good (a directory of its own).
    ``prefix``: a command the node runs under, which must exec it (its PID is the
    node's), e.g. ``ip netns exec NS`` for a host of its own (dstltree.bench.netns)."""
    addr_file = workdir / f"{node_id}.addr"
    addr_file.unlink(missing_ok=True)
    cmd = [
        *prefix,
        sys.executable,
        "-m",
        "dstltree.cli",
        "node",
        "--topology",
        str(topology_file),
        "--node-id",
        node_id,
        "--depth",
        str(depth),
        "--bind",
        bind,
        "--address-file",
        str(addr_file),
    ]
    for endpoint in [parent] if isinstance(parent, str) else parent or ():
        cmd += ["--parent", endpoint]  # in order of preference
    if base_path:
        cmd += ["--base-path", base_path]
    if exit_with_pid:
        cmd += ["--exit-with-pid", str(exit_with_pid)]
    if not plans:
        cmd += ["--no-plans"]
    if respawn_pid_file is not None:  # the process is the respawner; the file has the node
        cmd += ["--respawn-pid-file", str(respawn_pid_file)]
    if remove_workdir:
        cmd += ["--remove-dir", str(workdir)]
    stats_file = workdir / f"{node_id}.stats.json"
    snapshot_file = workdir / f"{node_id}.snapshot.json"
    cmd += ["--stats-file", str(stats_file), "--snapshot-file", str(snapshot_file)]
    env = None if keys_dir is None else {**os.environ, KEYS_ENV: str(keys_dir)}
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    deadline = time.monotonic() + timeout
    while not addr_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"node {node_id} exited with code {proc.returncode} at start")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"node {node_id} did not publish its address in {timeout} s")
        time.sleep(0.02)
    lines = addr_file.read_text().splitlines()  # endpoint, then the metrics URL if served
    metrics_url = lines[1] if len(lines) > 1 else None
    return NodeHandle(node_id, depth, lines[0], proc, metrics_url, stats_file, snapshot_file)


def start_tree(
    topology: TopologyConfig,
    topology_file: Path,
    base_path: str | None = None,
    workdir: Path | None = None,
    executors: int | None = None,
    plans: bool = True,
    keys: ClusterKeys | None = None,
    remove_workdir: bool | None = None,
    prefixes: dict[str, list[str]] | None = None,
) -> LocalTree:
    """Start every node of ``topology`` as a local process, parents before children;
    each child gets its parent's endpoint from the parent's address file. Nodes tied
    to loopback hosts (127.0.0.x standing for machines) bind their own endpoints, a
    wildcard bind narrowed to the node's host. Raises TopologyError, before starting
    anything, when a node is tied to another host (see :func:`check_local_hosts`).

    CURVE is on unless the topology says ``security.curve: false``: the cluster keys are
    ``keys``, else ``$DSTL_KEYS`` or the topology's ``security.keys``, else generated
    into ``<workdir>/keys`` (0600 secrets); see :attr:`LocalTree.keys`.
    ``remove_workdir``: whether :meth:`LocalTree.stop` deletes the work directory
    (None: when it was made here, ``workdir`` not given). ``prefixes``: node id -> the
    command prefix it runs under (:func:`start_node_process`), kept for restarts."""
    tree = topology.tree(executors)
    check_local_hosts(topology, topology_file)
    sweep_stale_workdirs()  # what SIGKILLed launchers left here, key files included
    wd = workdir or Path(tempfile.mkdtemp(prefix=TREE_WORKDIR_PREFIX))
    wd.mkdir(parents=True, exist_ok=True)
    remove = workdir is None if remove_workdir is None else remove_workdir
    specs = {n.id: n for n in topology.nodes or []}
    running = LocalTree(
        topology,
        tree,
        workdir=wd,
        keys=_tree_keys(topology, topology_file, wd, keys),
        topology_file=topology_file,
        base_path=base_path,
        plans=plans,
        remove_workdir=remove,
        owner=own_workdir(wd) if remove else None,
        prefixes=dict(prefixes or {}),
    )
    try:
        for node_id in tree.topological():  # every parent before its children
            spec = specs.get(node_id)
            _start_restartable(
                running, node_id, local_bind(spec) if spec is not None else "tcp://127.0.0.1:0"
            )
    except BaseException:
        running.stop()
        raise
    return running


def _start_restartable(tree: LocalTree, node_id: str, bind: str, attempts: int = 3) -> None:
    """Start ``node_id`` on ``bind``; a loopback ``tcp://HOST:0`` becomes a port outside the
    ephemeral range (:func:`~dstltree.aggregator.ports.stable_port`), so that
    :meth:`LocalTree.restart` finds the node's endpoint free. A chosen port taken before
    the node bound it is replaced, ``attempts`` times at most; the last error is raised."""
    try:
        host, port = split_tcp(bind)
    except ValueError:
        host, port = "", None
    if port != 0 or not is_loopback(host):
        tree.start_node(node_id, bind)
        return
    for attempt in range(attempts):
        try:
            tree.start_node(node_id, tcp_endpoint(host, stable_port(host)))
            return
        except RuntimeError:  # exited at start: the port was taken meanwhile
            if attempt == attempts - 1:
                raise


def _tree_keys(
    topology: TopologyConfig, topology_file: Path, workdir: Path, keys: ClusterKeys | None
) -> ClusterKeys | None:
    settings = topology.security or SecuritySettings()
    if not settings.curve:
        return None
    if keys is not None:
        if keys.directory is None:
            raise ValueError("start_tree: keys must come from a key directory")
        return keys
    found = cluster_keys_for_nodes(settings, str(topology_file), required=False)
    if found is not None:
        return found
    d = workdir / "keys"
    return load_key_dir(d) if (d / "node.key_secret").exists() else generate_key_dir(d)


def check_local_hosts(topology: TopologyConfig, topology_file: Path) -> None:
    """Raise TopologyError naming the first node tied to a host that is not loopback
    (``localhost``, 127.0.0.0/8, ``::1``): such nodes run on their own machines
    (``dstl node --topology F --node-id ID`` there), not all here."""
    for i, n in enumerate(topology.nodes or ()):
        if n.host is not None and not is_loopback(n.host):
            raise TopologyError(
                f"{topology_file}: nodes[{i}].host: node {n.id!r} is on host {n.host!r}, "
                "not this machine; only topologies whose hosts are loopback addresses "
                f"(127.0.0.x) start here. On each host run: dstl node --topology "
                f"{topology_file} --node-id <its node>"
            )


def local_bind(spec: NodeSpec) -> str:
    """The endpoint a node binds when started on this machine: ``auto`` is a free
    loopback port; a wildcard tcp bind of a node tied to a host binds that host only
    (nodes standing for machines on 127.0.0.x may share a port); else ``spec.bind``."""
    if spec.bind == "auto":
        return "tcp://127.0.0.1:0"
    if spec.host is not None and spec.bind.startswith("tcp://"):
        host, port = split_tcp(spec.bind)
        if is_wildcard(host):
            return tcp_endpoint(spec.host, port or 0)
    return spec.bind
