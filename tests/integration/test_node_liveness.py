"""Liveness from the node's loop and wire version negotiation, over real ZeroMQ
(client/liveness.py, client/wire.py): a node whose loop makes no progress (stopped, or
stuck while ZeroMQ's own I/O thread still answers heartbeats) is left for the second
node without any direct DFS write; nodes and writers one wire version apart work
together both ways; a node speaking only a version the writer does not know refuses
it, naming both sides' versions, and the writer fails over."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dstltree.aggregator.core import NodeConfig
from dstltree.aggregator.node import Node
from dstltree.client import ChangelogClient, ObjectStore
from dstltree.client.api import DEFAULT_PREEMPTIVE_BYTES
from dstltree.client.node_uploader import NodeUploader
from dstltree.security.curve import Curve
from tests.support.tree_fixtures import metric, start
from tests.support.waiting import wait_until


def _client(base: str, nodes: list[str], **kw: object) -> ChangelogClient:
    store = ObjectStore(base)
    uploader = NodeUploader(nodes, store, ack_timeout=60.0, hold_down=60.0, **kw)  # type: ignore[arg-type]
    return ChangelogClient(store, uploader, DEFAULT_PREEMPTIVE_BYTES)


def _stats(client: ChangelogClient):  # type: ignore[no-untyped-def]
    return client.uploader.statistics()  # type: ignore[attr-defined]


@contextmanager
def _nodes(tmp_path: Path, *configs: NodeConfig, **kw: object) -> Iterator[list[Node]]:
    """In-process nodes (threads of this process) on one local store, stopped after."""
    store = ObjectStore(str(tmp_path / "dfs"))
    nodes = [Node(c, store, **kw) for c in configs]  # type: ignore[arg-type]
    threads = [n.start() for n in nodes]
    try:
        yield nodes
    finally:
        for n in nodes:
            n.stop()
        for t in threads:
            t.join(timeout=10)


def _config(node_id: str, parent: str | None = None, **kw: object) -> NodeConfig:
    return NodeConfig(node_id, parent, 1 << 20, persist_delay=0.01, plans=False, **kw)  # type: ignore[arg-type]


def test_a_stopped_node_is_left_for_the_second_one_by_its_pings_alone(tmp_path: Path) -> None:
    """SIGSTOP keeps the node's TCP connections open; with ZeroMQ's heartbeats off only
    the pings (answered by the node's loop) tell the writer, which sends the held
    segment again to the second node: no direct DFS write, no ack timeout waited."""
    base = str(tmp_path / "dfs")
    with start(tmp_path, persist_delay=60.0, parent_timeout=30.0) as tree:
        a, b = tree.address("a"), tree.address("b")
        client = _client(base, [a, b], heartbeat=0, security=tree.client_security)
        stopped = tree.nodes["a"].pid
        try:
            w = client.create_writer("task0", range(1))
            w.append(0, b"held by a")
            held = w.persist_durably(0)  # no checkpoint: a holds it for its persist delay
            wait_until(lambda: _stats(client).wire_version == 2, timeout=10)
            os.kill(stopped, signal.SIGSTOP)
            wait_until(lambda: client.uploader.address == b, timeout=10)  # type: ignore[attr-defined]
            handle = w.persist_durably(0, checkpoint_id=1).result(timeout=20)
            assert held.result(timeout=1).sqn_range == (0, 1)
            assert list(client.read_changes(handle, 0)) == [b"held by a"]
            st = _stats(client)
            assert (st.failovers, st.silences, st.fallbacks) == (1, 1, 0)
            assert [address for _, address, _ in st.failover_log] == [a]
        finally:
            os.kill(stopped, signal.SIGCONT)
            client.close()


def test_a_node_whose_loop_is_stuck_is_left_though_zeromq_still_answers(tmp_path: Path) -> None:
    """The node's loop cannot take its turn (its lock held, as by a turn that never
    ends) while its process, sockets and ZeroMQ heartbeats go on: the writer's pings go
    unanswered and it fails over, without a disconnect ever being seen."""
    with _nodes(tmp_path, _config("a"), _config("b")) as (a, b):
        client = _client(str(tmp_path / "dfs"), [a.address, b.address])
        try:
            w = client.create_writer("task0", range(1))
            w.append(0, b"first")
            w.persist_durably(0, checkpoint_id=1).result(timeout=20)
            with a._lock:  # the loop of a is stuck from here on
                w.append(0, b"while a is stuck")
                handle = w.persist_durably(0, checkpoint_id=2).result(timeout=20)
                assert client.uploader.address == b.address  # type: ignore[attr-defined]
            st = _stats(client)
            assert (st.failovers, st.silences, st.fallbacks) == (1, 1, 0)
            assert list(client.read_changes(handle, 0)) == [b"first", b"while a is stuck"]
        finally:
            client.close()


def test_a_writer_with_one_node_is_back_on_it_once_the_node_answers(tmp_path: Path) -> None:
    """The only node's loop is stuck past the ack timeout: the items in flight go to the
    DFS and the node is marked down for ``retry_after`` (30 s). Once its loop runs again
    it answers the writer's pings, and after the hold-down (1 s) the writer's items go
    to it again, long before the mark would have run out; every change reads back in
    order. (Before, each loop turn that found expired items doubled the mark, and no
    answer ended it: the writer stayed on the DFS for up to a minute.)"""
    with _nodes(tmp_path, _config("a")) as (a,):
        store = ObjectStore(str(tmp_path / "dfs"))
        up = NodeUploader([a.address], store, ack_timeout=0.5, retry_after=30.0, hold_down=1.0)
        client = ChangelogClient(store, up, DEFAULT_PREEMPTIVE_BYTES)
        changes = [b"first"]
        try:
            w = client.create_writer("task0", range(1))
            w.append(0, changes[0])
            w.persist_durably(0, checkpoint_id=1).result(timeout=20)
            with a._lock:  # the loop of a is stuck from here on
                for i in range(5):
                    changes.append(b"while stuck %d" % i)
                    w.append(0, changes[-1])
                    w.persist_durably(0)
                wait_until(lambda: _stats(client).fallbacks >= 1, timeout=20)
            assert up._backoff.down_until - time.monotonic() > 20.0  # a 30 s mark
            acked = _stats(client).acked_by_node

            def back_on_the_node() -> bool:
                changes.append(b"after %d" % len(changes))
                w.append(0, changes[-1])
                w.persist_durably(0).result(timeout=20)
                return _stats(client).acked_by_node > acked

            wait_until(back_on_the_node, timeout=15.0, interval=0.1)
            handle = w.persist_durably(0, checkpoint_id=2).result(timeout=20)
            assert list(client.read_changes(handle, 0)) == changes
            assert _stats(client).next_down_s == 30.0  # the ack ended the doubling
        finally:
            client.close()


def test_a_node_whose_parent_stops_moves_to_its_second_parent(tmp_path: Path) -> None:
    """a1 (in this process, ZeroMQ heartbeats off) forwards hop by hop to its parent a,
    a node process; a is stopped: a1 finds it silent and re-homes to b, its second
    parent; the writer's persist goes through, nothing written straight to the DFS."""
    base = str(tmp_path / "dfs")
    with start(tmp_path, persist_delay=0.01, parent_timeout=30.0, plans=False) as tree:
        a, b = tree.address("a"), tree.address("b")
        cfg = _config("a1", a, fallback_addresses=(b,), parent_timeout=30.0)
        security = tree.client_security
        assert tree.keys is not None  # CURVE on: a1 talks to a and b as a node
        with _nodes(tmp_path, cfg, heartbeat=0, security=Curve.for_node(tree.keys)) as (a1,):
            client = _client(base, [a1.address], security=security)
            stopped = tree.nodes["a"].pid
            try:
                w = client.create_writer("task0", range(1))
                w.append(0, b"warm-up")
                w.persist_durably(0, checkpoint_id=1).result(timeout=30)
                os.kill(stopped, signal.SIGSTOP)
                w.append(0, b"while a is stopped")
                handle = w.persist_durably(0, checkpoint_id=2).result(timeout=30)
                assert list(client.read_changes(handle, 0)) == [b"warm-up", b"while a is stopped"]
                st = a1.statistics()
                assert st.upstream_silences >= 1 and a1.core.parent == b
                assert [addr for _, addr, _ in a1.silence_log()][:1] == [a]
                assert _stats(client).fallbacks == 0
            finally:
                os.kill(stopped, signal.SIGCONT)
                client.close()


def test_version_1_nodes_serve_a_version_2_writer(tmp_path: Path) -> None:
    """Nodes of the previous release (wire version 1 only): the writer's hello is an
    unknown message type to them, which tells it they speak version 1; their error
    answers to its pings show their loop alive (ZeroMQ's heartbeats off: nothing else
    does), for longer than the liveness timeout; persists work as before."""
    base = str(tmp_path / "dfs")
    with start(tmp_path, wire_versions=[1], metrics_port=0) as tree:
        nodes = [tree.address("a"), tree.address("b")]
        client = _client(base, nodes, heartbeat=0, security=tree.client_security)
        url = tree.metrics_url("a")
        try:
            w = client.create_writer("task0", range(1))
            for cp in range(1, 4):
                w.append(0, f"change {cp}".encode())
                handle = w.persist_durably(0, checkpoint_id=cp).result(timeout=20)
            assert len(list(client.read_changes(handle, 0))) == 3
            # the hello and 10 pings refused: a second of the node's error answers
            wait_until(lambda: metric(url, "dstl_rejected_messages_total") >= 11, timeout=20)
            st = _stats(client)
            assert st.wire_version == 1
            assert (st.failovers, st.silences, st.fallbacks, st.node_errors) == (0, 0, 0, 0)
            assert client.uploader.address == tree.address("a")  # type: ignore[attr-defined]
        finally:
            client.close()


def test_version_2_nodes_serve_a_version_1_writer(tmp_path: Path) -> None:
    """A writer of the previous release sends no hello and no ping: served as before."""
    base = str(tmp_path / "dfs")
    with start(tmp_path) as tree:
        client = _client(
            base, [tree.address("a")], wire_versions=(1,), security=tree.client_security
        )
        try:
            w = client.create_writer("task0", range(1))
            w.append(0, b"old writer")
            handle = w.persist_durably(0, checkpoint_id=1).result(timeout=20)
            assert list(client.read_changes(handle, 0)) == [b"old writer"]
            st = _stats(client)
            assert st.wire_version is None and st.fallbacks == 0 and st.node_errors == 0
        finally:
            client.close()
        tree.stop()
        a = json.loads((tmp_path / "a.stats.json").read_text())
    assert a["pings_answered"] == 0 and a["rejected_messages"] == 0 and a["wire_refusals"] == 0


@pytest.mark.parametrize(("child", "parent"), [((1, 2), (1,)), ((1,), (1, 2))])
def test_a_child_and_its_parent_one_version_apart_forward_as_before(
    tmp_path: Path, child: tuple[int, ...], parent: tuple[int, ...]
) -> None:
    """A rolling upgrade: a node of one release forwards to a parent of the other."""
    with _nodes(tmp_path, _config("root", wire_versions=parent)) as (root,):
        cfg = _config("c", root.address, wire_versions=child, parent_timeout=30.0)
        with _nodes(tmp_path, cfg) as (c,):
            client = _client(str(tmp_path / "dfs"), [c.address])
            try:
                w = client.create_writer("task0", range(1))
                for cp in range(1, 4):
                    w.append(0, f"change {cp}".encode())
                    handle = w.persist_durably(0, checkpoint_id=cp).result(timeout=20)
                assert len(list(client.read_changes(handle, 0))) == 3
                assert _stats(client).fallbacks == 0
                st = c.statistics()
                assert st.bytes_forwarded > 0 and st.objects_written == 0
                assert st.upstream_silences == st.upstream_refusals == st.parent_timeouts == 0
            finally:
                client.close()


def test_a_node_of_an_unknown_version_refuses_the_writer_which_fails_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The node speaks only version 3: it refuses the writer's hello with an error
    naming both sides' versions, counts it, and refuses what follows; the writer takes
    it as down and sends everything to its second node (nothing misread, nothing
    written straight to the DFS)."""
    with _nodes(tmp_path, _config("new", wire_versions=(3,)), _config("b")) as (new, b):
        client = _client(str(tmp_path / "dfs"), [new.address, b.address])
        try:
            with caplog.at_level(logging.WARNING, logger="dstltree.client"):
                w = client.create_writer("task0", range(1))
                w.append(0, b"refused there")
                handle = w.persist_durably(0, checkpoint_id=1).result(timeout=20)
            assert list(client.read_changes(handle, 0)) == [b"refused there"]
            st = _stats(client)
            assert (st.failovers, st.fallbacks) == (1, 0)
            assert st.refusals >= 1  # its probe of the node (to return to it) is refused too
            assert client.uploader.address == b.address  # type: ignore[attr-defined]
            assert "no common wire version: this node speaks [3], the peer [1, 2]" in caplog.text
            assert new.statistics().wire_refusals >= 1
        finally:
            client.close()


def test_a_single_refusing_node_sends_the_writer_to_the_dfs(tmp_path: Path) -> None:
    """With no second node the refused items are written straight to the DFS (the
    node error-acks them): the persist completes, nothing is misread."""
    with _nodes(tmp_path, _config("new", wire_versions=(3,))) as (new,):
        client = _client(str(tmp_path / "dfs"), [new.address])
        try:
            w = client.create_writer("task0", range(1))
            w.append(0, b"to the dfs")
            handle = w.persist_durably(0, checkpoint_id=1).result(timeout=20)
            assert list(client.read_changes(handle, 0)) == [b"to the dfs"]
            st = _stats(client)
            assert st.refusals == 1 and st.fallbacks == 1 and st.acked_by_node == 0
        finally:
            client.close()


def test_a_writer_with_one_node_sends_again_what_a_killed_node_held(tmp_path: Path) -> None:
    """The only node dies holding a segment: the writer connects again and sends it
    again to the restarted node (no ack timeout waited, nothing written straight to
    the DFS)."""
    base = str(tmp_path / "dfs")
    with start(tmp_path, persist_delay=60.0, parent_timeout=30.0) as tree:
        client = _client(base, [tree.address("a")], security=tree.client_security)
        try:
            w = client.create_writer("task0", range(1))
            w.append(0, b"held by a")
            held = w.persist_durably(0)  # no checkpoint: a holds it for its persist delay
            wait_until(lambda: _stats(client).wire_version == 2, timeout=10)
            tree.restart("a")  # SIGKILL, then the same node on the same endpoint
            wait_until(lambda: _stats(client).reconnects >= 1, timeout=10)
            w.append(0, b"after the restart")
            handle = w.persist_durably(0, checkpoint_id=1).result(timeout=20)
            assert held.result(timeout=1).sqn_range == (0, 1)
            assert list(client.read_changes(handle, 0)) == [b"held by a", b"after the restart"]
            st = _stats(client)
            assert (st.failovers, st.fallbacks) == (0, 0) and st.resent >= 1
        finally:
            client.close()
