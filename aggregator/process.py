"""Running one node as a process: build it from a topology, publish its address, serve.

``run_node`` is what ``dstl node`` and ``python -m aggregator`` execute (blocking).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path

from aggregator.core import NodeConfig
from aggregator.node import Node
from client.hedging import UploadPolicy
from client.storage import ObjectStore
from topology.config import TopologyConfig


def node_config(
    topo: TopologyConfig, node_id: str, depth: int, parent: str | None, plans: bool = True
) -> NodeConfig:
    """The node's thresholds; its parent timeout grows with depth so that ancestors give
    up on their parents before their children give up on them."""
    return NodeConfig(
        node_id=node_id,
        parent_address=parent,
        target_bytes=int(topo.target_object_bytes),
        persist_delay=topo.persist_delay,
        parent_timeout=topo.parent_timeout * max(depth, 1),
        plans=plans and topo.plans,
        plan_window=topo.plan_window,
    )


def client_ack_timeout(topo: TopologyConfig, depth: int) -> float:
    """How long a writer waits for its node (at ``depth``) before writing directly."""
    return topo.parent_timeout * (depth + 2) + 1.0


def build_node(
    topo: TopologyConfig,
    node_id: str,
    depth: int,
    bind: str,
    parent: str | None,
    store: ObjectStore | None = None,
) -> Node:
    store = store or ObjectStore(topo.base_path, topo.storage_options)
    cfg = node_config(topo, node_id, depth, parent)
    policy = UploadPolicy(attempts=topo.upload_attempts, upload_timeout=topo.upload_timeout)
    return Node(cfg, store, bind=bind, max_message_bytes=int(topo.max_message_bytes),
                upload_policy=policy)  # fmt: skip


def run_node(
    topo: TopologyConfig,
    node_id: str,
    depth: int,
    bind: str,
    parent: str | None,
    address_file: Path | None = None,
    exit_with_pid: int | None = None,
    stats_file: Path | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or until process ``exit_with_pid`` is gone), then
    write the node's final statistics as JSON to ``stats_file``. Blocking."""
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s node {node_id} %(message)s")
    node = build_node(topo, node_id, depth, bind, parent)
    if address_file is not None:
        tmp = address_file.with_suffix(".tmp")
        tmp.write_text(node.address)
        tmp.replace(address_file)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: node.stop())
    if exit_with_pid is not None:
        threading.Thread(target=_watch_pid, args=(exit_with_pid, node), daemon=True).start()
    node.serve()
    if stats_file is not None:
        write_stats(node, stats_file)


def write_stats(node: Node, path: Path) -> None:
    """The node's counters plus its DFS upload statistics (requests, hedges), as JSON."""
    from client.hedging import uploader_for

    doc = asdict(node.statistics())
    doc["uploads"] = uploader_for(node.store, node.upload_policy).stats.snapshot()
    doc["process_cpu_s"] = sum(os.times()[:2])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def _watch_pid(pid: int, node: Node) -> None:
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            node.stop()
            return
        except PermissionError:
            pass
        time.sleep(1.0)
