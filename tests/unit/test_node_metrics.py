"""The node's metrics as a scraper reads them: a DFS request and the object it wrote are
counted in one step (never one without the other), and the node's statistics, which
count the same objects a moment later, do not count them twice."""

from __future__ import annotations

import threading
from dataclasses import replace

from dstltree.aggregator.core import NodeStatistics
from dstltree.aggregator.metrics import NodeMetrics

UPLOADS = 3000


def _value(m: NodeMetrics, name: str) -> float:
    got = m.registry.get_sample_value(name, {"node": m.node_id})
    assert got is not None, name
    return got


def _stats(objects: int, segments: int, nbytes: int) -> NodeStatistics:
    return NodeStatistics(
        "n", 0, objects, nbytes, segments, 0, 0, 0, 0, 0, 0, 0, 0, False, 0, None, False
    )


def test_a_scrape_never_sees_a_request_without_its_object() -> None:
    """A write thread records uploads while another collects the registry (what a
    scrape does) again and again: every collection shows as many objects as requests,
    the same segments and bytes as the requests' sums."""
    m = NodeMetrics("n", None)
    done = threading.Event()

    def record() -> None:
        for k in range(UPLOADS):
            m.observe_upload(100 + k % 7, 1 + k % 3, 0.001, ok=True)
        done.set()

    writer = threading.Thread(target=record)
    writer.start()
    seen: list[float] = []
    try:
        while not done.is_set() or not seen or seen[-1] < UPLOADS:
            samples = {
                s.name: s.value for fam in m.registry.collect() for s in fam.samples if s.labels
            }
            objects = samples["dstl_objects_written_total"]
            assert samples["dstl_dfs_request_size_bytes_count"] == objects
            assert samples["dstl_dfs_request_latency_seconds_count"] == objects
            assert samples["dstl_dfs_request_segments_count"] == objects
            assert (
                samples["dstl_segments_written_total"] == samples["dstl_dfs_request_segments_sum"]
            )
            assert samples["dstl_bytes_written_total"] == samples["dstl_dfs_request_size_bytes_sum"]
            seen.append(objects)
    finally:
        writer.join(timeout=60)
    assert not writer.is_alive()
    assert seen == sorted(seen) and seen[-1] == UPLOADS


def test_statistics_after_the_uploads_count_nothing_twice() -> None:
    m = NodeMetrics("n", None)
    m.update(_stats(0, 0, 0))
    m.observe_upload(1000, 2, 0.01, ok=True)
    m.observe_upload(500, 1, 0.01, ok=True)
    m.observe_upload(700, 4, 0.01, ok=False)  # a failed upload: a request, no object
    assert _value(m, "dstl_objects_written_total") == 2
    assert _value(m, "dstl_dfs_request_segments_count") == 3
    assert _value(m, "dstl_dfs_errors_total") == 1
    # the node's statistics catch up with the two objects (one of them first)
    m.update(_stats(1, 2, 1000))
    m.update(_stats(2, 3, 1500))
    assert _value(m, "dstl_objects_written_total") == 2
    assert _value(m, "dstl_segments_written_total") == 3
    assert _value(m, "dstl_bytes_written_total") == 1500
    # an object the statistics count that no upload recorded still counts once
    m.update(replace(_stats(3, 4, 1600), messages_below=9))
    assert _value(m, "dstl_objects_written_total") == 3
    assert _value(m, "dstl_bytes_written_total") == 1600
    assert _value(m, "dstl_messages_below_total") == 9
    m.close()
