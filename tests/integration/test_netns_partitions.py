"""Hosts with their own network stacks (dstltree.bench.netns): every node of a tree in
a network namespace of its own, the writer on this process's host, joined by a Linux
bridge. A host cut off drops packets (a connection to it hangs, as across a network,
instead of being refused as on loopback). Needs root: skipped with the reason
otherwise; everything made is removed by name, also after a failure."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dstltree.aggregator.launcher import LocalTree, start_tree
from dstltree.bench import history
from dstltree.bench.netns import NetHosts, unavailable
from dstltree.client import ChangelogClient, ObjectStore
from dstltree.client.api import DEFAULT_PREEMPTIVE_BYTES
from dstltree.client.handle import ChangelogHandle
from dstltree.client.node_uploader import NodeUploader
from dstltree.topology.config import load_topology
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

PORT = 7100  # every host has its own stack: the same port on each


@pytest.fixture
def hosts() -> Iterator[NetHosts]:
    """Hosts ``root`` and ``a``; removed afterwards, checked gone."""
    why = unavailable()
    if why is not None:
        pytest.skip(f"no network namespaces here: {why}")
    h = NetHosts(["root", "a"])
    try:
        yield h
    finally:
        assert h.close() == []
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        assert h.tag not in listed.stdout


def _tree(tmp_path: Path, hosts: NetHosts) -> LocalTree:
    doc = {
        "base_path": str(tmp_path / "dfs"),
        "persist_delay": 0.02,
        "parent_timeout": 1.0,
        "nodes": [
            {"id": "root", "bind": f"tcp://{hosts.address('root')}:{PORT}"},
            {"id": "a", "bind": f"tcp://{hosts.address('a')}:{PORT}", "parent": "root"},
        ],
    }
    f = tmp_path / "topology.yaml"
    f.write_text(yaml.safe_dump(doc))
    prefixes = {n: hosts.prefix(n) for n in ("root", "a")}
    return start_tree(load_topology(f), f, workdir=tmp_path / "tree", prefixes=prefixes)


def test_a_writer_with_one_node_writes_to_the_dfs_only_while_its_host_is_cut_off(
    tmp_path: Path, hosts: NetHosts
) -> None:
    """Node ``a``'s host is cut off for 6 s (longer than the ack timeout, 2 s): the
    writer's segments in flight go to the DFS after the ack timeout, the next ones at
    once (the node is marked down for 60 s); once the host is back, the node answers
    the writer's pings and after the hold-down (1 s) the writer is on it again, long
    before the mark runs out. Direct writes are at most the persists made from the cut
    until the writer was back; every acknowledged change reads back once, in order."""
    tree = _tree(tmp_path, hosts)
    store = ObjectStore(str(tmp_path / "dfs"))
    up = NodeUploader(
        [tree.address("a")],
        store,
        ack_timeout=2.0,
        retry_after=60.0,
        hold_down=1.0,
        security=tree.client_security,
    )
    client = ChangelogClient(store, up, DEFAULT_PREEMPTIVE_BYTES)
    w = client.create_writer("w0", range(4))
    acked: list[tuple[int, bytes]] = []
    appended: list[tuple[int, bytes]] = []
    last: list[ChangelogHandle] = []

    def persist() -> None:
        cp = len(appended) + 1
        change = b"change-%d" % cp
        w.append(cp % 4, change)
        appended.append((cp % 4, change))
        last.append(w.persist_durably(0, checkpoint_id=cp).result(timeout=30))
        acked[:] = appended

    try:
        for _ in range(10):
            persist()
        assert up.statistics().fallbacks == 0
        on_node = up.statistics().acked_by_node
        hosts.cut("a")
        cut_at, persists_at_cut = time.monotonic(), len(appended)

        def outage_over() -> bool:  # persists go on, a checkpoint every 50 ms
            persist()
            return time.monotonic() - cut_at >= 6.0

        wait_until(outage_over, timeout=60.0, interval=0.05)
        fallbacks_in_outage = up.statistics().fallbacks
        assert fallbacks_in_outage >= 1
        hosts.heal("a")

        def back() -> bool:
            persist()
            return up.statistics().acked_by_node > on_node

        wait_until(back, timeout=30.0, interval=0.05)
        persists_until_back = len(appended) - persists_at_cut
        st = up.statistics()
        assert st.fallbacks <= persists_until_back, (st.fallbacks, persists_until_back)
        for _ in range(10):
            persist()
        h = history.check(store, [history.WriterHistory(acked, last[-1])])
        assert h.ok and h.checked == len(appended), h
    finally:
        client.close()
        tree.stop()
