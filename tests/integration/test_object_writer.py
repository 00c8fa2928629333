"""Every node owns its object writer: two nodes in one process with different upload
policies hedge, count and remember latencies separately, and the node's write path
(segments received over ZeroMQ, object written off the loop) goes through its writer."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from dstltree.aggregator.core import NodeConfig
from dstltree.aggregator.node import Node
from dstltree.aggregator.object_writer import ObjectWriter
from dstltree.client import ChangelogClient, ChangelogHandle
from dstltree.client.node_uploader import NodeUploader
from dstltree.client.reader import read_changes, read_index
from dstltree.storage.faults import FaultyFileSystem
from dstltree.storage.hedging import UploadPolicy
from dstltree.storage.store import NO_RETRY, ObjectStore
from tests.support.items import persist_item
from tests.support.memory_fs import faulty_memory

pytestmark = pytest.mark.timeout(60)

HEDGING = UploadPolicy(attempts=2, upload_timeout=0.05)
NO_HEDGING = UploadPolicy(attempts=1)


@pytest.fixture
def faulty() -> Iterator[FaultyFileSystem]:
    """An in-memory fs whose stalls last until released (at teardown at the latest)."""
    with faulty_memory() as fs:
        yield fs


def _node(node_id: str, store: ObjectStore, policy: UploadPolicy) -> Node:
    cfg = NodeConfig(node_id=node_id, parent_address=None, target_bytes=1 << 20)
    return Node(cfg, store, upload_policy=policy)


def _persist(node: Node, store: ObjectStore, log_id: str, change: bytes) -> ChangelogHandle:
    client = ChangelogClient(store, NodeUploader(node.address, store, ack_timeout=30), 1 << 20)
    try:
        w = client.create_writer(log_id, range(2))
        w.append(1, change)
        return w.persist_durably(0, checkpoint_id=1).result(timeout=30)
    finally:
        client.close()


def test_two_nodes_in_one_process_share_no_writer_state(faulty: FaultyFileSystem) -> None:
    store = ObjectStore(f"memory://ow-{uuid.uuid4().hex[:8]}", fs=faulty, retry=NO_RETRY)
    hedging, plain = _node("hedging", store, HEDGING), _node("plain", store, NO_HEDGING)
    assert hedging.writer is not plain.writer
    assert hedging.writer.uploader is not plain.writer.uploader
    assert (hedging.writer.policy, plain.writer.policy) == (HEDGING, NO_HEDGING)
    threads = [hedging.start(), plain.start()]
    try:
        faulty.inject("put", "stall")  # the first object write hangs: only a hedge wins
        h = _persist(hedging, store, "via-hedging", b"h")
        p = _persist(plain, store, "via-plain", b"p")
    finally:
        faulty.release()
        hedging.stop()
        plain.stop()
        for t in threads:
            t.join(10)
    assert list(read_changes(store, h, 1)) == [b"h"]
    assert list(read_changes(store, p, 1)) == [b"p"]
    assert [e.log_id for e in read_index(store, h.segments[0].path)] == ["via-hedging"]
    assert hedging.writer.drain(10) and plain.writer.drain(10)
    a, b = hedging.writer.upload_stats(), plain.writer.upload_stats()
    assert (a["uploads"], a["attempts"], a["hedged_attempts"], a["hedge_wins"]) == (1, 2, 1, 1)
    assert a["losers"] == 1 and a["losers_deleted"] == 1
    assert (b["uploads"], b["attempts"], b["hedged_attempts"]) == (1, 1, 0)
    assert sorted(store.list_objects()) == sorted({h.segments[0].path, p.segments[0].path})


def test_object_writer_latency_history_is_its_own(tmp_path: object) -> None:
    store = ObjectStore(str(tmp_path))
    adaptive = UploadPolicy(
        upload_timeout=5.0, adaptive_percentile=50, adaptive_floor=1.0, adaptive_min_samples=2
    )
    busy, idle = ObjectWriter(store, adaptive), ObjectWriter(store, adaptive)
    for sqn in range(2):
        path, refs = busy.write([persist_item("w", sqn, {0: [b"x"]})])
        assert [r.path for r in refs] == [path]
    assert busy.uploader.current_timeout() == 1.0, "fast writes: the floor"
    assert idle.uploader.current_timeout() == 5.0, "no samples of its own yet"
    assert (busy.upload_stats()["uploads"], idle.upload_stats()["uploads"]) == (2, 0)


def test_a_hung_first_attempt_holds_a_thread_not_a_write_slot(faulty: FaultyFileSystem) -> None:
    store = ObjectStore(f"memory://ow-{uuid.uuid4().hex[:8]}", fs=faulty, retry=NO_RETRY)
    cfg = NodeConfig(node_id="one-slot", parent_address=None, target_bytes=1 << 20)
    # every write on a write thread (the loop's own writes have their deputy instead:
    # test_node_forwarding.py)
    node = Node(cfg, store, upload_threads=1, upload_policy=HEDGING, loop_writes=False)
    thread = node.start()
    try:
        faulty.inject("put", "stall")  # the first write's own attempt hangs
        first = _persist(node, store, "first", b"1")  # decided by its hedge
        second = _persist(node, store, "second", b"2")  # the one slot is free again
        assert node._write_threads.threads_started() == 2, "the hung attempt keeps its own"
    finally:
        faulty.release()
        node.stop()
        thread.join(10)
    assert list(read_changes(store, first, 1)) == [b"1"]
    assert list(read_changes(store, second, 1)) == [b"2"]
    assert node.writer.drain(10)
    assert node.writer.upload_stats()["losers_deleted"] == 1


def test_a_node_writes_the_object_format_its_topology_names(tmp_path: object) -> None:
    """Two nodes, one per object format: each object's footer and index carry the
    node's format (version 2 also its writer), and a reader reads both."""
    from dstltree.client.objectformat import FOOTER, FOOTER_SIZE
    from dstltree.topology.config import parse_topology

    store = ObjectStore(str(tmp_path))
    topo = parse_topology({"nodes": [{"id": "v2"}], "object_format": 2})
    cfg = NodeConfig(node_id="v2", parent_address=None, target_bytes=1 << 20)
    nodes = {
        1: _node("v1", store, NO_HEDGING),
        2: Node(cfg, store, upload_policy=NO_HEDGING, object_format=topo.object_format),
    }
    threads = [n.start() for n in nodes.values()]
    try:
        handles = {v: _persist(n, store, f"via-v{v}", b"v%d" % v) for v, n in nodes.items()}
    finally:
        for n in nodes.values():
            n.stop()
        for t in threads:
            t.join(timeout=10)
    for version, h in handles.items():
        path = h.segments[0].path
        size = store.size(path)
        footer = FOOTER.unpack(store.read_range(path, size - FOOTER_SIZE, FOOTER_SIZE))
        assert footer[1] == version
        assert read_index(store, path)[0].log_id == f"via-v{version}"
        assert list(read_changes(store, h, 1)) == [b"v%d" % version]
    with pytest.raises(ValueError, match="object_format"):
        parse_topology({"nodes": [{"id": "n"}], "object_format": 3})
