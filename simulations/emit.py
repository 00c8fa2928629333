"""From simulation to configuration: the topology YAML (the format of ``deploy/*.yaml``,
loaded by :func:`dstltree.topology.config.load_topology`) of a simulated setting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dstltree.simulations.cluster import SimResult
from dstltree.simulations.config import SimConfig
from dstltree.storage.store import DEFAULT_PREFIXES
from dstltree.topology.config import TopologyConfig, parse_topology

__all__ = ["recommended_topology", "write_topology"]


def recommended_topology(
    result: SimResult, cfg: SimConfig, base_path: str = "data/dstl"
) -> TopologyConfig:
    """The topology of ``result``'s setting: one node per executor as a k-ary tree of
    ``result.branching`` (or ``cfg.tree``'s nodes when it was given), its target object
    size (bytes), ``cfg``'s plan window and persist delay (seconds), the parent timeout
    of ``cfg.parent_timeout_s``, and hedging after ``cfg.hedge_timeout_s`` up to
    ``cfg.max_attempts`` attempts (off: one attempt) with its copies and adaptive
    timeout, objects over at least the real store's default prefixes (the simulated
    ``cfg.prefixes`` are the ones the store has split so far). Raises TopologyError if the values
    do not validate (e.g. a branching factor above the schema's limit)."""
    hedged = cfg.hedge_timeout_s is not None and cfg.max_attempts > 1
    doc: dict[str, Any] = {
        "base_path": base_path,
        "storage_options": {},
        "target_object_bytes": result.target_object_bytes,
        "persist_delay": cfg.persist_delay_s,
        "parent_timeout": cfg.parent_timeout_s,
        "plan_window": cfg.plan_window,
        "plans": result.design != "tree-noplan",
        "upload_timeout": cfg.hedge_timeout_s if hedged else 1.0,
        "upload_attempts": cfg.max_attempts if hedged else 1,
        "upload_adaptive_percentile": cfg.hedge_adaptive_percentile if hedged else None,
        "upload_copies": cfg.hedge_copies if hedged else 1,
        "upload_copies_max_bytes": cfg.hedge_copies_max_bytes,
        "object_prefixes": max(cfg.prefixes, DEFAULT_PREFIXES),
    }
    if cfg.tree is not None:
        doc["nodes"] = [
            {
                "id": n,
                "bind": "auto",
                **({"parents": list(p)} if (p := cfg.tree.parents(n)) else {}),
            }
            for n in cfg.tree.nodes
        ]
    else:
        doc["branching"] = result.branching
    return parse_topology(doc, source="recommended topology")


def write_topology(path: str | Path, result: SimResult, cfg: SimConfig) -> Path:
    """Write :func:`recommended_topology` to ``path`` as YAML, headed by comments giving
    the simulated workload and figures (checkpoint p50/p99 in ms, requests per
    checkpoint). Returns the path."""
    topo = recommended_topology(result, cfg)
    doc = topo.model_dump(mode="json", exclude_none=True, exclude_defaults=False)
    for key in ("bind_all", "metrics_port", "security", "hosts", "node_port"):
        doc.pop(key, None)
    ms = result.checkpoint_ms
    header = (
        f"# Recommended by dstl simulate: {result.executors} executors x "
        f"{result.tasks_per_executor} tasks, {cfg.bytes_per_checkpoint} bytes per task per "
        f"checkpoint every {cfg.checkpoint_interval_s:g} s ({cfg.distribution}),\n"
        f"# store {cfg.dfs_latency} (x{cfg.dfs_latency_scale:g}), {cfg.put_rate_limit:g} PUT/s "
        f"per prefix, {cfg.prefixes} prefix(es). Simulated with the node core ({result.design}):\n"
        f"# checkpoint p50 {ms['p50']:.0f} ms, p99 {ms['p99']:.0f} ms, "
        f"{result.requests_per_checkpoint:.1f} requests per checkpoint, "
        f"{result.throttled_requests} throttled.\n"
    )
    out = Path(path)
    out.write_text(header + yaml.safe_dump(doc, sort_keys=False))
    return out
