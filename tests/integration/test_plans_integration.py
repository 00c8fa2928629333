"""Plans in a real 7-node, 3-level tree over loopback: after the first window data takes
one hop to its planned collector; killing a planned collector mid-window loses nothing
and the next window's plan no longer routes to it."""

from __future__ import annotations

import math
import time
from pathlib import Path

from dstltree.client import ChangelogClient, ObjectStore
from dstltree.client.reader import read_changes
from dstltree.topology.config import parse_topology
from tests.support.tree_fixtures import InProcessTree
from tests.support.waiting import wait_until

NODES = [
    {"id": "root"},
    {"id": "a", "parent": "root"},
    {"id": "b", "parent": "root"},
    {"id": "a1", "parent": "a"},
    {"id": "a2", "parent": "a"},
    {"id": "b1", "parent": "b"},
    {"id": "b2", "parent": "b"},
]
PER_WRITER = 40_000  # bytes per checkpoint
WRITERS_PER_NODE = 2  # 80 KB per executor: subtrees of a and b (240 KB) reach the target
TARGET = 200_000
WINDOW = 4
CHECKPOINT_INTERVAL = 0.05  # seconds between checkpoints, as a job's trigger would space them


def _topology(base: str):  # type: ignore[no-untyped-def]
    return parse_topology(
        {
            "base_path": base,
            "nodes": NODES,
            "target_object_bytes": TARGET,
            "persist_delay": 0.2,
            "plan_window": WINDOW,
            "parent_timeout": 0.5,
        }
    )


def _payload(cp: int, i: int) -> bytes:
    return (f"{cp}:{i}:".encode() * PER_WRITER)[:PER_WRITER]


class Cluster:
    def __init__(self, tree: InProcessTree, base: str) -> None:
        self.tree = tree
        self.clients: dict[str, ChangelogClient] = {}
        self.writers: list[tuple[str, object]] = []
        for nid in tree.nodes:
            c = ChangelogClient.open(base, node=tree.address(nid), ack_timeout=3.0)
            self.clients[nid] = c
            for k in range(WRITERS_PER_NODE):
                self.writers.append((nid, c.create_writer(f"{nid}-w{k}", range(8))))

    def checkpoint(self, cp: int) -> list:  # type: ignore[type-arg]
        for i, (_, w) in enumerate(self.writers):
            w.append(i % 8, _payload(cp, i))  # type: ignore[attr-defined]
        futures = [w.persist_durably(0, checkpoint_id=cp) for _, w in self.writers]  # type: ignore[attr-defined]
        return [f.result(timeout=30) for f in futures]

    def close(self) -> None:
        for c in self.clients.values():
            c.close()


def _stats(tree: InProcessTree) -> dict:  # type: ignore[type-arg]
    """Every node's statistics once they show each received byte written: a node
    refreshes its snapshot after the loop turn that acked, so a snapshot read right
    after a checkpoint can still miss its last object. Every node idle (nothing batched,
    being written or awaiting its parent's ack) and the bytes written at least those
    received: a relayed item whose parent did not ack within ``parent_timeout`` (a
    loaded machine) is written by the child as well, and both copies count."""

    def read() -> dict:  # type: ignore[type-arg]
        return {nid: n.statistics() for nid, n in tree.nodes.items()}

    def settled() -> bool:
        s = read().values()
        idle = all(x.backlog_bytes == 0 and x.in_flight_up == 0 for x in s)
        return idle and sum(x.bytes_written for x in s) >= sum(x.bytes_own for x in s)

    wait_until(settled, timeout=10)
    return read()


def _registered(tree: InProcessTree) -> None:
    """Wait until every writer's registration reached its node and every node's stats
    reached the root (the root's all-persisted rule counts them)."""
    total = len(NODES) * WRITERS_PER_NODE
    wait_until(lambda: tree.nodes["root"].statistics().writers_below == total, timeout=15)


def _planned_one_hop(tree: InProcessTree, cp: int) -> bool:
    """Whether the plan for ``cp``'s window sends every leaf's data to its subtree root."""
    for leaf in ("a1", "a2", "b1", "b2"):
        planned = tree.nodes[leaf].core.collector_for(cp)
        if planned is None or planned[0] != leaf[0]:
            return False
    return True


def _settle(tree: InProcessTree, cluster: Cluster) -> int:
    """Run checkpoints until the next window's plan is the one-hop plan (estimates and
    plans settle in the first windows; how many depends on how fast stats reach the
    root), and return the first checkpoint of that window. Bounded: eight windows."""
    for cp in range(8 * WINDOW):
        cluster.checkpoint(cp)
        nxt = cp + 1
        if nxt % WINDOW == 0 and nxt >= 2 * WINDOW and _planned_one_hop(tree, nxt):
            return nxt
    raise AssertionError("no one-hop plan after eight windows")


def test_plans_one_hop_after_the_first_window(tmp_path: Path) -> None:
    base = str(tmp_path / "dfs")
    with InProcessTree(_topology(base), ObjectStore(base)) as tree:
        cluster = Cluster(tree, base)
        _registered(tree)
        start = _settle(tree, cluster)
        before = _stats(tree)
        objects = []
        for cp in range(start, start + 2 * WINDOW):
            handles = cluster.checkpoint(cp)
            objects.append({h.segments[-1].path for h in handles})
        after = _stats(tree)
        cluster.close()
    relayed = sum(after[n].bytes_relayed - before[n].bytes_relayed for n in after)
    total = sum(after[n].bytes_own - before[n].bytes_own for n in after)
    assert total >= len(NODES) * WRITERS_PER_NODE * PER_WRITER * 2 * WINDOW  # + segment framing
    assert relayed / total <= 0.05, "after the first window at most 5 % is relayed"
    collectors = {n for n, s in after.items() if s.writes_for_window}
    assert collectors == {"root", "a", "b"}
    per_cp = len(NODES) * WRITERS_PER_NODE * PER_WRITER
    bound = math.ceil(per_cp / TARGET) + len(collectors)
    assert max(len(o) for o in objects) <= bound
    written = sum(after[n].bytes_written - before[n].bytes_written for n in after)
    count = sum(after[n].objects_written - before[n].objects_written for n in after)
    # a's and b's subtrees exceed the target: their objects are at least half of it
    sub_objects = sum(after[n].objects_written - before[n].objects_written for n in ("a", "b"))
    sub_bytes = sum(after[n].bytes_written - before[n].bytes_written for n in ("a", "b"))
    assert sub_bytes / sub_objects >= TARGET / 2
    # every byte written in these windows was a segment of this run: own bytes of the
    # 14 writers (relayed bytes are counted once, where they are written)
    assert written == total and count >= 2 * WINDOW


def test_killing_a_planned_collector_mid_window(tmp_path: Path) -> None:
    base = str(tmp_path / "dfs")
    with InProcessTree(_topology(base), ObjectStore(base)) as tree:
        cluster = Cluster(tree, base)
        _registered(tree)
        a1 = tree.nodes["a1"].core
        acked, cp = [], 0
        # run until a's subtree is planned to write at a (estimates and plans settle)
        while cp < 8 * WINDOW:
            acked.append(cluster.checkpoint(cp))
            cp += 1
            time.sleep(CHECKPOINT_INTERVAL)  # pacing: the job's checkpoint interval
            planned = a1.collector_for(cp)
            if planned is not None and planned[0] == "a" and cp % WINDOW == 1:
                break
        assert a1.collector_for(cp) == ("a", tree.address("a")), "a collects for a1"
        tree.nodes["a"].stop()  # the planned collector of a, a1, a2 dies mid-window
        # a's own writers keep writing: their client falls back to direct DFS writes
        last_cp = cp + 3 * WINDOW
        late = []
        for c in range(cp, last_cp):
            late.append(cluster.checkpoint(c))
            time.sleep(CHECKPOINT_INTERVAL)  # pacing: the job's checkpoint interval
        root = tree.address("root")
        wait_until(lambda: a1.parent == root, timeout=10)  # re-homed to the next live ancestor
        next_collector = a1.collector_for(last_cp - 1)
        cluster.close()
    assert next_collector is not None and next_collector[0] != "a", "the next plan avoids a"
    store = ObjectStore(base)
    for i in range(len(cluster.writers)):
        # every checkpoint's change of this writer is in its latest handle, none lost
        got = list(read_changes(store, late[-1][i], i % 8))
        assert got == [_payload(c, i) for c in range(last_cp)]
    assert [len(h) for h in acked] == [len(cluster.writers)] * len(acked)
