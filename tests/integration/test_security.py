"""CURVE on every socket (dstltree.security): a peer without the right key gets
nothing through to a node, the coordinator or an exchange, and receives no command;
a peer with the right key works. Every wait is bounded; servers bind loopback."""

from __future__ import annotations

import contextlib
import stat
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import zmq
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from dstltree.aggregator.core import NodeConfig
from dstltree.aggregator.node import Node
from dstltree.cli.app import app
from dstltree.client import ChangelogClient, ObjectStore
from dstltree.client.wire import Register, Stats, dump
from dstltree.coordinator import Coordinator, MaterializedRef, TaskLink, TriggerCheckpoint
from dstltree.coordinator.errors import CoordinatorError
from dstltree.coordinator.testing import task_checkpoint
from dstltree.security import (
    ClusterKeys,
    Curve,
    JobSecurity,
    KeyDirError,
    Keypair,
    SecuritySettings,
    auth_refusals,
    configure_client,
    generate_key_dir,
    key_files,
    load_key_dir,
    register_refusal_metrics,
    write_key_files,
)
from dstltree.sparkplug.exchange import Exchange, Records
from dstltree.topology.config import TopologyError, load_topology
from tests.support.tree_fixtures import write_topology
from tests.support.waiting import wait_until

QUIET_S = 0.5  # how long a refused peer is given to get something through


def _refusals(role: str) -> int:
    return auth_refusals().get(role, 0)


def _stranger(keys: ClusterKeys) -> Curve:
    """A client that knows the server's public key but holds an unknown keypair: it
    reaches the authenticator, which refuses (and counts) it."""
    return Curve(Keypair.generate(), keys.node.public)


@pytest.fixture
def keys(tmp_path: Path) -> ClusterKeys:
    return generate_key_dir(tmp_path / "keys")


@pytest.fixture
def node(tmp_path: Path, keys: ClusterKeys) -> Iterator[Node]:
    n = Node(
        NodeConfig("root", None, 1, persist_delay=0.01),
        ObjectStore(str(tmp_path / "dfs")),
        security=Curve.for_node(keys),
    )
    n.start()
    yield n
    n.stop()


def _persist(base: str, address: str, curve: Curve | None, log_id: str, timeout: float) -> str:
    """Persist one change through the node at ``address``; the object's path (a
    refused client falls back to the DFS after ``timeout`` s)."""
    client = ChangelogClient.open(base, node=address, ack_timeout=timeout, security=curve)
    try:
        w = client.create_writer(log_id, range(4))
        w.append(0, b"change")
        h = w.persist_durably(0, checkpoint_id=1).result(timeout=timeout + 10)
        return h.segments[0].path
    finally:
        client.close()


def _raw_dealer(address: str, curve: Curve | None) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    configure_client(sock, curve)
    sock.connect(address)
    return sock


def _rogue_send(sock: zmq.Socket, frames: list[bytes]) -> None:
    """Send as a refused peer would: once the server refuses the handshake, the
    socket has no peer and a send would block forever, so it may not go out."""
    with contextlib.suppress(zmq.Again):  # refused first: nothing got through
        sock.send_multipart(frames, flags=zmq.NOBLOCK)


@pytest.mark.parametrize("who", ["unknown key", "plaintext", "other server key"])
def test_node_refuses_register_persist_and_stats_without_the_key(
    tmp_path: Path, keys: ClusterKeys, node: Node, who: str
) -> None:
    other = ClusterKeys.generate()
    curve = {
        "unknown key": _stranger(keys),
        "plaintext": None,
        "other server key": Curve.for_writer(other),
    }[who]
    before = _refusals("node")
    rogue = _raw_dealer(node.address, curve)
    try:
        _rogue_send(rogue, dump(Register("rogue")))
        _rogue_send(rogue, dump(Stats("evil-child", 7, 1e9, 3)))
        base = str(tmp_path / "dfs")
        path = _persist(base, node.address, curve, "rogue-writer", timeout=QUIET_S)
        if who == "unknown key":
            wait_until(lambda: _refusals("node") > before, timeout=5)
            registry = CollectorRegistry()
            register_refusal_metrics(registry)
            got = registry.get_sample_value("dstl_auth_refusals_total", {"role": "node"})
            assert got is not None and got > before
        s = node.statistics()
        assert (s.writers_below, s.bytes_received, s.rejected_messages) == (0, 0, 0)
        assert s.objects_written == 0  # the rogue's change went straight to the DFS
        # the right key gets through the same node
        ok = _persist(base, node.address, Curve.for_writer(keys), "good-writer", timeout=10)
        wait_until(lambda: node.statistics().objects_written >= 1, timeout=10)
        assert node.statistics().bytes_received > 0 and ok != path
        assert node.statistics().writers_below <= 1  # the good writer only
    finally:
        rogue.close(0)


def test_node_refuses_a_child_of_another_cluster(tmp_path: Path, keys: ClusterKeys) -> None:
    """Node to node: a child holding another cluster's node key cannot forward to the
    parent (the parent receives nothing); the child then writes the object itself."""
    store = ObjectStore(str(tmp_path / "dfs"))
    parent = Node(
        NodeConfig("root", None, 1, persist_delay=0.01), store, security=Curve.for_node(keys)
    )
    parent.start()
    other = ClusterKeys.generate()
    child_curve = Curve(other.node, keys.node.public, frozenset({other.writer.public}))
    before = _refusals("node")
    child = Node(
        NodeConfig("a", parent.address, 1 << 20, persist_delay=0.01, parent_timeout=0.5),
        store,
        security=child_curve,
    )
    child.start()
    try:
        # the child writes once its parent is known lost or its ack timed out (0.5 s);
        # the client's own timeout is far longer, so it does not write first
        _persist(str(tmp_path / "dfs"), child.address, Curve.for_writer(other), "w", timeout=30)
        wait_until(lambda: _refusals("node") > before, timeout=5)
        wait_until(lambda: child.statistics().objects_written >= 1, timeout=10)
        assert parent.statistics().bytes_received == 0
        assert parent.statistics().writers_below == 0
    finally:
        child.stop()
        parent.stop()


def test_node_to_node_with_the_cluster_key_forwards(tmp_path: Path, keys: ClusterKeys) -> None:
    store = ObjectStore(str(tmp_path / "dfs"))
    parent = Node(
        NodeConfig("root", None, 1, persist_delay=0.01), store, security=Curve.for_node(keys)
    )
    parent.start()
    child = Node(
        NodeConfig("a", parent.address, 1 << 20, persist_delay=0.01),
        store,
        security=Curve.for_node(keys),
    )
    child.start()
    try:
        _persist(str(tmp_path / "dfs"), child.address, Curve.for_writer(keys), "w", timeout=10)
        wait_until(lambda: parent.statistics().bytes_received > 0, timeout=10)
        assert child.statistics().bytes_forwarded > 0
    finally:
        child.stop()
        parent.stop()


@pytest.mark.parametrize("who", ["unknown key", "other job key", "plaintext"])
def test_coordinator_refuses_hello_ack_report_and_sends_no_command(
    tmp_path: Path, who: str
) -> None:
    job = Curve.shared(Keypair.generate())
    rogue_curve = {
        "unknown key": Curve(Keypair.generate(), job.keypair.public),
        "other job key": Curve.shared(Keypair.generate()),
        "plaintext": None,
    }[who]
    before = _refusals("coordinator")
    store = ObjectStore(str(tmp_path / "dfs"))
    coord = Coordinator(store, 1, checkpoint_interval=0.05, security=job)
    coord.start()
    rogue = good = None
    try:
        coord.begin_attempt(0)
        # A refused handshake leaves the rogue without a peer: its sends may time out
        # (CoordinatorError), which is one more way of getting nothing through.
        with contextlib.suppress(CoordinatorError):
            rogue = TaskLink(coord.address, 0, 0, security=rogue_curve, send_timeout=1)
            rogue.ack_checkpoint(1, task_checkpoint(0, 0))
            rogue.report_materialization(1, MaterializedRef("forged", 0, 1))
            rogue.splits_finished(("forged",))
        if rogue is not None:
            assert rogue.poll(timeout=QUIET_S) == []  # no TriggerCheckpoint, nothing
        s = coord.statistics()
        assert (s.tasks_without_node, s.messages_rejected, s.messages_fenced) == (0, 0, 0)
        assert s.last_checkpoint_id is None
        good = TaskLink(coord.address, 0, 0, security=job)
        wait_until(lambda: coord.statistics().tasks_without_node == 1, timeout=10)
        got: list = []
        wait_until(lambda: bool(got.extend(good.poll(0.05)) or _trigger(got)), timeout=10)
        cp = _trigger(got)
        assert cp is not None
        good.ack_checkpoint(cp.checkpoint_id, task_checkpoint(0, 0))
        wait_until(lambda: coord.latest_checkpoint() is not None, timeout=10)
        if rogue is not None:  # a refused Hello may have left no link (see above)
            assert rogue.poll(timeout=0.1) == []  # still nothing for the rogue
    finally:
        for link in (rogue, good):
            if link is not None:
                link.close()
        coord.stop()
    if who == "unknown key":
        assert _refusals("coordinator") > before


def _trigger(cmds: list) -> TriggerCheckpoint | None:
    return next((c for c in cmds if isinstance(c, TriggerCheckpoint)), None)


@pytest.mark.parametrize("who", ["unknown key", "other job key", "plaintext"])
def test_exchange_refuses_records_without_the_job_key(who: str) -> None:
    job = Curve.shared(Keypair.generate())
    rogue_curve = {
        "unknown key": Curve(Keypair.generate(), job.keypair.public),
        "other job key": Curve.shared(Keypair.generate()),
        "plaintext": None,
    }[who]
    before = _refusals("exchange")
    a, b = Exchange(0, 2, security=job), Exchange(1, 2, security=job)
    rogue = zmq.Context.instance().socket(zmq.PUSH)
    rogue.setsockopt(zmq.LINGER, 0)
    try:
        configure_client(rogue, rogue_curve)
        rogue.connect(a.addresses[1])  # the channel task 1 sends on
        _rogue_send(rogue, [msgpack.packb([0, [["k", {"v": "forged"}]]])])
        assert a.receive(QUIET_S) == []
        if who == "unknown key":
            wait_until(lambda: _refusals("exchange") > before, timeout=5)
        a.connect([a.addresses, b.addresses])
        b.connect([a.addresses, b.addresses])
        b.send(0, "k", {"v": "real"})
        b.flush()
        got: list = []

        def received() -> bool:
            b.flush()
            got.extend(x for x in a.receive(0.05) if isinstance(x, Records))
            return bool(got)

        wait_until(received, timeout=10)
        assert [r for batch in got for r in batch.items] == [("k", {"v": "real"})]
    finally:
        rogue.close(0)
        a.close()
        b.close()


def test_keys_generate_writes_private_secrets_and_refuses_to_overwrite(tmp_path: Path) -> None:
    d = tmp_path / "k"
    runner = CliRunner()
    first = runner.invoke(app, ["keys", "generate", str(d)])
    assert first.exit_code == 0, first.output
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for name in ("node", "writer"):
        assert stat.S_IMODE((d / f"{name}.key_secret").stat().st_mode) == 0o600
    keys = load_key_dir(d)
    assert keys.node.secret is not None and keys.writer.secret is not None
    again = runner.invoke(app, ["keys", "generate", str(d)])
    assert again.exit_code == 1 and "--force" in again.output
    assert load_key_dir(d).node == keys.node
    forced = runner.invoke(app, ["keys", "generate", str(d), "--force"])
    assert forced.exit_code == 0 and load_key_dir(d).node != keys.node
    (d / "node.key_secret").chmod(0o644)
    with pytest.raises(KeyDirError, match="readable by others"):
        load_key_dir(d)


def test_node_by_host_without_a_key_directory_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    topology = write_topology(
        tmp_path / "t.yaml",
        str(tmp_path / "dfs"),
        [
            {
                "id": "n0",
                "host": "127.0.0.1",
                "bind": "tcp://127.0.0.1:0",
                "advertise": "tcp://127.0.0.1:7700",
            }
        ],
    )
    result = CliRunner().invoke(
        app, ["node", "--topology", str(topology), "--node-id", "n0"], env={"DSTL_KEYS": ""}
    )
    assert result.exit_code == 2
    assert "security.keys" in result.output


def test_plaintext_takes_an_explicit_setting(tmp_path: Path) -> None:
    default = load_topology(write_topology(tmp_path / "a.yaml", "dfs", [{"id": "r"}]))
    assert (default.security or SecuritySettings()).curve
    off = write_topology(tmp_path / "b.yaml", "dfs", [{"id": "r"}], security={"curve": False})
    assert load_topology(off).security == SecuritySettings(curve=False)
    with pytest.raises(TopologyError, match="security.cuve"):
        load_topology(
            write_topology(tmp_path / "c.yaml", "dfs", [{"id": "r"}], security={"cuve": 0})
        )
    sec = JobSecurity.make(True, ClusterKeys.generate())
    assert sec.job is not None and sec.nodes is not None
    assert sec.nodes.keypair.secret is not None  # the writer's secret, for the tasks
    assert JobSecurity.make(False, None) == JobSecurity()
    assert "secret" not in repr(sec.nodes.keypair) or "***" in repr(sec.nodes.keypair)


def test_keys_shipped_to_executor_nodes_hold_only_what_a_node_needs(tmp_path: Path) -> None:
    cluster = ClusterKeys.generate()
    d = write_key_files(key_files(cluster), tmp_path / "shipped")
    for f in d.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    got = load_key_dir(d)
    assert got.node == cluster.node  # the node secret, to serve
    assert got.writer == cluster.writer.public_only()  # no writer secret on node hosts
    assert Curve.for_node(got).clients == Curve.for_node(cluster).clients


def test_a_driver_without_the_writer_secret_is_refused(tmp_path: Path) -> None:
    cluster = ClusterKeys.generate()
    node_host = load_key_dir(write_key_files(key_files(cluster), tmp_path / "node-host"))
    with pytest.raises(KeyDirError, match="writer.key_secret"):
        JobSecurity.make(True, node_host)
