"""A node process that dies is started again by the launcher's supervisor with the same
id, endpoint and parents; its writers' changes go on through it."""

from __future__ import annotations

import contextlib
from pathlib import Path

from dstltree.client import ChangelogClient
from tests.support.tree_fixtures import start
from tests.support.waiting import wait_until


def test_a_killed_node_is_restarted_on_its_endpoint_and_serves_again(tmp_path: Path) -> None:
    with start(tmp_path) as tree:
        supervisor = tree.supervise(interval=0.05)
        old = tree.nodes["a"]
        client = ChangelogClient.open(
            str(tmp_path / "dfs"), node=tree.address("a"), security=tree.client_security
        )
        try:
            w = client.create_writer("w", range(1))
            w.append(0, b"before")
            w.persist_durably(0, checkpoint_id=1).result(20)
            old.kill()  # SIGKILL
            wait_until(lambda: supervisor.restarts["a"] == 1, timeout=30)
            new = tree.nodes["a"]
            assert new.pid != old.pid and new.address == old.address
            assert new.process.poll() is None
            w.append(0, b"after")
            handle = w.persist_durably(0, checkpoint_id=2).result(20)
            assert list(client.read_changes(handle, 0)) == [b"before", b"after"]
            assert client.uploader.statistics().fallbacks == 0  # type: ignore[attr-defined]
        finally:
            client.close()
        assert supervisor.failures["a"] == 0
    assert all(h.process.poll() is not None for h in tree.nodes.values()), "stop ends them"
    assert supervisor.restarts["a"] == 1, "stopping on purpose is no death"


def test_a_respawned_node_comes_back_and_stops_when_asked(tmp_path: Path) -> None:
    import os
    import signal
    import socket

    from dstltree.aggregator.launcher import start_node_process
    from tests.support.tree_fixtures import write_topology

    topo = write_topology(
        tmp_path / "t.yaml", str(tmp_path / "dfs"), [{"id": "root"}], security={"curve": False}
    )
    pid_file = tmp_path / "root.pid"
    workdir = tmp_path / "node-wd"  # as on an executor: the node's own directory
    workdir.mkdir()
    with socket.socket() as s:  # a fixed endpoint, as on an executor
        s.bind(("127.0.0.1", 0))
        bind = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    h = start_node_process(
        topo,
        "root",
        0,
        None,
        workdir,
        bind=bind,
        exit_with_pid=os.getpid(),
        respawn_pid_file=pid_file,
        remove_workdir=True,
    )
    try:
        first = int(pid_file.read_text())
        assert first != h.pid, "the file holds the node, the handle the respawner"
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: int(pid_file.read_text()) != first, timeout=30)
        second = int(pid_file.read_text())
        client = ChangelogClient.open(str(tmp_path / "dfs"), node=h.address, ack_timeout=30)
        try:  # the node is back on its endpoint
            w = client.create_writer("w", range(1))
            w.append(0, b"change")
            handle = w.persist_durably(0, checkpoint_id=1).result(30)
            assert list(client.read_changes(handle, 0)) == [b"change"]
            assert client.uploader.statistics().fallbacks == 0  # type: ignore[attr-defined]
        finally:
            client.close()
        assert h.process.poll() is None
        assert workdir.exists(), "a death on its own is no stop: the directory stays"
        os.kill(second, signal.SIGTERM)  # a stop on purpose ends both
        assert h.process.wait(timeout=30) == 0
        assert not workdir.exists() and not pid_file.exists(), "nothing is left behind"
    finally:
        h.kill()


def test_a_tree_deletes_the_work_directory_it_made_with_its_keys(tmp_path: Path) -> None:
    from dstltree.aggregator.launcher import start_tree
    from dstltree.topology.config import load_topology
    from tests.support.tree_fixtures import write_topology

    topo_file = write_topology(tmp_path / "t.yaml", str(tmp_path / "dfs"), [{"id": "root"}])
    made = start_tree(load_topology(topo_file), topo_file)  # CURVE: keys generated
    given = start_tree(load_topology(topo_file), topo_file, workdir=tmp_path / "given")
    assert made.workdir is not None and given.workdir is not None
    assert (made.workdir / "keys" / "node.key_secret").exists()
    made.stop()
    given.stop()
    assert not made.workdir.exists(), "a secret key outlived the tree"
    assert (given.workdir / "root.stats.json").exists(), "a directory given is the caller's"


def test_the_work_directory_of_a_sigkilled_respawner_is_deleted_by_the_next_launcher(
    tmp_path: Path,
) -> None:
    import os
    import signal
    import time

    from dstltree.aggregator.launcher import start_node_process
    from dstltree.aggregator.workdirs import OWNER_LOCK, sweep_stale_workdirs
    from tests.support.tree_fixtures import write_topology

    topo = write_topology(
        tmp_path / "t.yaml", str(tmp_path / "dfs"), [{"id": "root"}], security={"curve": False}
    )
    pid_file = tmp_path / "root.pid"
    workdir = tmp_path / "dstl-node-e0"  # as an executor's launcher names it
    workdir.mkdir()
    h = start_node_process(
        topo,
        "root",
        0,
        None,
        workdir,
        exit_with_pid=os.getpid(),
        respawn_pid_file=pid_file,
        remove_workdir=True,
    )
    later = time.time() + 120  # past the margin a fresh lock file gets
    node_pid = int(pid_file.read_text())
    try:
        assert (workdir / OWNER_LOCK).exists()
        assert sweep_stale_workdirs(tmp_path, now=later) == [], "its respawner owns it"
        os.kill(h.pid, signal.SIGKILL)  # the respawner: no cleanup runs
        h.process.wait(timeout=30)
        os.kill(node_pid, 0)  # the node outlives its respawner (its executor lives)
        assert sweep_stale_workdirs(tmp_path, now=later) == [], "the running node owns it"
        assert (workdir / OWNER_LOCK).exists()
        os.kill(node_pid, signal.SIGKILL)  # its lock goes with its descriptors at its end
        wait_until(lambda: sweep_stale_workdirs(tmp_path, now=later) == [workdir], timeout=30)
        assert not workdir.exists()
    finally:
        h.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(node_pid, signal.SIGKILL)


def test_a_running_tree_owns_the_directory_it_made(tmp_path: Path) -> None:
    import time

    from dstltree.aggregator.launcher import start_tree
    from dstltree.aggregator.workdirs import sweep_stale_workdirs
    from dstltree.topology.config import load_topology
    from tests.support.tree_fixtures import write_topology

    topo_file = write_topology(tmp_path / "t.yaml", str(tmp_path / "dfs"), [{"id": "root"}])
    wd = tmp_path / "dstl-nodes-t"
    tree = start_tree(load_topology(topo_file), topo_file, workdir=wd, remove_workdir=True)
    try:
        assert tree.workdir == wd and tree.owner is not None
        assert sweep_stale_workdirs(tmp_path, now=time.time() + 120) == []
        assert wd.exists()
    finally:
        tree.stop()
    assert not tree.workdir.exists()
