"""The topology YAML schema, validated with pydantic.

A topology names the aggregator nodes and their parents (or a branching factor for
one node per Spark executor, or one node per host), the collectors' thresholds and the
DFS location::

    base_path: data/dstl            # fsspec URL or local directory
    storage_options: {}             # passed to fsspec (e.g. endpoint_url for S3)
    target_object_bytes: 4MiB       # a collector cuts an object once it holds this
    persist_delay: 0.05             # seconds after the first pending persist request
    plan_window: 16                 # checkpoints per plan window; plans: false = hop by hop
    upload_timeout: 1.0             # seconds before a hedged second attempt starts
    upload_attempts: 3              # attempts per object upload (1 = no hedging)
    upload_adaptive_percentile: 75  # optional: hedge after this percentile of recent
                                    # upload latencies instead (null = upload_timeout)
    upload_copies: 1                # objects up to upload_copies_max_bytes are written
    upload_copies_max_bytes: 8MiB   # this many times at once, the first to land wins
    throttle_quiet: 2.0             # seconds without new hedges after a throttled request
    object_prefixes: 256            # hashed key prefixes objects are spread over
    metrics_port: 9400              # Prometheus /metrics: node k (breadth-first) on
                                    # 9400 + k; 0 = a free port each; null = off (default)
    security: {curve: true, keys: /etc/dstl/keys}   # CURVE (default on), key directory
    wire_versions: [1, 2]           # wire protocol versions nodes speak (default: all
                                    # this release speaks; [1]: as the release before)
    ping_interval: 0.1              # seconds between pings to a parent or node (nodes,
                                    # tasks and bridges alike)
    liveness_timeout: 0.5           # seconds without a message before one is lost
    nodes:
      - {id: root, bind: auto}
      - {id: a, bind: auto, parent: root}
      - {id: b, bind: auto, parent: root}
      - {id: b1, bind: auto, parents: [b, a]}   # a DAG: a is b1's way up while b is down

More than one node may have no parent: each such root writes to the DFS. The parents
must form a DAG (no cycle) of known nodes; the first parents form the plan's trees.

Nodes by host (beside a cluster: the executors on ``host`` use that node)::

    nodes:
      - {id: root, host: 10.0.0.5, bind: "tcp://0.0.0.0:7700"}   # advertised tcp://10.0.0.5:7700
      - {id: a, host: 10.0.0.6, bind: "tcp://10.0.0.6:7700", parent: root}
      - {id: b, bind: "tcp://0.0.0.0:7700", advertise: "tcp://b.example:7700", parent: root}

or generated, one node ``n<i>`` per host, host i's parent host (i - 1) // branching and
its second parent a node in another subtree (``second_parents: false`` for a tree)::

    hosts: [10.0.0.5, 10.0.0.6, 10.0.0.7]
    branching: 2
    node_port: 7700                 # every node binds tcp://<host>:7700
    bind_all: false                 # true: bind tcp://0.0.0.0:7700 (advertised the same)

Errors are raised as :class:`TopologyError` whose message names the offending field
(``nodes[2].parent``, ``nodes[3].advertise``, ``hosts[2]``) or node, or the line and
column of a file that is not valid YAML (the byte offset of one that is not UTF-8).

Limits, so that a hostile or mangled file fails fast with a TopologyError instead of a
RecursionError, a traceback or exhausted memory: a file of at most ``MAX_FILE_BYTES``
(4 MiB), YAML nested at most ``MAX_DEPTH`` (32) levels, at most ``MAX_ALIASES`` (100)
aliases, at most ``MAX_VALUES`` (200,000) values once aliases are expanded, strings of at
most ``MAX_STRING`` (4096) characters, at most ``MAX_NODES`` (10,000) nodes, hosts or
executors, ``branching`` within 1..``MAX_BRANCHING`` (1024), ``plan_window`` within
1..1,000,000 checkpoints and sizes up to 1 TiB.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from dstltree.security.settings import SecuritySettings
from dstltree.topology.catalog import topology_path
from dstltree.topology.endpoints import (
    check_host,
    derive_advertise,
    is_wildcard,
    split_tcp,
    tcp_endpoint,
)
from dstltree.topology.tree import TopologyError, Tree, kary_tree, second_parent_indices

__all__ = [
    "MAX_BRANCHING",
    "MAX_NODES",
    "NodeSpec",
    "TopologyConfig",
    "TopologyError",
    "load_topology",
    "parse_topology",
]

MAX_FILE_BYTES = 4 * 1024 * 1024  # bytes of a topology file
MAX_DEPTH = 32  # nesting levels of mappings and lists
MAX_ALIASES = 100  # YAML aliases (*name) in one file
MAX_VALUES = 200_000  # values (keys, items, scalars) with aliases expanded
MAX_STRING = 4096  # characters of one key or string value
MAX_NODES = 10_000  # nodes, hosts or executors of one tree
MAX_BRANCHING = 1024  # children per node of a generated tree
MAX_BYTES = 1 << 40  # byte sizes (1 TiB)
MAX_PLAN_WINDOW = 1_000_000  # checkpoints per plan window
MAX_ERRORS = 10  # validation errors listed in one TopologyError


class NodeSpec(BaseModel):
    """One aggregator node: ``id``, ``bind`` address (``tcp://host:port`` with a concrete
    host or ``0.0.0.0`` / ``*`` for every interface, ``ipc://path``, or ``auto`` for a
    free loopback port chosen at start), ``parent`` node id, ``host`` (the host whose
    executors use this node, as Spark reports executor hosts: an IP or a name),
    ``parents`` (instead of ``parent``: node ids in order of preference, the first one the
    parent of the plan's tree, the others the ways up while it is down) and
    ``advertise`` (the ``tcp://host:port`` others connect to; default: the bind when it
    names a concrete host, else ``tcp://<host>:<bind port>``; see :attr:`advertised`).

    Raises ValidationError (field ``bind``/``host``/``advertise``) for a malformed
    endpoint or host, a port outside 0..65535, an advertise that is not a concrete
    ``tcp://host:port`` (port 1..65535), a wildcard bind without ``advertise`` or
    ``host``, and a node with ``host`` but no endpoint to advertise."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    bind: str = "auto"
    parent: str | None = None
    parents: tuple[str, ...] | None = Field(default=None, min_length=1, max_length=8)
    host: str | None = None
    advertise: str | None = Field(default=None, validate_default=True)

    @model_validator(mode="after")
    def _check_parents(self) -> NodeSpec:
        if self.parents is not None and self.parent not in (None, self.parents[0]):
            raise ValueError(
                f"parents: the first parent {self.parents[0]!r} differs from parent "
                f"{self.parent!r} (give one of them)"
            )
        return self

    @property
    def parent_ids(self) -> tuple[str, ...]:
        """Every parent in order of preference (``parents``, else ``parent``); ()
        for a root."""
        if self.parents is not None:
            return self.parents
        return () if self.parent is None else (self.parent,)

    @field_validator("bind")
    @classmethod
    def _check_bind(cls, bind: str) -> str:
        if bind == "auto" or bind.startswith(("ipc://", "inproc://")):
            return bind
        if bind.startswith("tcp://"):
            split_tcp(bind)
            return bind
        raise ValueError(f"bind must be 'auto' or a ZeroMQ endpoint, got {bind!r}")

    @field_validator("host")
    @classmethod
    def _check_host(cls, host: str | None) -> str | None:
        if host is not None:
            check_host(host)
        return host

    @field_validator("advertise")
    @classmethod
    def _check_advertise(cls, advertise: str | None, info: ValidationInfo) -> str | None:
        if advertise is not None:
            _check_concrete(advertise)
            return advertise
        if "bind" not in info.data or "host" not in info.data:
            return None  # bind or host failed: reported on its own field
        bind, host = info.data["bind"], info.data["host"]
        if derive_advertise(bind, host) is not None:
            return None
        wildcard = bind.startswith("tcp://") and is_wildcard(split_tcp(bind)[0])
        if wildcard and host is None:
            raise ValueError(
                f"bind {bind!r} listens on every interface: give advertise "
                "(the tcp://host:port others connect to) or host"
            )
        if host is not None:
            raise ValueError(
                f"node on host {host!r} needs an endpoint others connect to: a tcp bind "
                f"with a port (e.g. tcp://0.0.0.0:7700) or advertise; bind is {bind!r}"
            )
        return None

    @property
    def advertised(self) -> str | None:
        """The endpoint other nodes and tasks connect to: ``advertise``, else derived
        from ``bind`` and ``host``; None for ``bind: auto`` or a free port (0) not yet
        known (the address file of the running node has it)."""
        return self.advertise or derive_advertise(self.bind, self.host)


def _check_concrete(endpoint: str) -> None:
    """Raise ValueError unless ``endpoint`` is ``tcp://host:port`` with a host others can
    reach (not a wildcard) and a port 1..65535."""
    host, port = split_tcp(endpoint)
    if is_wildcard(host) or not port:
        raise ValueError(
            f"advertise must be a concrete tcp://host:port (no wildcard host, port "
            f"1..65535), got {endpoint!r}"
        )
    check_host(host)


class TopologyConfig(BaseModel):
    """A validated topology. Sizes are bytes (``4MiB`` strings accepted), times seconds.

    Exactly one shape: ``nodes`` (an explicit tree or DAG), ``hosts`` + ``branching`` +
    ``node_port`` (one node ``n<i>`` per host; after validation :attr:`nodes` holds the
    generated nodes, and :meth:`model_dump` gives ``hosts`` back, not ``nodes``), or
    ``branching`` alone (one node per executor, placed when the job starts)."""

    model_config = ConfigDict(extra="forbid")

    nodes: list[NodeSpec] | None = Field(default=None, max_length=MAX_NODES)
    hosts: list[str] | None = Field(default=None, max_length=MAX_NODES)
    branching: int | None = Field(default=None, ge=1, le=MAX_BRANCHING)
    node_port: int | None = Field(default=None, ge=1, le=65535)
    bind_all: bool = False
    # generated topologies (hosts, branching): every node gets a second parent in
    # another subtree (topology.tree.second_parent_indices); false = a tree
    second_parents: bool = True
    target_object_bytes: ByteSize = Field(default=ByteSize(4 * 1024 * 1024), gt=0, le=MAX_BYTES)
    persist_delay: float = Field(default=0.05, ge=0.0, le=60.0)
    plan_window: int = Field(default=16, ge=1, le=MAX_PLAN_WINDOW)
    plans: bool = True
    upload_timeout: float = Field(default=1.0, gt=0.0, le=600.0)
    upload_attempts: int = Field(default=3, ge=1, le=16)
    upload_adaptive_percentile: float | None = Field(default=None, gt=0.0, le=100.0)
    upload_copies: int = Field(default=1, ge=1, le=4)
    upload_copies_max_bytes: ByteSize = Field(default=ByteSize(8 * 1024 * 1024), gt=0, le=MAX_BYTES)
    throttle_quiet: float = Field(default=2.0, ge=0.0, le=600.0)
    object_prefixes: int = Field(default=256, ge=1, le=65536)
    parent_timeout: float = Field(default=2.0, gt=0.0, le=600.0)
    max_message_bytes: ByteSize = Field(default=ByteSize(64 * 1024 * 1024), gt=0, le=MAX_BYTES)
    # the object format nodes write (client/objectformat.py: 1 or 2); raised only once
    # every reader of the store reads it (docs/design.md, "Formats and compatibility")
    object_format: int = Field(default=1, ge=1, le=2)
    # the wire protocol versions nodes speak (client/wire.py; None: every version of this
    # release; [1]: as the release before, no hello and no ping) and their heartbeat
    # towards their parents: a ping every ping_interval s, a parent silent for
    # liveness_timeout s is lost (client/liveness.py)
    wire_versions: tuple[int, ...] | None = Field(default=None, min_length=1, max_length=16)
    ping_interval: float = Field(default=0.1, gt=0.0, le=60.0)
    liveness_timeout: float = Field(default=0.5, gt=0.0, le=600.0)
    base_path: str = "data/dstl"
    storage_options: dict[str, Any] = Field(default_factory=dict)
    # Prometheus metrics (aggregator.metrics): a base port, node k in breadth-first order
    # serves http://host:(metrics_port + k)/metrics; 0 = every node picks a free port
    # (published in its address file); None = no metrics server.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    # CURVE on every socket (security.settings.SecuritySettings); None = the defaults:
    # CURVE on, keys generated by whoever starts the nodes, metrics on loopback
    security: SecuritySettings | None = None

    @field_validator("wire_versions")
    @classmethod
    def _check_wire_versions(cls, versions: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if versions is None:
            return None
        if any(not 1 <= v <= 65535 for v in versions) or len(set(versions)) != len(versions):
            raise ValueError(f"versions are distinct integers 1..65535, got {list(versions)}")
        return versions

    @model_validator(mode="after")
    def _check_shape(self) -> TopologyConfig:
        if self.liveness_timeout < self.ping_interval:
            raise ValueError(
                f"liveness_timeout: {self.liveness_timeout} s is shorter than ping_interval "
                f"({self.ping_interval} s)"
            )
        if self.upload_copies > self.upload_attempts:
            raise ValueError(
                f"upload_copies: {self.upload_copies} copies need upload_attempts >= "
                f"{self.upload_copies}, got {self.upload_attempts}"
            )
        if self.hosts is not None:
            _check_hosts(self)
            assert self.branching is not None and self.node_port is not None
            self.nodes = _host_nodes(self, self.hosts, self.branching, self.node_port)
            return self
        if self.node_port is not None or self.bind_all:
            field = "node_port" if self.node_port is not None else "bind_all"
            raise ValueError(f"{field}: only used with 'hosts' (one node per host)")
        if (self.nodes is None) == (self.branching is None):
            raise ValueError(
                "give exactly one of 'nodes' (explicit tree), 'branching' (one node per "
                "executor) or 'hosts' (one node per host, with 'branching' and 'node_port')"
            )
        if self.nodes is not None:
            _check_nodes(self.nodes)
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        doc: dict[str, Any] = handler(self)
        if self.hosts is not None:
            doc.pop("nodes", None)  # generated from hosts: the dump validates again
        return doc

    def tree(self, executors: int | None = None) -> Tree:
        """The tree of this topology (node ids). With ``nodes`` or ``hosts`` the topology
        is the tree and ``executors`` is ignored; with ``branching`` alone it is
        :func:`kary_tree` of ``executors`` nodes ``e0..``. Raises TopologyError when a
        branching topology gets no executor count or more than MAX_NODES."""
        if self.nodes is not None:
            return Tree.from_specs(self.nodes)
        if executors is None:
            raise TopologyError("branching: a tree by branching factor needs the executor count")
        if executors > MAX_NODES:
            raise TopologyError(f"executors: at most {MAX_NODES} nodes, got {executors}")
        assert self.branching is not None
        return kary_tree(executors, self.branching, second_parents=self.second_parents)

    def spec(self, node_id: str) -> NodeSpec:
        """The node ``node_id`` of ``nodes`` (or generated from ``hosts``). Raises
        KeyError for an unknown id or a branching topology (no listed nodes)."""
        for n in self.nodes or ():
            if n.id == node_id:
                return n
        raise KeyError(f"node {node_id!r} is not listed in the topology")

    def advertised(self, node_id: str) -> str | None:
        """The endpoint others connect to for node ``node_id`` (:attr:`NodeSpec.advertised`):
        None when it is only known once the node runs (``bind: auto``, port 0) and for
        every node of a branching topology. Raises KeyError for an id not listed when
        the topology lists its nodes."""
        if self.nodes is None:
            return None
        return self.spec(node_id).advertised

    def host_nodes(self) -> dict[str, str]:
        """``{host: advertised endpoint}`` of the nodes tied to a host, in node order;
        empty when no node names a host (explicit local trees, branching topologies)."""
        return {n.host: n.advertised for n in self.nodes or () if n.host and n.advertised}

    def node_for_host(self, host: str) -> str | None:
        """The id of the node whose ``host`` is ``host`` (names compared without case,
        IPv6 brackets ignored), or None when no node is tied to that host."""
        want = host.strip("[]").lower()
        for n in self.nodes or ():
            if n.host is not None and n.host.strip("[]").lower() == want:
                return n.id
        return None

    def link_settings(self) -> dict[str, Any]:
        """How a client (a task's writer, a bridge) talks to its nodes, as the nodes do
        to their parents: ``{"wire_versions", "ping_interval", "liveness_timeout"}``
        (keywords of ``ChangelogClient.open``; versions None: every version the client
        speaks)."""
        return {
            "wire_versions": self.wire_versions,
            "ping_interval": self.ping_interval,
            "liveness_timeout": self.liveness_timeout,
        }

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


def _check_hosts(cfg: TopologyConfig) -> None:
    """Raise ValueError (naming the field) unless ``hosts`` is a list of distinct hosts
    given with ``branching`` and ``node_port`` and without ``nodes``."""
    assert cfg.hosts is not None
    if cfg.nodes is not None:
        raise ValueError("hosts: give either 'hosts' (one node per host) or 'nodes', not both")
    if not cfg.hosts:
        raise ValueError("hosts: at least one host is needed")
    seen: dict[str, int] = {}
    for i, h in enumerate(cfg.hosts):
        try:
            check_host(h)
        except ValueError as e:
            raise ValueError(f"hosts[{i}]: {e}") from None
        if h.lower() in seen:
            raise ValueError(f"hosts[{i}]: duplicate host {h!r} (also hosts[{seen[h.lower()]}])")
        seen[h.lower()] = i
    if cfg.node_port is None:
        raise ValueError("node_port: needed with 'hosts' (the port of every host's node)")
    if cfg.branching is None:
        raise ValueError("branching: needed with 'hosts' (children per node)")


def _host_nodes(cfg: TopologyConfig, hosts: list[str], branching: int, port: int) -> list[NodeSpec]:
    """One node ``n<i>`` per host; host i's parent is host (i - 1) // branching, its
    second parent (``cfg.second_parents``) :func:`second_parent_indices`' choice."""
    second = second_parent_indices(len(hosts), branching) if cfg.second_parents else {}
    out = []
    for i, h in enumerate(hosts):
        endpoint = tcp_endpoint(h, port)
        parents: tuple[str, ...] = () if i == 0 else (f"n{(i - 1) // branching}",)
        if i in second:
            parents += (f"n{second[i]}",)
        out.append(
            NodeSpec(
                id=f"n{i}",
                bind=f"tcp://0.0.0.0:{port}" if cfg.bind_all else endpoint,
                parents=parents or None,
                host=h,
                advertise=endpoint,
            )
        )
    return out


def _check_nodes(nodes: list[NodeSpec]) -> None:
    if not nodes:
        raise ValueError("nodes: at least one node is needed")
    ids: set[str] = set()
    hosts: dict[str, str] = {}
    for i, n in enumerate(nodes):
        if n.id in ids:
            raise ValueError(f"nodes[{i}].id: duplicate node id {n.id!r}")
        ids.add(n.id)
        if n.host is not None and n.host.lower() in hosts:
            raise ValueError(
                f"nodes[{i}].host: duplicate host {n.host!r} (node {hosts[n.host.lower()]!r})"
            )
        if n.host is not None:
            hosts[n.host.lower()] = n.id
    for i, n in enumerate(nodes):
        for j, p in enumerate(n.parent_ids):
            where = f"nodes[{i}].parents[{j}]" if n.parents is not None else f"nodes[{i}].parent"
            if p not in ids:
                raise ValueError(f"{where}: unknown node {p!r} (node {n.id!r} has no way up there)")
            if p == n.id:
                raise ValueError(f"{where}: node {n.id!r} is its own parent")
            if p in n.parent_ids[:j]:
                raise ValueError(f"{where}: node {n.id!r} names parent {p!r} twice")
    try:
        Tree.from_specs(nodes)
    except TopologyError as e:
        raise ValueError(str(e)) from e


_NAMES_FIELD = re.compile(r"^[a-z_]+(\[\d+\])?(\.[a-z_]+)?: ")


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _format_error(source: str, err: ValidationError) -> str:
    parts = []
    errors = err.errors()
    for e in errors[:MAX_ERRORS]:
        loc = ".".join(f"[{p}]" if isinstance(p, int) else _clip(str(p)) for p in e["loc"])
        loc = loc.replace(".[", "[")
        msg = _clip(e["msg"].removeprefix("Value error, "), 500)
        if not loc and _NAMES_FIELD.match(msg):
            parts.append(f"{source}: {msg}")  # a check across fields names the field itself
        else:
            parts.append(f"{source}: {loc or '(top level)'}: {msg}")
    if len(errors) > MAX_ERRORS:
        parts.append(f"{source}: ... and {len(errors) - MAX_ERRORS} more errors")
    return "\n".join(parts)


_CONTAINERS = (dict, list, tuple, set, frozenset)


def _check_bounds(data: dict[Any, Any], source: str) -> None:
    """Raise TopologyError naming the top-level field whose value nests deeper than
    MAX_DEPTH, holds a key or string longer than MAX_STRING, or (with YAML aliases
    expanded) brings the document past MAX_VALUES values. Iterative: no recursion."""
    count = 0
    for field, value in data.items():
        name = _clip(str(field))
        stack: list[tuple[Any, int]] = [([field, value], 0)]
        while stack:
            obj, depth = stack.pop()
            if depth > MAX_DEPTH:
                raise TopologyError(f"{source}: {name}: nested deeper than {MAX_DEPTH} levels")
            items = [x for kv in obj.items() for x in kv] if isinstance(obj, dict) else obj
            count += len(items)
            if count > MAX_VALUES:
                raise TopologyError(f"{source}: {name}: more than {MAX_VALUES} values")
            for x in items:
                if isinstance(x, _CONTAINERS):
                    stack.append((x, depth + 1))
                elif isinstance(x, (str, bytes)) and len(x) > MAX_STRING:
                    raise TopologyError(f"{source}: {name}: a string longer than {MAX_STRING}")


def parse_topology(data: Any, source: str = "topology") -> TopologyConfig:
    """Validate a mapping as a topology. Raises :class:`TopologyError` naming the field
    (also for values beyond the limits in the module docstring)."""
    if not isinstance(data, dict):
        raise TopologyError(f"{source}: expected a mapping at the top level")
    _check_bounds(data, source)
    try:
        return TopologyConfig.model_validate(data)
    except ValidationError as e:
        raise TopologyError(_format_error(source, e)) from e
    except (TypeError, ValueError, KeyError, OverflowError, RecursionError) as e:
        raise TopologyError(f"{source}: invalid topology: {_clip(str(e), 500)}") from e


# libyaml's parser when PyYAML was built with it (about 5x faster), else pure Python
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _marked(problem: str, event: Any) -> yaml.MarkedYAMLError:
    """A YAML error at ``event``'s position (its mark: pure-Python or libyaml's)."""
    return yaml.MarkedYAMLError(problem=problem, problem_mark=event.start_mark)


def _load_yaml(text: str) -> Any:
    """The YAML document in ``text``, loaded safely once its event stream (parsed
    iteratively) shows at most MAX_DEPTH nesting levels and MAX_ALIASES aliases, so the
    recursive composer cannot overflow. Raises yaml.YAMLError (with a mark) and, for
    malformed tagged scalars, whatever PyYAML's constructors raise."""
    depth = aliases = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise _marked(f"nested deeper than {MAX_DEPTH} levels", event)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise _marked(f"more than {MAX_ALIASES} aliases", event)
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader


def _yaml_error(p: Path, e: Exception) -> TopologyError:
    """One line: the file, the line and column when known, what is wrong."""
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = e.problem or e.context or "malformed"
        return TopologyError(f"{p}: not valid YAML{where}: {_clip(what)}")
    return TopologyError(f"{p}: not valid YAML: {_clip(f'{type(e).__name__}: {e}')}")


def _read_text(p: Path) -> str:
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise TopologyError(f"{p}: cannot read topology: {e.strerror or e}") from e
    if len(raw) > MAX_FILE_BYTES:
        raise TopologyError(f"{p}: a topology file has at most {MAX_FILE_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TopologyError(f"{p}: not UTF-8 at byte {e.start}: {e.reason}") from None


def load_topology(path: str | Path, **overrides: Any) -> TopologyConfig:
    """Read and validate a topology YAML file (a path, or the short name of a shipped
    topology: :func:`dstltree.topology.catalog.topology_path`); ``overrides`` replace
    top-level fields.

    Raises :class:`TopologyError` for unreadable, oversized or non-UTF-8 files (with
    the byte offset), bad YAML (with line and column) or fields (naming the field).
    """
    p = topology_path(path)
    text = _read_text(p)
    try:
        data = _load_yaml(text)
    except Exception as e:  # noqa: BLE001 - any failure of the YAML library is a bad file
        raise _yaml_error(p, e) from None
    if isinstance(data, dict):
        data.update({k: v for k, v in overrides.items() if v is not None})
    return parse_topology(data, source=str(p))
