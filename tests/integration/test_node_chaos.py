"""Chaos: a 7-node tree (deploy/local.yaml's shape) under 16 writers while random nodes
are killed with SIGKILL and restarted (same id, same port) for ``DSTL_CHAOS_SECONDS``
seconds (default 60). Afterwards every acknowledged change reads back exactly once
through the writers' handles, and nothing was lost or duplicated."""

from __future__ import annotations

import collections
import os
import random
import threading
import time
from pathlib import Path

import pytest

from dstltree.aggregator.launcher import LocalTree
from dstltree.client import ChangelogClient, ChangelogHandle, ObjectStore
from dstltree.client.reader import iter_changes
from tests.support.tree_fixtures import start

SEVEN_NODES = [
    {"id": "root", "bind": "auto"},
    {"id": "a", "bind": "auto", "parent": "root"},
    {"id": "b", "bind": "auto", "parent": "root"},
    {"id": "a1", "bind": "auto", "parent": "a"},
    {"id": "a2", "bind": "auto", "parent": "a"},
    {"id": "b1", "bind": "auto", "parent": "b"},
    {"id": "b2", "bind": "auto", "parent": "b"},
]
WRITERS = 16
KEY_GROUPS = 4
SECONDS = float(os.environ.get("DSTL_CHAOS_SECONDS", "60"))
# the chaos goes on past SECONDS until it made this many kills (a loaded machine
# restarts nodes slower than the schedule), for at most as long again
MIN_KILLS = max(1, int(SECONDS / 10))


class _Writer(threading.Thread):
    """One writer persisting checkpoint after checkpoint until stopped; ``acked``: the
    changes covered by its latest acknowledged handle."""

    def __init__(self, index: int, client: ChangelogClient) -> None:
        super().__init__(name=f"chaos-writer-{index}", daemon=True)
        self.index = index
        self.writer = client.create_writer(f"task{index}", range(KEY_GROUPS))
        self.stop = threading.Event()
        self.acked: list[bytes] = []
        self.handle: ChangelogHandle | None = None
        self.persists = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        cp, appended = 1, []
        try:
            while not self.stop.is_set():
                for k in range(3):
                    change = f"w{self.index}-cp{cp}-{k}".encode()
                    self.writer.append((cp + k) % KEY_GROUPS, change)
                    appended.append(change)
                self.handle = self.writer.persist_durably(0, checkpoint_id=cp).result(60)
                self.acked = list(appended)
                self.persists += 1
                cp += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


class _Chaos(threading.Thread):
    """Kills a random node with SIGKILL every ``period`` seconds and restarts it on the
    same port (same id, same parent address)."""

    def __init__(self, tree: LocalTree, period: float) -> None:
        super().__init__(name="chaos", daemon=True)
        self.tree, self.period = tree, period
        self.stop = threading.Event()
        self.kills = 0
        self.enough = threading.Event()  # MIN_KILLS made
        self.rng = random.Random(7)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.wait(self.period * (0.5 + self.rng.random())):
                self._kill_and_restart(self.rng.choice(sorted(self.tree.nodes)))
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def _kill_and_restart(self, node_id: str) -> None:
        self.tree.restart(node_id)  # SIGKILL, then the same id, endpoint and parents
        self.kills += 1
        if self.kills >= MIN_KILLS:
            self.enough.set()


@pytest.mark.slow
@pytest.mark.timeout(600)  # up to 2 x SECONDS of chaos, then the writers' last persists
def test_killing_and_restarting_random_nodes_loses_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    base = str(tmp_path / "dfs")
    order = [n["id"] for n in SEVEN_NODES]
    with start(tmp_path, SEVEN_NODES, parent_timeout=1.0) as tree:
        clients = [
            ChangelogClient.open(
                base,
                node=tree.address(order[i % 7]),
                ack_timeout=2.0,
                security=tree.client_security,
            )
            for i in range(WRITERS)
        ]
        writers = [_Writer(i, c) for i, c in enumerate(clients)]
        chaos = _Chaos(tree, period=1.0)
        t0 = time.monotonic()
        for w in writers:
            w.start()
        chaos.start()
        chaos.stop.wait(SECONDS)
        chaos.enough.wait(SECONDS)
        chaos.stop.set()
        chaos.join(timeout=60)
        for w in writers:
            w.stop.set()
        for w in writers:
            w.join(timeout=120)
        elapsed = time.monotonic() - t0
        for c in clients:
            c.close()
    assert chaos.error is None, chaos.error
    for w in writers:
        assert not w.is_alive() and w.error is None, (w.index, w.error)
    persists = sum(w.persists for w in writers)
    print(
        f"\nchaos: {chaos.kills} kills in {elapsed:.0f} s, {persists} acknowledged persists "
        f"of {WRITERS} writers, {sum(len(w.acked) for w in writers)} changes checked"
    )
    assert chaos.kills >= MIN_KILLS
    assert all(w.persists >= 2 for w in writers)
    store = ObjectStore(base)
    for w in writers:
        assert w.handle is not None
        got = collections.Counter(c for _, _, c in iter_changes(store, w.handle))
        assert set(got) == set(w.acked), f"writer {w.index}: lost or foreign changes"
        assert max(got.values()) == 1, f"writer {w.index}: duplicated changes"


class _SlowStore(ObjectStore):
    """An object store whose uploads start only once ``release`` is set."""

    release = threading.Event()
    started = threading.Event()

    def put(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.started.set()
        assert self.release.wait(10), "never released"
        return super().put(*args, **kwargs)


def test_a_stopping_node_lets_its_running_writes_finish_and_sends_their_acks(
    tmp_path: Path,
) -> None:
    from dstltree.aggregator.core import NodeConfig
    from dstltree.aggregator.node import Node
    from dstltree.storage.hedging import UploadPolicy

    base = str(tmp_path / "dfs")
    store = _SlowStore(base)
    policy = UploadPolicy(attempts=1, upload_timeout=30.0)
    node = Node(NodeConfig("root", None, 1 << 20), store, upload_policy=policy)
    thread = node.start()
    client = ChangelogClient.open(base, node=node.address, ack_timeout=20.0)
    try:
        w = client.create_writer("last", range(1))
        w.append(0, b"final change")
        pending = w.persist_durably(0, checkpoint_id=1)
        assert _SlowStore.started.wait(10), "the node never started the write"
        node.stop()  # while the object is being written
        _SlowStore.release.set()
        handle = pending.result(timeout=20)
        thread.join(timeout=20)
        assert not thread.is_alive()
        assert client.uploader.statistics().fallbacks == 0  # type: ignore[attr-defined]
        assert list(client.read_changes(handle, 0)) == [b"final change"]
    finally:
        _SlowStore.release.set()
        client.close()
        node.stop()
