"""The wall clock stepped an hour ahead, then an hour behind, under a writer and two
nodes (in this process, real ZeroMQ sockets): ``time.time`` is moved for every module
of the process (an NTP step or a resumed VM), the monotonic clock is not. Deadlines
(ack timeouts, pings, liveness, persist delays, parent timeouts) are measured on the
monotonic clock, so nothing fires early or stalls: no direct DFS write, no failover,
no silence, and every change reads back once, in order."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dstltree.aggregator.core import NodeConfig
from dstltree.aggregator.node import Node
from dstltree.client import ChangelogClient, ObjectStore
from dstltree.client.api import DEFAULT_PREEMPTIVE_BYTES
from dstltree.client.node_uploader import NodeUploader
from dstltree.client.reader import iter_changes

pytestmark = pytest.mark.timeout(120)

REAL_TIME = time.time


def test_wall_clock_steps_fire_no_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ObjectStore(str(tmp_path / "dfs"))
    root = Node(NodeConfig("root", None, 1 << 20, persist_delay=0.01, plans=False), store)
    threads = [root.start()]
    a = Node(
        NodeConfig("a", root.address, 1 << 20, persist_delay=0.01, plans=False, parent_timeout=2.0),
        store,
    )
    threads.append(a.start())
    up = NodeUploader([a.address], store, ack_timeout=2.0)
    client = ChangelogClient(store, up, DEFAULT_PREEMPTIVE_BYTES)
    changes: list[tuple[int, bytes]] = []
    try:
        w = client.create_writer("w0", range(2))
        handle = None
        for step in (0.0, 3600.0, -3600.0, 0.0):
            monkeypatch.setattr(time, "time", lambda s=step: REAL_TIME() + s)
            for _ in range(20):
                changes.append((len(changes) % 2, b"change-%d" % len(changes)))
                w.append(*changes[-1])
                handle = w.persist_durably(0, checkpoint_id=len(changes)).result(timeout=30)
        assert handle is not None
        st = up.statistics()
        assert (st.fallbacks, st.failovers, st.silences, st.acked_by_node) == (0, 0, 0, 80)
        got = [(kg, c) for _, kg, c in iter_changes(store, handle)]
        assert got == changes
        sa = a.statistics()
        assert (sa.upstream_silences, sa.upstream_losses) == (0, 0)
    finally:
        monkeypatch.setattr(time, "time", REAL_TIME)
        client.close()
        for n in (a, root):
            n.stop()
        for t in threads:
            t.join(timeout=10)
