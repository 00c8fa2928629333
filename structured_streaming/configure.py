"""One call sets a Spark session up for Structured Streaming through the tree.

``configure(builder, topology=...)`` returns the same ``SparkSession.Builder`` with:

- the manager's jar (:func:`dstltree.structured_streaming.jar.jar_path`, built with
  ``javac`` on first use) added to ``spark.jars``; that is enough for the class to load
  when a query starts, on the driver and on the executors (tested with ``local[N]``), if
  the driver JVM starts with this builder. ``spark.jars`` reaches the driver's class path
  only at JVM start, so when this Python process already runs a Spark JVM (an earlier,
  stopped session) the jar is also added to that driver's class loader;
- ``spark.sql.streaming.checkpointFileManagerClass`` =
  ``io.dstltree.spark.DstlCheckpointFileManager``;
- ``spark.hadoop.dstltree.bridge.socket`` = the bridge's Unix socket (when known: given,
  or started here; else every JVM uses its default ``/tmp/dstltree-<uid>/bridge.sock``).

With a local master (``local[...]``, ``local-cluster[...]``, the builder's or ``master=``)
and a topology, it also starts the topology's nodes on this machine (as
``StreamingJob`` does, restarted when one dies) and one bridge process
(``python -m dstltree.structured_streaming.bridge --socket S --topology T``) on a
private socket, and stops them by PID when this Python process exits, or earlier with
:func:`stop`. Without a topology nothing is started: the manager finds no bridge and
writes plain files (the same as Spark alone, plus one WARN per manager).

On a cluster master nothing is started: the hosts run their nodes and bridges
(``dstl node``, ``dstl bridge``), and every JVM finds its host's bridge at the socket.

Why a builder and not a handle: the call slots into the usual
``configure(SparkSession.builder.master(...), topology=...).getOrCreate()`` chain; what it
started is kept here (:func:`started`) and stopped at exit, or by :func:`stop`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dstltree.structured_streaming.jar import MANAGER_CLASS, jar_path
from dstltree.topology.catalog import topology_path

SOCKET_KEY = "dstltree.bridge.socket"
"""The Hadoop configuration key the JVM manager reads its socket from."""
MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
LOCAL_FS_CLASS = "io.dstltree.spark.DstlLocalFileSystem"
WRAPPING_FS_CLASS = "io.dstltree.spark.DstlFileSystem"
TREE_SCHEME = "dstl"  # a checkpoint location in the tree alone: dstl://<query>/
TREE_FS_CLASS = "io.dstltree.spark.DstlTreeFileSystem"
#: the file systems configure() wraps by default: scheme -> the class wrapped ("" for
#: ``file``, served by DstlLocalFileSystem)
DEFAULT_FILE_SYSTEMS: dict[str, str] = {"file": ""}
READY = "bridge ready on "
"""What the bridge prints (then the socket path) once it listens."""
BRIDGE_START_TIMEOUT = 60.0  # seconds for the bridge to print its ready line
STOP_TIMEOUT = 10.0  # seconds between SIGTERM and SIGKILL


class BridgeStartError(RuntimeError):
    """The bridge process exited or did not print its ready line in time; the message
    holds the end of its log."""


@dataclass
class LocalServices:
    """What :func:`configure` started on this machine for one session: the nodes (a
    :class:`~dstltree.sparkplug.nodes.NodePlacement`), the bridge process and its
    socket, and the private directory holding the socket and the bridge's log."""

    socket: Path
    workdir: Path
    nodes: Any = None  # NodePlacement | None
    bridge: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    more_bridges: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _stopped: bool = field(default=False, repr=False)

    def add_bridge(
        self, socket: Path, start_timeout: float = BRIDGE_START_TIMEOUT, node: str | None = None
    ) -> None:
        """Start one more bridge on ``socket``, as another host's bridge beside its own
        node would be (stopped with the rest): to ``node`` (a node id of the local tree,
        then its parents) or, when None, to the same nodes as the first bridge. Raises
        BridgeStartError."""
        n = len(self.more_bridges) + 1
        self.more_bridges.append(
            _start_bridge(
                socket,
                self.workdir / "topology.yaml",
                _bridge_nodes(self.nodes, node),
                self.workdir / f"bridge-{n}.log",
                start_timeout,
            )
        )

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the bridge (SIGTERM by PID, SIGKILL after ``timeout`` s), then the
        nodes, then delete the work directory. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for b in [*self.more_bridges, *([self.bridge] if self.bridge is not None else [])]:
            _stop_process(b, timeout)
        if self.nodes is not None:
            self.nodes.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


_started: list[LocalServices] = []
_lock = threading.Lock()


def started() -> list[LocalServices]:
    """The services :func:`configure` started in this process and not yet stopped."""
    with _lock:
        return [s for s in _started if not s._stopped]


def stop() -> None:
    """Stop everything :func:`configure` started in this process (also run at exit)."""
    with _lock:
        services, _started[:] = list(_started), []
    for s in reversed(services):
        s.stop()


atexit.register(stop)


def is_local(master: str) -> bool:
    """True for masters whose executors run on this machine."""
    return master.startswith(("local[", "local-cluster[")) or master == "local"


def configure(
    builder: Any,
    topology: str | Path | None = None,
    socket: str | Path | None = None,
    *,
    master: str | None = None,
    base_path: str | None = None,
    storage_options: dict[str, Any] | None = None,
    curve: bool = True,
    start_timeout: float = BRIDGE_START_TIMEOUT,
    file_systems: dict[str, str] | None = None,
) -> Any:
    """Set ``builder`` (a ``pyspark.sql.SparkSession.Builder``) up so that its
    Structured Streaming queries checkpoint their state through the tree; returns it.
    A checkpoint location ``dstl://<query>/`` lives in the tree alone (every file of it
    through the bridge, the objects on the topology's DFS: S3 through s3fs without any
    Hadoop S3 connector); a ``file:`` location keeps its plain files for what no bridge
    took.

    ``topology``: the topology YAML file, or a shipped topology's short name such as
    ``"local"`` (:func:`dstltree.topology.catalog.topology_path`; None: start nothing;
    the manager then writes plain files). ``socket``: the bridge's socket path (None: a
    private one when a bridge is started here, else the JVM's default). ``master``:
    overrides the master
    read from the builder (``spark.master``; unset means pyspark's default, ``local[*]``).
    ``base_path``/``storage_options``: override the topology's, for the nodes started
    here. ``curve``: False runs the local nodes in plaintext whatever the topology says.
    ``file_systems``: the schemes of checkpoint locations whose Hadoop file system is
    wrapped so that the SST files RocksDB copies past the checkpoint file manager reach
    the tree too, as {scheme: the FileSystem class wrapped}, e.g. ``{"file": "",
    "s3a": "org.apache.hadoop.fs.s3a.S3AFileSystem"}`` (``file`` needs no class: it
    becomes ``DstlLocalFileSystem``, uncached so that a session's settings always
    apply); default ``{"file": ""}``; ``{}`` wraps none (SST files stay plain files).

    Raises JarBuildError (no JDK, javac failed), TopologyError (bad topology file) or
    BridgeStartError (the bridge did not come up within ``start_timeout`` s; the nodes
    started for it are stopped again)."""
    options: dict[str, Any] = getattr(builder, "_options", {})
    jar = str(jar_path())
    jars = [j for j in str(options.get("spark.jars", "")).split(",") if j]
    if jar not in jars:
        builder = builder.config("spark.jars", ",".join([*jars, jar]))
    builder = builder.config(MANAGER_KEY, MANAGER_CLASS)
    builder = builder.config(f"spark.hadoop.fs.{TREE_SCHEME}.impl", TREE_FS_CLASS)
    wrapped = DEFAULT_FILE_SYSTEMS if file_systems is None else file_systems
    for k, v in file_system_conf(wrapped).items():
        builder = builder.config(k, v)
    for side in ("driver", "executor"):  # Hadoop loads file systems from the class path
        key = f"spark.{side}.extraClassPath"
        paths = [p for p in str(options.get(key, "")).split(os.pathsep) if p]
        if jar not in paths:
            builder = builder.config(key, os.pathsep.join([*paths, jar]))
    master = master or str(options.get("spark.master", "local[*]"))
    if topology is not None and is_local(master):
        services = start_local(
            topology_path(topology),
            socket=None if socket is None else Path(socket),
            base_path=base_path,
            storage_options=storage_options,
            curve=curve,
            start_timeout=start_timeout,
        )
        socket = services.socket
    if socket is not None:
        builder = builder.config(f"spark.hadoop.{SOCKET_KEY}", str(socket))
    add_to_running_driver(jar)
    return builder


def file_system_conf(file_systems: dict[str, str]) -> dict[str, str]:
    """The Spark settings that wrap each scheme's Hadoop file system (see
    :func:`configure`'s ``file_systems``). Raises ValueError for a scheme other than
    ``file`` without a class, or a malformed scheme."""
    conf: dict[str, str] = {}
    for scheme, wrapped in file_systems.items():
        if not scheme.isascii() or not scheme.replace("+", "").replace("-", "").isalnum():
            raise ValueError(f"file_systems: not a URI scheme: {scheme!r}")
        if scheme == "file":
            conf["spark.hadoop.fs.file.impl"] = LOCAL_FS_CLASS
            conf["spark.hadoop.fs.file.impl.disable.cache"] = "true"
            continue
        if not wrapped:
            raise ValueError(f"file_systems: scheme {scheme!r} needs the class it wraps")
        conf[f"spark.hadoop.fs.{scheme}.impl"] = WRAPPING_FS_CLASS
        conf[f"spark.hadoop.dstltree.fs.{scheme}.impl"] = wrapped
    return conf


def add_to_running_driver(jar: str) -> bool:
    """When this Python process already runs a Spark JVM (an earlier session, stopped
    or not), add ``jar`` to its driver class loader: ``spark.jars`` reaches the driver's
    class path only when the JVM starts (executors fetch it with every new context), and
    the driver loads the manager when a query starts. Returns True when it was added."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return False
    jvm = gateway.jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    if loader.getClass().getName() != "org.apache.spark.util.MutableURLClassLoader":
        return False
    url = jvm.java.io.File(jar).toURI().toURL()
    if url.toString() not in [u.toString() for u in loader.getURLs()]:
        loader.addURL(url)
    return True


def start_local(
    topology: Path,
    socket: Path | None = None,
    base_path: str | None = None,
    storage_options: dict[str, Any] | None = None,
    curve: bool = True,
    start_timeout: float = BRIDGE_START_TIMEOUT,
    bridge_node: str | None = None,
) -> LocalServices:
    """Start the nodes of ``topology`` here and one bridge to them on ``socket`` (None:
    ``<private dir>/bridge.sock``, the directory 0700), wait for the bridge's ready line
    (at most ``start_timeout`` s) and return what was started (also stopped at exit).
    ``bridge_node``: the node id the bridge sends to first (None: a leaf). Raises
    BridgeStartError, TopologyError."""
    from dstltree.sparkplug.nodes import local_nodes
    from dstltree.topology.config import load_topology

    topo = load_topology(topology, base_path=base_path, storage_options=storage_options)
    workdir = Path(tempfile.mkdtemp(prefix="dstltree-ss-"))  # 0700
    services = LocalServices(socket=socket or workdir / "bridge.sock", workdir=workdir)
    with _lock:
        _started.append(services)
    try:
        services.nodes = local_nodes(
            topology,
            tasks=1,
            base_path=topo.base_path,
            storage_options=dict(topo.storage_options),
            curve=curve,
        )
        bridge_topology = workdir / "topology.yaml"
        bridge_topology.write_text(
            yaml.safe_dump(_bridge_topology(topo, services.nodes, curve=curve))
        )
        services.log = workdir / "bridge.log"
        services.bridge = _start_bridge(
            services.socket,
            bridge_topology,
            _bridge_nodes(services.nodes, bridge_node),
            services.log,
            start_timeout,
        )
    except BaseException:
        services.stop()
        raise
    return services


def _bridge_topology(topo: Any, nodes: Any, curve: bool) -> dict[str, Any]:
    """The topology the bridge reads (base path, storage options, keys): the job's, with
    the local tree's key directory, or plaintext when ``curve`` is off."""
    data: dict[str, Any] = topo.model_dump(mode="json", exclude_none=True)
    keys = None if nodes.local_tree is None else nodes.local_tree.keys
    if not curve or keys is None:
        data["security"] = {"curve": False}
    elif keys.directory is not None:
        data["security"] = {**(data.get("security") or {}), "keys": str(keys.directory)}
    return data


def _bridge_nodes(nodes: Any, node: str | None = None) -> list[str]:
    """The endpoints the bridge sends to, in order of preference: ``node`` (None: a leaf
    of the local tree, as the node beside an executor would be), then its parents."""
    tree = nodes.local_tree
    leaf = tree.tree.nodes[-1] if node is None else node  # breadth-first: last is a leaf
    return [tree.address(leaf), *tree.parent_addresses(leaf)]


def _start_bridge(
    socket: Path, topology: Path, nodes: list[str], log: Path, timeout: float
) -> subprocess.Popen[bytes]:
    """Start the bridge process sending to ``nodes`` (endpoints, in order of
    preference); return once its log holds the ready line. Raises
    BridgeStartError when it exits first or ``timeout`` s pass (it is stopped then)."""
    cmd = [
        sys.executable,
        "-m",
        "dstltree.structured_streaming.bridge",
        "--socket",
        str(socket),
        "--topology",
        str(topology),
        *(a for n in nodes for a in ("--node", n)),
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, close_fds=True)
    deadline = time.monotonic() + timeout
    while True:
        text = log.read_text(errors="replace")
        if READY in text:
            return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop_process(proc, STOP_TIMEOUT)
            tail = "\n".join(text.splitlines()[-20:])
            why = f"exited with {proc.returncode}" if proc.returncode else "did not start"
            raise BridgeStartError(f"the bridge {why} within {timeout:.0f} s:\n{tail}")
        time.sleep(0.05)  # polling its log file, bounded by the deadline


def _stop_process(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM ``proc`` by its PID, SIGKILL after ``timeout`` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
