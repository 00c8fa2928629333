"""The Structured Streaming demo on several hosts (``dstl demo --engine
structured-streaming --hosts N``): the services of the driver's host and of N
worker hosts of a Spark standalone cluster on this machine.

Each worker stands for a host (``dstl cluster``'s classes: its own loopback address) with
its own bridge, sending to a leaf of the topology (host i to leaf ``i mod leaves``);
its executors find the bridge through ``DSTLTREE_BRIDGE_SOCKET`` in the worker's
environment, as a host sets it in ``spark-env.sh``. The driver's host runs the tree's
root and a third bridge and no executor, so every state file is written on a host other
than the driver's, and the driver's commit flushes them across hosts
(docs/structured-streaming.md, "Several hosts: the cross-host commit").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

WORKER_CORES = 2
WORKER_MEMORY = "2g"  # room for one executor of 1 GiB and the worker's own


@contextmanager
def demo_services(
    topology: Path,
    tree_url: str,
    hosts: int,
    workdir: Path,
    storage_options: dict[str, Any] | None = None,
) -> Iterator[tuple[Any, str | None]]:
    """(the nodes and bridges, the standalone master URL or None for ``hosts`` 0: the
    driver's own master), the tree's objects at ``tree_url`` (fsspec, with
    ``storage_options``); everything is stopped by PID on exit. Raises
    BridgeStartError, TopologyError, RuntimeError (the cluster did not come up)."""
    from dstltree.structured_streaming.configure import start_local

    if hosts == 0:
        services = start_local(topology, base_path=tree_url, storage_options=storage_options)
        try:
            yield services, None
        finally:
            services.stop()
        return
    from dstltree.cli.commands.cluster import start_cluster
    from dstltree.topology.config import load_topology

    tree = load_topology(topology).tree()
    leaves = [n for n in tree.nodes if not tree.children(n)] or [tree.root]
    services = start_local(
        topology, base_path=tree_url, storage_options=storage_options, bridge_node=tree.root
    )
    cluster = None
    try:
        # in the services' private folder: a socket path has at most 107 bytes
        sockets = [services.workdir / f"host{i}.sock" for i in range(hosts)]
        for i, sock in enumerate(sockets):
            services.add_bridge(sock, node=leaves[i % len(leaves)])
        env = [{"DSTLTREE_BRIDGE_SOCKET": str(s)} for s in sockets]
        cluster = start_cluster(
            workdir / "standalone", hosts, WORKER_CORES, WORKER_MEMORY, worker_env=env
        )
        yield services, cluster.master_url
    finally:
        if cluster is not None:
            cluster.stop()
        services.stop()
