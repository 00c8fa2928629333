"""A node process that dies is started again by the launcher's supervisor with the same
id, endpoint and parents; its writers' changes go on through it."""

from __future__ import annotations

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
