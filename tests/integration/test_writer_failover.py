"""A writer with two nodes (client/failover.py, client/node_uploader.py): when its node
is killed hard, the loss is seen through ZeroMQ (socket monitor, heartbeats) and the
unacknowledged segments go to the second node at once, with no write straight to DFS;
the restarted node gets the traffic back after the hold-down."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from dstltree.client import ChangelogClient
from tests.support.tree_fixtures import metric, start
from tests.support.waiting import wait_until


def test_a_killed_node_s_segments_go_to_the_next_node_and_come_back_after_the_hold_down(
    tmp_path: Path,
) -> None:
    base = str(tmp_path / "dfs")
    # a long persist delay: the node holds a segment without a checkpoint until it dies
    with start(tmp_path, persist_delay=60.0, parent_timeout=30.0) as tree:
        a, b = tree.address("a"), tree.address("b")
        client = ChangelogClient.open(
            base, node=[a, b], ack_timeout=60.0, hold_down=0.5, security=tree.client_security
        )
        try:
            up = client.uploader
            w = client.create_writer("task0", range(2))
            w.append(0, b"before the kill")
            held = w.persist_durably(0)  # no checkpoint: stays in a's batch
            wait_until(lambda: up._pending != {}, timeout=10)  # type: ignore[attr-defined]
            t0 = time.monotonic()
            tree.nodes["a"].kill()
            wait_until(lambda: up.address == b, timeout=10)
            print(f"\nnode loss noticed after {1000 * (time.monotonic() - t0):.0f} ms")
            w.append(1, b"after the kill")
            handle = w.persist_durably(0, checkpoint_id=1).result(timeout=20)
            assert held.result(timeout=1).sqn_range == (0, 1)
            stats = up.statistics()  # type: ignore[attr-defined]
            assert (stats.failovers, stats.resent, stats.fallbacks) == (1, 1, 0)
            assert list(client.read_changes(handle, 0)) == [b"before the kill"]
            assert list(client.read_changes(handle, 1)) == [b"after the kill"]

            tree.restart("a")  # the same id, endpoint and parent
            wait_until(lambda: up.address == a, timeout=20)
            w.append(0, b"back home")
            after = w.persist_durably(handle.sqn_range[1], checkpoint_id=2).result(timeout=20)
            assert list(client.read_changes(after, 0)) == [b"back home"]
            assert up.statistics().fallbacks == 0  # type: ignore[attr-defined]
        finally:
            client.close()


def test_a_frozen_node_is_noticed_by_zeromq_heartbeats(tmp_path: Path) -> None:
    """SIGSTOP: the process keeps its sockets (no reset reaches the writer), so only the
    heartbeats (every 0.1 s, three missed) tell the writer the node is gone."""
    base = str(tmp_path / "dfs")
    with start(tmp_path, persist_delay=60.0, parent_timeout=30.0) as tree:
        a, b = tree.address("a"), tree.address("b")
        client = ChangelogClient.open(
            base, node=[a, b], ack_timeout=60.0, hold_down=60.0, security=tree.client_security
        )
        frozen = tree.nodes["a"].pid
        try:
            up = client.uploader
            w = client.create_writer("task0", range(1))
            w.append(0, b"held by a")
            held = w.persist_durably(0)
            wait_until(lambda: up._pending != {}, timeout=10)  # type: ignore[attr-defined]
            t0 = time.monotonic()
            os.kill(frozen, signal.SIGSTOP)
            wait_until(lambda: up.address == b, timeout=10)
            print(f"\nfrozen node noticed after {1000 * (time.monotonic() - t0):.0f} ms")
            handle = w.persist_durably(0, checkpoint_id=1).result(timeout=20)
            assert held.result(timeout=1).sqn_range == (0, 1)
            assert list(client.read_changes(handle, 0)) == [b"held by a"]
            stats = up.statistics()  # type: ignore[attr-defined]
            assert (stats.failovers, stats.resent, stats.fallbacks) == (1, 1, 0)
        finally:
            os.kill(frozen, signal.SIGCONT)
            client.close()


CHAIN = [
    {"id": "root", "bind": "auto"},
    {"id": "a", "bind": "auto", "parent": "root"},
    {"id": "a1", "bind": "auto", "parent": "a"},
]


def test_a_node_whose_parent_freezes_goes_on_without_waiting_for_the_parent_timeout(
    tmp_path: Path,
) -> None:
    """a1's parent ``a`` is frozen while holding nothing yet: a1's segment forwarded to
    it is never acknowledged. a1 sees the heartbeats stop and sends the segment on (to
    the next ancestor it knows, else writes it itself) long before its parent timeout
    (60 s) or the writer's ack timeout (60 s) would."""
    base = str(tmp_path / "dfs")
    with start(tmp_path, CHAIN, persist_delay=0.05, parent_timeout=60.0) as tree:
        client = ChangelogClient.open(
            base, node=tree.address("a1"), ack_timeout=60.0, security=tree.client_security
        )
        frozen = tree.nodes["a"].pid
        try:
            w = client.create_writer("task0", range(1))
            w.append(0, b"warm-up")
            w.persist_durably(0, checkpoint_id=1).result(timeout=30)
            os.kill(frozen, signal.SIGSTOP)
            w.append(0, b"while a is frozen")
            t0 = time.monotonic()
            handle = w.persist_durably(0, checkpoint_id=2).result(timeout=30)
            print(f"\npersist across the frozen parent: {1000 * (time.monotonic() - t0):.0f} ms")
            assert list(client.read_changes(handle, 0)) == [b"warm-up", b"while a is frozen"]
            assert client.uploader.statistics().fallbacks == 0  # type: ignore[attr-defined]
        finally:
            os.kill(frozen, signal.SIGCONT)
            client.close()


def test_a_writer_whose_first_node_is_down_from_the_start_uses_the_second_at_once(
    tmp_path: Path,
) -> None:
    """A node already dead when the writer opens never disconnects: the refused
    connection attempts tell the writer, long before its ack timeout."""
    base = str(tmp_path / "dfs")
    with start(tmp_path, persist_delay=0.01) as tree:
        dead = tree.address("a")
        tree.nodes["a"].kill()
        client = ChangelogClient.open(
            base,
            node=[dead, tree.address("b")],
            ack_timeout=60.0,
            hold_down=60.0,
            security=tree.client_security,
        )
        try:
            w = client.create_writer("task0", range(1))
            w.append(0, b"first")
            handle = w.persist_durably(0, checkpoint_id=1).result(timeout=20)
            stats = client.uploader.statistics()  # type: ignore[attr-defined]
            assert (stats.failovers, stats.fallbacks) == (1, 0)
            assert client.uploader.address == tree.address("b")  # type: ignore[attr-defined]
            assert list(client.read_changes(handle, 0)) == [b"first"]
        finally:
            client.close()


def test_a_segment_sent_twice_is_referenced_once_and_its_other_copy_is_swept(
    tmp_path: Path,
) -> None:
    """a holds the segment when it freezes; the writer sends it again through b, whose
    copy the handle references. When a thaws it writes its own copy anyway: that copy is
    never referenced, a late ack for it is ignored, and the registry's sweep (what no
    handle references) deletes it; the changes read back once."""
    from dstltree.client import ObjectStore
    from dstltree.coordinator.cleanup import list_data_info, scan_orphans

    base = str(tmp_path / "dfs")
    with start(tmp_path, persist_delay=1.0, parent_timeout=30.0, metrics_port=0) as tree:
        a, b = tree.address("a"), tree.address("b")
        client = ChangelogClient.open(
            base, node=[a, b], ack_timeout=60.0, hold_down=60.0, security=tree.client_security
        )
        url_a = tree.metrics_url("a")
        store = ObjectStore(base)
        frozen = tree.nodes["a"].pid
        try:
            w = client.create_writer("task0", range(1))
            w.append(0, b"sent twice")
            w.persist_durably(0)  # no checkpoint: a holds it for its persist delay
            # a must hold the segment before it freezes: queued in the client is not enough
            # (a link given up on drops what it has not sent yet)
            wait_until(lambda: metric(url_a, "dstl_bytes_received_total") > 0, timeout=10)
            os.kill(frozen, signal.SIGSTOP)
            handle = w.persist_durably(0, checkpoint_id=1).result(timeout=20)
            referenced = handle.object_paths()
        finally:
            os.kill(frozen, signal.SIGCONT)

        def copies() -> list[str]:  # data files no handle references (not reservations)
            sizes = {i.url: i.size for i in list_data_info(store)}
            return [u for u in scan_orphans(store, referenced).orphans if sizes.get(u)]

        try:
            wait_until(lambda: copies() != [], timeout=30)  # a wrote its copy after all
            assert list(client.read_changes(handle, 0)) == [b"sent twice"]
            assert client.uploader.statistics().fallbacks == 0  # type: ignore[attr-defined]
        finally:
            client.close()
    store.delete(copies())
    assert copies() == [] and all(store.exists(p) for p in referenced)
    assert list(client.read_changes(handle, 0)) == [b"sent twice"]
