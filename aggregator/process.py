"""Running one node as a process: build it from a topology, publish its address, serve.

``run_node`` is what ``dstl node`` and ``python -m aggregator`` execute (blocking).
The address file holds the ZeroMQ endpoint on its first line and, when the node serves
metrics (topology ``metrics_port``), its ``http://host:port/metrics`` URL on the second.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from dstltree.aggregator.core import NodeConfig
from dstltree.aggregator.metrics import NodeMetrics, metrics_port_for
from dstltree.aggregator.node import Node
from dstltree.client.collector import serving_collector
from dstltree.client.wire import WIRE_VERSIONS
from dstltree.security.curve import Curve, auth_refusals, register_refusal_metrics
from dstltree.security.settings import SecuritySettings, cluster_keys_for_nodes
from dstltree.storage.hedging import UploadPolicy
from dstltree.storage.store import RESERVED_OBJECTS, ObjectStore
from dstltree.topology.config import TopologyConfig
from dstltree.topology.endpoints import is_loopback

Parents = str | Sequence[str] | None  # one endpoint or several in order of preference


def parent_endpoints(parents: Parents) -> tuple[str, ...]:
    """``parents`` as a tuple of endpoints in order of preference (() for a root)."""
    if parents is None:
        return ()
    return (parents,) if isinstance(parents, str) else tuple(parents)


def node_config(
    topo: TopologyConfig, node_id: str, depth: int, parent: Parents, plans: bool = True
) -> NodeConfig:
    """The node's thresholds; its parent timeout is ``topo.ack_timeout(depth)``;
    ``parent``: the parent's endpoint, or the parents' in order of preference; wire
    versions and heartbeat per the topology (``wire_versions``, ``ping_interval``,
    ``liveness_timeout``)."""
    first, *more = parent_endpoints(parent) or (None,)
    return NodeConfig(
        node_id=node_id,
        parent_address=first,
        fallback_addresses=tuple(a for a in more if a is not None),
        target_bytes=int(topo.target_object_bytes),
        persist_delay=topo.persist_delay,
        parent_timeout=topo.ack_timeout(depth),
        plans=plans and topo.plans,
        plan_window=topo.plan_window,
        ping_interval=topo.ping_interval,
        liveness_timeout=topo.liveness_timeout,
        wire_versions=WIRE_VERSIONS if topo.wire_versions is None else topo.wire_versions,
    )


def upload_policy(topo: TopologyConfig) -> UploadPolicy:
    """The hedging of a node's uploads per the topology: ``upload_attempts``,
    ``upload_timeout`` (or ``upload_adaptive_percentile``), ``upload_copies`` of objects
    up to ``upload_copies_max_bytes``, ``throttle_quiet`` seconds without hedges after a
    throttled request."""
    return UploadPolicy(
        attempts=topo.upload_attempts,
        upload_timeout=topo.upload_timeout,
        adaptive_percentile=topo.upload_adaptive_percentile,
        copies=topo.upload_copies,
        copies_max_bytes=int(topo.upload_copies_max_bytes),
        throttle_quiet=topo.throttle_quiet,
    )


def build_node(
    topo: TopologyConfig,
    node_id: str,
    depth: int,
    bind: str,
    parent: Parents,
    store: ObjectStore | None = None,
    metrics: NodeMetrics | None = None,
    advertise: str | None = None,
    security: Curve | None = None,
) -> Node:
    """The node ``node_id`` at ``depth`` of ``topo``, bound to ``bind`` and known to
    others as ``advertise`` (default: the bound endpoint), with its own object writer
    hedging uploads per the topology (:func:`upload_policy`). ``store``: default, the
    topology's base path with its ``object_prefixes`` and RESERVED_OBJECTS object files
    created ahead (closed with the node). ``security``: see
    :func:`node_security` (None = plaintext)."""
    store = store or ObjectStore(
        topo.base_path,
        topo.storage_options,
        prefixes=topo.object_prefixes,
        reserve_objects=RESERVED_OBJECTS,
    )
    cfg = node_config(topo, node_id, depth, parent)
    policy = upload_policy(topo)
    return Node(
        cfg,
        store,
        bind=bind,
        max_message_bytes=int(topo.max_message_bytes),
        upload_policy=policy,
        metrics=metrics,
        advertise=advertise,
        security=security,
        object_format=topo.object_format,
    )


def node_security(topo: TopologyConfig, source: str) -> Curve | None:
    """The node's CURVE settings: None when the topology says ``security.curve:
    false``, else from the key directory of ``$DSTL_KEYS`` or ``security.keys``.
    Raises TopologyError (naming ``security.keys``) when none is named or it cannot
    be loaded, or the node secret key is missing."""
    keys = cluster_keys_for_nodes(topo.security or SecuritySettings(), source, required=True)
    if keys is None:
        return None
    if keys.node.secret is None:
        from dstltree.topology.tree import TopologyError

        raise TopologyError(f"{source}: security.keys: {keys.directory} has no node.key_secret")
    return Curve.for_node(keys)


def node_metrics(topo: TopologyConfig, node_id: str, bind: str) -> NodeMetrics | None:
    """The node's metrics, served per the topology's ``metrics_port`` (None: off) on
    the topology's ``security.metrics_host`` when set, else loopback (the host of
    ``bind`` when that is a loopback address). A port that cannot be bound is logged
    and the node runs without serving metrics."""
    port = metrics_port_for(topo, node_id)
    if port is None:
        return None
    host = "127.0.0.1"
    if topo.security is not None and topo.security.metrics_host is not None:
        host = topo.security.metrics_host
    elif bind.startswith("tcp://"):
        h = bind[len("tcp://") :].rsplit(":", 1)[0].strip("[]")
        host = h if h and h != "*" and is_loopback(h) else host
    try:
        metrics = NodeMetrics(node_id, port, host)
        register_refusal_metrics(metrics.registry)  # dstl_auth_refusals_total{role}
        return metrics
    except OSError as e:
        logging.getLogger("dstltree.node").warning(
            "metrics port %s:%d unavailable (%s); metrics not served", host, port, e
        )
        return None


def run_node(
    topo: TopologyConfig,
    node_id: str,
    depth: int,
    bind: str,
    parent: Parents,
    address_file: Path | None = None,
    exit_with_pid: int | None = None,
    stats_file: Path | None = None,
    snapshot_file: Path | None = None,
    advertise: str | None = None,
    security: Curve | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or until process ``exit_with_pid`` is gone), then
    write the node's final statistics as JSON to ``stats_file``. On SIGUSR1 the current
    statistics go to ``snapshot_file`` without stopping (benchmarks split counters at
    plan-window boundaries this way). ``advertise``: the endpoint others connect to,
    written to ``address_file`` (default: the bound endpoint). ``security``: from
    :func:`node_security` (None = plaintext). Blocking."""
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s node {node_id} %(message)s")
    metrics = node_metrics(topo, node_id, bind)
    node = build_node(
        topo, node_id, depth, bind, parent, metrics=metrics, advertise=advertise, security=security
    )
    if address_file is not None:
        tmp = address_file.with_suffix(".tmp")
        url = metrics.url if metrics is not None else None
        tmp.write_text(node.address + (f"\n{url}\n" if url else ""))
        tmp.replace(address_file)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: node.stop())
    if snapshot_file is not None:
        # written from another thread: the handler may interrupt the loop holding a lock
        signal.signal(
            signal.SIGUSR1,
            lambda *_: threading.Thread(
                target=write_stats, args=(node, snapshot_file), daemon=True
            ).start(),
        )
    if exit_with_pid is not None:
        threading.Thread(target=_watch_pid, args=(exit_with_pid, node), daemon=True).start()
    with serving_collector():
        node.serve()
    if stats_file is not None:
        write_stats(node, stats_file)


def write_stats(node: Node, path: Path) -> None:
    """The node's counters plus its DFS upload statistics (requests, hedges, from its
    own object writer), as JSON."""
    doc = asdict(node.statistics())
    doc["uploads"] = node.writer.upload_stats()
    doc["auth_refusals"] = auth_refusals().get("node", 0)  # CURVE clients refused
    doc["process_cpu_s"] = sum(os.times()[:2])
    doc["silence_log"] = node.silence_log()  # (wall-clock time, upstream left, link opened)
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
