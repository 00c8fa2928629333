"""Forwarding through in-process nodes (threads of this process, real sockets over
loopback, a local store): a chain passes on more than a message may carry without any
refusal or parent timeout, and every persist is acked by the root and reads back."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

from dstltree.aggregator.core import NodeConfig
from dstltree.aggregator.node import Node
from dstltree.client import ChangelogClient
from dstltree.client.handle import ChangelogHandle
from dstltree.client.node_uploader import NodeUploader
from dstltree.client.reader import read_changes
from dstltree.storage.store import ObjectStore
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

MAX_MESSAGE = 256 * 1024  # bytes: the nodes' max_message_bytes


@contextmanager
def _chain(base: str, depth: int, delay: float = 0.2, **node_kw: object) -> Iterator[list[Node]]:
    """``depth`` nodes, root first; the root writes objects of 64 KiB, the others only
    pass items on (hop by hop, no plans); ``delay``: their persist delay (s)."""
    store = ObjectStore(base)
    nodes: list[Node] = []
    try:
        for i in range(depth):
            parent = nodes[-1].address if nodes else None
            size = 64 * 1024 if parent is None else 1 << 40
            cfg = NodeConfig(f"n{i}", parent, size, plans=False, persist_delay=delay)
            node = Node(cfg, store, security=None, **node_kw)  # type: ignore[arg-type]
            node.start()
            nodes.append(node)
        yield nodes
    finally:
        for n in reversed(nodes):
            n.stop()


def test_a_chain_passes_on_more_than_one_message_may_carry(tmp_path: Path) -> None:
    """Within one persist delay the leaf gathers 4x the message limit: it passes the
    items on in several messages, none refused by the root, none timed out."""
    base = str(tmp_path / "dfs")
    bodies = [os.urandom(40 * 1024) for _ in range(26)]  # 1 MiB+ in 40 KiB segments
    with (
        _chain(base, 2, max_message_bytes=MAX_MESSAGE) as (root, leaf),
        ChangelogClient.open(base, node=leaf.address, max_message_bytes=MAX_MESSAGE // 2) as client,
    ):
        w = client.create_writer("fwd", range(4))
        futures, after = [], 0
        for k, body in enumerate(bodies):
            w.append(k % 4, body)
            futures.append(w.persist_durably(after))
            after = w.next_sqn()
        handles = [f.result(timeout=30) for f in futures]
        # statistics are a snapshot the node's loop refreshes after the turn that acked
        wait_until(lambda: root.statistics().segments_written == len(bodies), timeout=10)
        up, down = leaf.statistics(), root.statistics()
        assert up.parent_timeouts == 0 and down.rejected_messages == 0
        assert up.objects_written == 0 and down.segments_written == len(bodies)
        assert down.messages_below >= 4, "the leaf's flush went up in several messages"
        assert isinstance(client.uploader, NodeUploader)
        assert client.uploader.statistics().fallbacks == 0
        assert all(r.path.startswith(base) for h in handles for r in h.segments)
    for k, (h, body) in enumerate(zip(handles, bodies, strict=True)):
        assert list(read_changes(ObjectStore(base), h, k % 4)) == [body]


def test_writers_on_many_threads_lose_no_wake_up(tmp_path: Path) -> None:
    """Posts only wake the uploader's I/O thread when no wake-up is pending: persists
    from four threads at once are all sent and acked by the node (none falls back)."""
    base = str(tmp_path / "dfs")
    with (
        _chain(base, 1, delay=0.005) as (root,),
        ChangelogClient.open(base, node=root.address) as client,
    ):

        def run(k: int) -> list[ChangelogHandle]:
            w = client.create_writer(f"t{k}", range(4))
            out, after = [], 0
            for i in range(50):
                w.append(i % 4, b"%d-%d" % (k, i))
                out.append(w.persist_durably(after).result(timeout=30))
                after = w.next_sqn()
            return out

        with ThreadPoolExecutor(4) as pool:
            handles = [h for hs in pool.map(run, range(4)) for h in hs]
        assert isinstance(client.uploader, NodeUploader)
        assert client.uploader.statistics().fallbacks == 0
        assert client.uploader.statistics().acked_by_node == len(handles) == 200
