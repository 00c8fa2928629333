"""The bridge's Prometheus metrics: :class:`~.files.TreeFiles`'s counters and the bytes
it holds, collected when scraped (``dstl bridge --metrics-port``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from dstltree.structured_streaming.files import TreeFiles

#: TreeFiles.counts keys -> (metric name without ``_total``, help)
COUNTERS = {
    "puts": ("dstltree_bridge_puts", "State files accepted."),
    "deletes": ("dstltree_bridge_deletes", "State files deleted (tombstones written)."),
    "held": ("dstltree_bridge_held", "Writes held for their query's commit."),
    "flushes": ("dstltree_bridge_flushes", "Persists of held writes together."),
    "durable": ("dstltree_bridge_durable", "Writes that became durable."),
    "failed": ("dstltree_bridge_failed", "Writes that failed (the next commit fails)."),
    "manifests": ("dstltree_bridge_manifests", "Manifests written."),
    "objects_deleted": ("dstltree_bridge_objects_deleted", "Objects released and deleted."),
    "orphans_deleted": (
        "dstltree_bridge_orphans_deleted",
        "Orphans deleted by the sweep (copies of writes sent twice, failed writes).",
    ),
}


class BridgeCollector:
    """Collects ``files``' counters and held, pending and in-flight bytes."""

    def __init__(self, files: TreeFiles) -> None:
        self.files = files

    def collect(self) -> Iterator[Metric]:
        f = self.files
        with f.cond:
            counts = dict(f.counts)
            gauges = {
                "pending": f.pending_bytes,
                "in_flight": f.in_flight_bytes,
                "held": f.held_bytes,
            }
            roots = len(f.view.roots)
        for key, (name, doc) in COUNTERS.items():
            c = CounterMetricFamily(name, doc)
            c.add_metric([], counts.get(key, 0))
            yield c
        g = GaugeMetricFamily("dstltree_bridge_bytes", "Bytes in memory, by kind.", labels=["kind"])
        for kind, n in gauges.items():
            g.add_metric([kind], n)
        yield g
        yield GaugeMetricFamily("dstltree_bridge_queries", "Query roots served.", value=roots)


def bridge_registry(files: TreeFiles) -> CollectorRegistry:
    """A registry holding only the bridge's collector."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(BridgeCollector(files))
    return registry
