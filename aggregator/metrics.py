"""Prometheus metrics of one aggregator node (the FLIP-158 monitoring list and more).

Every node has its own :class:`prometheus_client.CollectorRegistry` (several nodes may
share one process in tests) and, unless its port is None, serves it as text on
``http://HOST:PORT/metrics``. Every metric carries the label ``node`` (the node id).

DFS requests (one per object a collector uploads; hedged attempts of the same upload
count once here):

- ``dstl_dfs_request_size_bytes`` (histogram): segment bytes in the object, i.e. the
  request body without the object's small index and footer.
- ``dstl_dfs_request_latency_seconds`` (histogram): from the start of the upload to the
  winning attempt's completion (or to the failure), retries and hedges included.
- ``dstl_dfs_request_segments`` (histogram): segments ("logs" in FLIP-158) per object.
- ``dstl_dfs_errors_total``: uploads that failed (every attempt failed, or one failed
  with a non-retryable error); their persists are failed and retried by the writers.
- ``dstl_dfs_retries_total``: store-level retries of transient errors inside attempts.
- ``dstl_dfs_hedged_attempts_total``: extra attempts started because an attempt was
  slower than the upload timeout.

Node counters, from :class:`dstltree.aggregator.core.NodeStatistics` (bytes are segment bytes):
``dstl_objects_written_total``, ``dstl_segments_written_total`` and
``dstl_bytes_written_total`` (these three advance with the DFS request of each object
written, in one step a scrape sees whole: a scrape never shows a request without its
object, or an object without its request), ``dstl_bytes_received_total``,
``dstl_bytes_relayed_total`` (received from a child node and sent on),
``dstl_bytes_forwarded_total`` (sent upstream, own and relayed),
``dstl_parent_timeouts_total``, ``dstl_plan_changes_total``,
``dstl_rejected_messages_total``, ``dstl_messages_below_total`` (every message from
below, malformed ones included); drops and refusals of hostile or excess input:
``dstl_refused_checkpoints_total`` (checkpoint ids outside the window),
``dstl_refused_peers_total`` (writers or children beyond the node's bounds),
``dstl_horizon_resets_total``, ``dstl_plans_resent_total``,
``dstl_undeliverable_replies_total`` (replies the ROUTER could not deliver),
``dstl_undeliverable_upstream_total`` (sends upstream refused by a full queue),
``dstl_malformed_upstream_total`` (undecodable messages from upstream, dropped),
``dstl_backpressure_pauses_total`` and ``dstl_backpressure_seconds_total`` (times and
seconds the node stopped reading from below because its backlog was full),
``dstl_loop_writes_total`` (objects the loop wrote itself) and
``dstl_loop_takeovers_total`` (such writes that hung long enough for a deputy thread
to serve the loop meanwhile). The node refreshes these counters and the gauges below
from its statistics every half second or so (:meth:`NodeMetrics.update`). Gauges:
``dstl_backlog_bytes`` (batched or being written), ``dstl_queued_bytes`` (in the batch, not yet
flushed), ``dstl_in_flight_items`` (sent upstream, not yet acked),
``dstl_writers_below`` (residual writers of the subtree), ``dstl_writes_for_window``
(1 if this node writes the objects of the current plan window), ``dstl_plan_window``
(current plan window, -1 before the first checkpoint), ``dstl_parent_down`` (1 while
the parent is marked unreachable).

Liveness and wire versions (client/liveness.py, client/wire.py), counters too:
``dstl_pings_answered_total``, ``dstl_wire_refusals_total`` (messages refused for no
common wire version), ``dstl_upstream_silences_total`` and
``dstl_upstream_refusals_total`` (upstream nodes left as silent or refusing).

Ports (topology ``metrics_port``, see :func:`metrics_port_for`): a base port, node k
in breadth-first order listens on base + k; 0 lets every node pick a free port; None
(the default) serves nothing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram

from dstltree.client.metrics_endpoint import ConsistentRegistry, MetricsEndpoint

if TYPE_CHECKING:
    from dstltree.aggregator.core import NodeStatistics
    from dstltree.topology.config import TopologyConfig

log = logging.getLogger("dstltree.metrics")

#: Request size buckets, bytes: 1 KiB to 256 MiB in steps of 4x.
SIZE_BUCKETS = tuple(float(1024 * 4**i) for i in range(10))
#: Request latency buckets, seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Segments per request buckets.
SEGMENT_BUCKETS = tuple(float(2**i) for i in range(12))

# NodeStatistics field -> counter name (without the ``_total`` suffix).
_COUNTERS = {
    "objects_written": "dstl_objects_written",
    "segments_written": "dstl_segments_written",
    "bytes_written": "dstl_bytes_written",
    "bytes_received": "dstl_bytes_received",
    "bytes_relayed": "dstl_bytes_relayed",
    "bytes_forwarded": "dstl_bytes_forwarded",
    "parent_timeouts": "dstl_parent_timeouts",
    "plan_changes": "dstl_plan_changes",
    "rejected_messages": "dstl_rejected_messages",
    "messages_below": "dstl_messages_below",
    "refused_checkpoints": "dstl_refused_checkpoints",
    "refused_peers": "dstl_refused_peers",
    "horizon_resets": "dstl_horizon_resets",
    "plans_resent": "dstl_plans_resent",
    "undeliverable_replies": "dstl_undeliverable_replies",
    "undeliverable_upstream": "dstl_undeliverable_upstream",
    "malformed_upstream": "dstl_malformed_upstream",
    "backpressure_pauses": "dstl_backpressure_pauses",
    "backpressure_seconds": "dstl_backpressure_seconds",
    "loop_writes": "dstl_loop_writes",
    "loop_takeovers": "dstl_loop_takeovers",
    "pings_answered": "dstl_pings_answered",
    "wire_refusals": "dstl_wire_refusals",
    "upstream_silences": "dstl_upstream_silences",
    "upstream_refusals": "dstl_upstream_refusals",
}
_COUNTER_HELP = {
    "objects_written": "Objects this node wrote to DFS.",
    "segments_written": "Segments in the objects this node wrote.",
    "bytes_written": "Segment bytes in the objects this node wrote.",
    "bytes_received": "Segment bytes received from writers and child nodes.",
    "bytes_relayed": "Segment bytes received from child nodes and sent upstream.",
    "bytes_forwarded": "Segment bytes sent upstream (own writers' and relayed).",
    "parent_timeouts": "Times items sent upstream were not acked in time.",
    "plan_changes": "Times the planned collector of a plan window changed.",
    "rejected_messages": "Malformed or unexpected messages answered with an error.",
    "messages_below": "Messages received from writers and child nodes (any, malformed too).",
    "refused_checkpoints": "Checkpoint ids refused: outside the window around the horizon.",
    "refused_peers": "Writers or child nodes refused beyond the node's bounds.",
    "horizon_resets": "Times the checkpoint horizon reset (no live peer held it).",
    "plans_resent": "Plans sent again (lost, undeliverable, or the child reconnected).",
    "undeliverable_replies": "Replies the ROUTER could not deliver (peer gone, queue full).",
    "undeliverable_upstream": "Messages upstream refused by a full queue (items time out).",
    "malformed_upstream": "Undecodable messages from upstream nodes, dropped.",
    "backpressure_pauses": "Times the node stopped reading from below (backlog full).",
    "backpressure_seconds": "Seconds the node did not read from below (backlog full).",
    "loop_writes": "Objects the node's loop wrote itself (no other write was running).",
    "loop_takeovers": "Writes on the loop that lasted so long that a deputy served the loop.",
    "pings_answered": "Pings from writers and child nodes answered by the node's loop.",
    "wire_refusals": "Messages refused for no common wire version (hellos and what followed).",
    "upstream_silences": "Upstream nodes lost after the liveness timeout without a message.",
    "upstream_refusals": "Upstream nodes that refused this node's wire versions.",
}
# HedgingStats field -> counter name.
_UPLOAD_COUNTERS = {
    "retries": ("dstl_dfs_retries", "Store-level retries of transient DFS errors."),
    "hedged_attempts": (
        "dstl_dfs_hedged_attempts",
        "Extra upload attempts started because an attempt exceeded the upload timeout.",
    ),
}


def metrics_port_for(topology: TopologyConfig, node_id: str) -> int | None:
    """The metrics port of ``node_id``: None if the topology's ``metrics_port`` is None
    (off), 0 if it is 0 (a free port), else ``metrics_port + k`` with k the node's
    breadth-first index in the tree (for a ``branching`` topology the node ids
    ``e0, e1, ...`` are in breadth-first order already). Raises KeyError for an
    unknown node id and ValueError if the port would exceed 65535."""
    port = topology.metrics_port
    if port is None or port == 0:
        return port
    if topology.nodes is not None:
        order = topology.tree().nodes
        if node_id not in order:
            raise KeyError(f"node {node_id!r} is not in the topology")
        k = order.index(node_id)
    else:
        m = re.fullmatch(r"e(\d+)", node_id)
        if m is None:
            raise KeyError(f"node {node_id!r} is not a node of a branching topology")
        k = int(m.group(1))
    if port + k > 65535:
        raise ValueError(f"metrics port {port} + {k} for node {node_id!r} exceeds 65535")
    return port + k


class NodeMetrics:
    """The metrics of node ``node_id``; served on ``host:port`` (0 = a free port, see
        :attr:`port` and :attr:`url`; None = not served, still recorded). Raises OSError
        if the port cannot be bound. Thread-safe: every update is seen whole by a scrape
    (:class:`ConsistentRegistry`); :meth:`close` stops the server."""

    def __init__(self, node_id: str, port: int | None, host: str = "127.0.0.1") -> None:
        self.node_id = node_id
        self.registry = ConsistentRegistry()
        self._upload_metrics(node_id)
        self._state_gauges(node_id)
        self._lock = self.registry.updating
        self.endpoint = MetricsEndpoint(self.registry, host, port)
        self.host = host
        self.port = self.endpoint.port

    def _upload_metrics(self, node_id: str) -> None:
        """Histograms and counters of DFS uploads and the node's counters."""
        r, lbl = self.registry, ["node"]
        self.request_size = Histogram(
            "dstl_dfs_request_size_bytes",
            "Segment bytes per DFS object upload.",
            lbl,
            registry=r,
            buckets=SIZE_BUCKETS,
        ).labels(node_id)
        self.request_latency = Histogram(
            "dstl_dfs_request_latency_seconds",
            "Seconds per DFS object upload (hedges and retries included).",
            lbl,
            registry=r,
            buckets=LATENCY_BUCKETS,
        ).labels(node_id)
        self.request_segments = Histogram(
            "dstl_dfs_request_segments",
            "Segments (FLIP-158 'logs') per DFS object upload.",
            lbl,
            registry=r,
            buckets=SEGMENT_BUCKETS,
        ).labels(node_id)
        self.errors = Counter(
            "dstl_dfs_errors", "DFS object uploads that failed.", lbl, registry=r
        ).labels(node_id)
        self._counters = {
            field: Counter(name, _COUNTER_HELP[field], lbl, registry=r).labels(node_id)
            for field, name in _COUNTERS.items()
        }
        self._upload_counters = {
            field: Counter(name, text, lbl, registry=r).labels(node_id)
            for field, (name, text) in _UPLOAD_COUNTERS.items()
        }
        self._last: dict[str, float] = {}

    def _state_gauges(self, node_id: str) -> None:
        """Gauges of the node's current state (batch, in flight, plan, parent)."""
        r, lbl = self.registry, ["node"]
        self.queued_bytes = Gauge(
            "dstl_queued_bytes", "Segment bytes queued in the batch (bytes).", lbl, registry=r
        ).labels(node_id)
        self.backlog_bytes = Gauge(
            "dstl_backlog_bytes",
            "Segment bytes batched or being written (bytes).",
            lbl,
            registry=r,
        ).labels(node_id)
        self.in_flight = Gauge(
            "dstl_in_flight_items", "Items sent upstream and not yet acked.", lbl, registry=r
        ).labels(node_id)
        self.writers_below = Gauge(
            "dstl_writers_below", "Residual writers of this node's subtree.", lbl, registry=r
        ).labels(node_id)
        self.writes_for_window = Gauge(
            "dstl_writes_for_window",
            "1 if this node writes for the current plan window.",
            lbl,
            registry=r,
        ).labels(node_id)
        self.plan_window = Gauge(
            "dstl_plan_window", "Current plan window (-1: none yet).", lbl, registry=r
        ).labels(node_id)
        self.plan_window.set(-1)
        self.parent_down = Gauge(
            "dstl_parent_down", "1 while the parent is marked unreachable.", lbl, registry=r
        ).labels(node_id)

    @property
    def url(self) -> str | None:
        """``http://host:port/metrics``, or None when not served."""
        return self.endpoint.url

    def observe_upload(self, size_bytes: int, segments: int, latency_s: float, ok: bool) -> None:
        """One object upload: ``size_bytes`` segment bytes, ``segments`` segments,
        ``latency_s`` seconds from start to success or failure; ``ok`` False counts an
        error (its size and segments are still recorded: the request was made), True
        counts the object, its segments and bytes as written in the same step (the
        node's statistics count them a moment later: :meth:`update` does not count them
        twice)."""
        with self._lock:
            self.request_size.observe(size_bytes)
            self.request_segments.observe(segments)
            self.request_latency.observe(latency_s)
            if not ok:
                self.errors.inc()
                return
            for field, n in (
                ("objects_written", 1),
                ("segments_written", segments),
                ("bytes_written", size_bytes),
            ):
                self._counters[field].inc(n)
                self._last[field] = self._last.get(field, 0) + n

    def update(self, stats: NodeStatistics, uploads: Mapping[str, int] | None = None) -> None:
        """Bring the metrics up to date with the node's cumulative ``stats`` and, if
        given, its uploader's cumulative counters (``HedgingStats.snapshot()``):
        counters grow by the difference to the highest value counted so far (objects
        :meth:`observe_upload` counted already are not counted again)."""
        with self._lock:
            for field, counter in self._counters.items():
                self._advance(field, counter, getattr(stats, field))
            for field, counter in self._upload_counters.items():
                if uploads is not None and field in uploads:
                    self._advance("up." + field, counter, int(uploads[field]))
            self.queued_bytes.set(stats.queued_bytes)
            self.backlog_bytes.set(stats.backlog_bytes)
            self.in_flight.set(stats.in_flight_up)
            self.writers_below.set(stats.writers_below)
            self.writes_for_window.set(1 if stats.writes_for_window else 0)
            self.plan_window.set(-1 if stats.plan_window is None else stats.plan_window)
            self.parent_down.set(1 if stats.parent_down else 0)

    def _advance(self, key: str, counter: Any, value: float) -> None:
        last = self._last.get(key, 0)
        if value > last:
            counter.inc(value - last)
        self._last[key] = max(value, last)

    def close(self) -> None:
        """Stop serving (idempotent). Recording still works afterwards."""
        self.endpoint.close()
