"""CURVE key rotation without downtime, over real ZeroMQ on loopback: a link that knows
several server keys finds the one a server uses on the same socket without reporting
the link down, and reports it down only once every key failed; a tree of node
processes restarted one at a time through start -> promote -> finish while writers
keep persisting through the nodes (no write straight to the DFS, no refusal); after
finish the previous generation's writer key is refused. Every wait is bounded."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from dstltree.aggregator.launcher import LocalTree, start_tree
from dstltree.client import ChangelogClient
from dstltree.client.links import MonitoredDealer, working_key
from dstltree.security import (
    Curve,
    Keypair,
    configure_client,
    configure_server,
    finish_rotation,
    generate_key_dir,
    load_key_dir,
    promote_rotation,
    start_rotation,
)
from dstltree.topology.config import load_topology
from tests.support.tree_fixtures import write_topology
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _server(address: str, key: Keypair, client: Keypair) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    configure_server(sock, Curve(key, clients=frozenset({client.public})), "node")
    sock.bind(address)
    return sock


def _link(address: str, curve: Curve) -> MonitoredDealer:
    def configure(sock: zmq.Socket) -> None:
        sock.setsockopt(zmq.LINGER, 0)
        configure_client(sock, curve)

    return MonitoredDealer.open(address, configure, None, 0.1)


def _events_until(link: MonitoredDealer, want: bool, timeout: float = 10.0) -> list[bool]:
    """The link's reported changes until one equals ``want`` (bounded)."""
    seen: list[bool] = []

    def arrived() -> bool:
        seen.extend(link.changes())
        return want in seen

    wait_until(arrived, timeout=timeout, interval=0.005)
    return seen


def test_a_link_finds_the_server_key_without_reporting_down() -> None:
    address = _free_address()
    served, other, writer = Keypair.generate(), Keypair.generate(), Keypair.generate()
    server = _server(address, served, writer)
    curve = Curve(writer, other.public, other_server_keys=(served.public,))
    link = _link(address, curve)
    try:
        assert link.keys == (other.public, served.public)
        with pytest.raises(zmq.Again):  # nothing is queued before a handshake
            link.sock.send(b"early", zmq.NOBLOCK)
        assert _events_until(link, True) == [True]  # no down on the way
        assert link.switches == 1 and working_key(address) == served.public
        link.sock.send(b"through the same socket")
        assert server.poll(10_000) and server.recv_multipart()[1] == b"through the same socket"
        again = _link(address, curve)  # the key that worked is tried first
        try:
            assert again.keys == (served.public, other.public)
            assert _events_until(again, True) == [True] and again.switches == 0
        finally:
            again.close(None)
    finally:
        link.close(None)
        server.close(0)


def test_a_link_is_reported_down_only_once_every_key_failed() -> None:
    address = _free_address()  # nothing listens yet
    keys = [Keypair.generate() for _ in range(3)]
    writer = Keypair.generate()
    curve = Curve(writer, keys[0].public, other_server_keys=(keys[1].public, keys[2].public))
    link = _link(address, curve)
    server = None
    try:
        assert _events_until(link, False) == [False]
        assert link.switches == 2  # every key was tried before the first down
        server = _server(address, keys[1], writer)
        seen = _events_until(link, True)
        assert seen[-1] is True and working_key(address) == keys[1].public
    finally:
        link.close(None)
        if server is not None:
            server.close(0)


def test_a_link_with_one_key_reports_every_failed_attempt_as_before() -> None:
    address = _free_address()
    link = _link(address, Curve(Keypair.generate(), Keypair.generate().public))
    try:
        assert link.keys == ()
        assert _events_until(link, False) == [False] and link.switches == 0
    finally:
        link.close(None)


# -- a tree of node processes, rolled through a rotation --------------------------------

DAG = [
    {"id": "root", "bind": "auto"},
    {"id": "a", "bind": "auto", "parent": "root"},
    {"id": "b", "bind": "auto", "parents": ["root", "a"]},
]


class Persister(threading.Thread):
    """A writer persisting one change every 20 ms through the nodes ``a`` then ``b``
    (``done``: persists completed; ``errors``: persists failed)."""

    def __init__(self, base: str, nodes: list[str], curve: Curve, log_id: str) -> None:
        super().__init__(name=f"persister-{log_id}", daemon=True)
        self.client = ChangelogClient.open(
            base, node=nodes, ack_timeout=20.0, hold_down=0.3, security=curve
        )
        self.log_id = log_id
        self.done = 0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        w = self.client.create_writer(self.log_id, range(4))
        after = 0
        while not self.stop.is_set():
            w.append(self.done % 4, f"{self.log_id} {self.done}".encode())
            try:
                handle = w.persist_durably(after, checkpoint_id=self.done + 1).result(timeout=60)
            except Exception as e:  # noqa: BLE001 - the test asserts there are none
                self.errors.append(e)
                return
            after = handle.sqn_range[1]
            self.done += 1
            self.stop.wait(0.02)

    def finish(self) -> int:
        """Stop, close the client; the items it wrote straight to the DFS."""
        self.stop.set()
        self.join(timeout=60)
        assert not self.is_alive()
        fallbacks = self.client.uploader.statistics().fallbacks  # type: ignore[attr-defined]
        self.client.close()
        return int(fallbacks)


@pytest.fixture
def rotated_tree(tmp_path: Path) -> Iterator[tuple[LocalTree, Path]]:
    keys = tmp_path / "keys"
    generate_key_dir(keys)
    topo_file = write_topology(
        tmp_path / "topology.yaml",
        str(tmp_path / "dfs"),
        DAG,
        persist_delay=0.02,
        parent_timeout=2.0,
        security={"keys": str(keys)},
    )
    tree = start_tree(load_topology(topo_file), topo_file, workdir=tmp_path / "nodes")
    try:
        yield tree, keys
    finally:
        tree.stop()


def _persisted_twice_more(writers: list[Persister]) -> None:
    marks = [p.done for p in writers]
    wait_until(lambda: all(p.done >= m + 2 for p, m in zip(writers, marks, strict=True)), 60)


def _roll(tree: LocalTree, writers: list[Persister], refusals: dict[str, int]) -> None:
    """Restart every node gracefully, one at a time, each once the writers persisted
    twice more since the previous restart; add up each stopped node's refusals."""
    for node_id in ("a", "b", "root"):
        _persisted_twice_more(writers)
        h = tree.nodes[node_id]
        h.process.terminate()
        h.process.wait(timeout=30)
        assert h.stats_file is not None
        stats = json.loads(h.stats_file.read_text())
        refusals[node_id] = refusals.get(node_id, 0) + stats["auth_refusals"]
        tree.start_node(node_id, h.address)
    _persisted_twice_more(writers)


def test_nodes_restarted_one_at_a_time_through_a_rotation_keep_writers_persisting(
    rotated_tree: tuple[LocalTree, Path],
) -> None:
    """Writers stand for jobs: w1 started before the rotation (it knows the current
    node key only), w2 after start (both node keys, the current writer key), w3 after
    promote (the new writer key, both node keys). Each is stopped before the step whose
    node restarts it would not survive, as the procedure says (docs/deploy.md)."""
    tree, keys = rotated_tree
    base = str(tree.topology.base_path)
    nodes = [tree.address("a"), tree.address("b")]
    previous = load_key_dir(keys)
    refusals: dict[str, int] = {}
    writers: list[Persister] = []

    def writer(log_id: str) -> Persister:
        p = Persister(base, nodes, Curve.for_writer(load_key_dir(keys)), log_id)
        writers.append(p)
        p.start()
        return p

    try:
        w1 = writer("w1")
        start_rotation(keys)
        _roll(tree, [w1], refusals)  # nodes now accept both generations
        w2 = writer("w2")
        promote_rotation(keys)
        w3 = writer("w3")
        assert w1.finish() == 0  # it would not know the nodes' new key
        _roll(tree, [w2, w3], refusals)  # nodes now serve the new node key
        assert w2.finish() == 0  # its writer key is the previous one
        finish_rotation(keys)
        _roll(tree, [w3], refusals)  # nodes now accept the new generation only
        assert working_key(tree.address("a")) == load_key_dir(keys).node.public
        assert w3.finish() == 0
        assert [(p.log_id, p.errors) for p in writers] == [(p.log_id, []) for p in writers]
        assert all(p.done > 0 for p in writers)
        assert refusals == {"a": 0, "b": 0, "root": 0}  # no client was ever refused

        # the previous generation is gone: its writer key is refused and counted (a
        # client that knows the node key the nodes serve with, as w2 did)
        current = load_key_dir(keys)
        stale_curve = Curve(previous.writer, current.node.public)
        stale = ChangelogClient.open(base, node=nodes[0], ack_timeout=1.0, security=stale_curve)
        try:
            w = stale.create_writer("stale", range(1))
            w.append(0, b"with the previous writer key")
            w.persist_durably(0, checkpoint_id=1).result(timeout=30)
            assert stale.uploader.statistics().fallbacks == 1  # type: ignore[attr-defined]
        finally:
            stale.close()
        a = tree.nodes["a"]
        a.process.terminate()
        a.process.wait(timeout=30)
        assert a.stats_file is not None
        assert json.loads(a.stats_file.read_text())["auth_refusals"] >= 1
    finally:
        for p in writers:
            if p.is_alive():
                p.finish()
