"""The topology YAML schema, validated with pydantic.

A topology names the aggregator nodes and their parents (or a branching factor for
one node per Spark executor), the collectors' thresholds and the DFS location::

    base_path: data/dstl            # fsspec URL or local directory
    storage_options: {}             # passed to fsspec (e.g. endpoint_url for S3)
    target_object_bytes: 4MiB       # a collector cuts an object once it holds this
    persist_delay: 0.05             # seconds after the first pending persist request
    plan_window: 16                 # checkpoints per plan window; plans: false = hop by hop
    upload_timeout: 1.0             # seconds before a hedged second attempt starts
    upload_attempts: 3              # attempts per object upload (1 = no hedging)
    metrics_port: 9400              # Prometheus /metrics: node k (breadth-first) on
                                    # 9400 + k; 0 = a free port each; null = off (default)
    nodes:
      - {id: root, bind: auto}
      - {id: a, bind: auto, parent: root}

Errors are raised as :class:`TopologyError` whose message names the offending field
(``nodes[2].parent``) or node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError, model_validator

from dstltree.topology.tree import TopologyError, Tree, kary_tree

__all__ = ["NodeSpec", "TopologyConfig", "TopologyError", "load_topology", "parse_topology"]


class NodeSpec(BaseModel):
    """One aggregator node: ``id``, ``bind`` address (``tcp://host:port``, ``ipc://path``
    or ``auto`` for a free loopback port chosen at start) and ``parent`` node id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    bind: str = "auto"
    parent: str | None = None

    @model_validator(mode="after")
    def _check_bind(self) -> NodeSpec:
        if self.bind != "auto" and not self.bind.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"bind must be 'auto' or a ZeroMQ endpoint, got {self.bind!r}")
        return self


class TopologyConfig(BaseModel):
    """A validated topology. Sizes are bytes (``4MiB`` strings accepted), times seconds."""

    model_config = ConfigDict(extra="forbid")

    nodes: list[NodeSpec] | None = None
    branching: int | None = Field(default=None, ge=1, le=4096)
    target_object_bytes: ByteSize = Field(default=ByteSize(4 * 1024 * 1024), gt=0)
    persist_delay: float = Field(default=0.05, ge=0.0, le=60.0)
    plan_window: int = Field(default=16, ge=1)
    plans: bool = True
    upload_timeout: float = Field(default=1.0, gt=0.0, le=600.0)
    upload_attempts: int = Field(default=3, ge=1, le=16)
    parent_timeout: float = Field(default=2.0, gt=0.0, le=600.0)
    max_message_bytes: ByteSize = Field(default=ByteSize(64 * 1024 * 1024), gt=0)
    base_path: str = "data/dstl"
    storage_options: dict[str, Any] = Field(default_factory=dict)
    # Prometheus metrics (aggregator.metrics): a base port, node k in breadth-first order
    # serves http://host:(metrics_port + k)/metrics; 0 = every node picks a free port
    # (published in its address file); None = no metrics server.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)

    @model_validator(mode="after")
    def _check_shape(self) -> TopologyConfig:
        if (self.nodes is None) == (self.branching is None):
            raise ValueError("give exactly one of 'nodes' (explicit tree) or 'branching'")
        if self.nodes is not None:
            _check_nodes(self.nodes)
        return self

    def tree(self, executors: int | None = None) -> Tree:
        """The tree of this topology; with ``branching``, ``executors`` nodes are needed."""
        if self.nodes is not None:
            return Tree.from_specs(self.nodes)
        if executors is None:
            raise TopologyError("branching: a tree by branching factor needs the executor count")
        assert self.branching is not None
        return kary_tree(executors, self.branching)

    def ack_timeout(self, depth: int) -> float:
        """Seconds a sender ``depth`` hops below the root waits for an ack before it
        writes the items itself (docs/design.md, Invariants: a node that cannot reach
        its parent writes itself): a node at depth d waits for the node above it, a
        client of a node at depth d is at depth d + 1. ``parent_timeout * max(depth,
        1)``: it grows with depth, so ancestors give up on their parents before their
        descendants give up on them. Raises ValueError for a negative depth."""
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        return self.parent_timeout * max(depth, 1)


def _check_nodes(nodes: list[NodeSpec]) -> None:
    if not nodes:
        raise ValueError("nodes: at least one node is needed")
    ids: set[str] = set()
    for i, n in enumerate(nodes):
        if n.id in ids:
            raise ValueError(f"nodes[{i}].id: duplicate node id {n.id!r}")
        ids.add(n.id)
    for i, n in enumerate(nodes):
        if n.parent is not None and n.parent not in ids:
            raise ValueError(f"nodes[{i}].parent: unknown node {n.parent!r}")
        if n.parent == n.id:
            raise ValueError(f"nodes[{i}].parent: node {n.id!r} is its own parent")
    roots = [n.id for n in nodes if n.parent is None]
    if len(roots) != 1:
        raise ValueError(f"nodes: exactly one root (a node with no parent) needed, got {roots}")
    try:
        Tree.from_specs(nodes)
    except TopologyError as e:
        raise ValueError(str(e)) from e


def _format_error(source: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in e["loc"])
        loc = loc.replace(".[", "[")
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{source}: {loc or '(top level)'}: {msg}")
    return "\n".join(parts)


def parse_topology(data: Any, source: str = "topology") -> TopologyConfig:
    """Validate a mapping as a topology. Raises :class:`TopologyError` naming the field."""
    if not isinstance(data, dict):
        raise TopologyError(f"{source}: expected a mapping at the top level")
    try:
        return TopologyConfig.model_validate(data)
    except ValidationError as e:
        raise TopologyError(_format_error(source, e)) from e


def load_topology(path: str | Path, **overrides: Any) -> TopologyConfig:
    """Read and validate a topology YAML file; ``overrides`` replace top-level fields.

    Raises :class:`TopologyError` for unreadable files, bad YAML (with line) or fields.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TopologyError(f"{p}: cannot read topology: {e.strerror}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TopologyError(f"{p}: not valid YAML: {e}") from e
    if isinstance(data, dict):
        data.update({k: v for k, v in overrides.items() if v is not None})
    return parse_topology(data, source=str(p))
