"""A real 3-node tree over loopback with 8 writers: objects are shared, acks route back,
and killing a node mid-flush loses no acknowledged change."""

from __future__ import annotations

import time
from pathlib import Path

import zmq

from client import ChangelogClient, ChangelogHandle, ObjectStore
from client.reader import read_changes
from client.wire import Error, Persist, WireItem, dump, load
from tests.tree_fixtures import start

WRITERS = 8


def _clients(tree, base: str, ack_timeout: float = 5.0) -> list[ChangelogClient]:
    # writers 0-3 on node a, 4-7 on node b (two "executors")
    return [
        ChangelogClient.open(
            base, node=tree.address("a" if i < 4 else "b"), ack_timeout=ack_timeout
        )
        for i in range(WRITERS)
    ]


def _run_checkpoints(
    clients, writers, checkpoints: int, start_cp: int = 1
) -> list[list[ChangelogHandle]]:
    out = []
    for cp in range(start_cp, start_cp + checkpoints):
        for i, w in enumerate(writers):
            for k in range(5):
                w.append(i % 4, f"w{i}-cp{cp}-{k}".encode())
        futures = [w.persist_durably(0, checkpoint_id=cp) for w in writers]
        out.append([f.result(timeout=30) for f in futures])
    return out


def test_tree_merges_writers_into_shared_objects(tmp_path: Path) -> None:
    with start(tmp_path) as tree:
        base = str(tmp_path / "dfs")
        clients = _clients(tree, base)
        writers = [c.create_writer(f"task{i}", range(4)) for i, c in enumerate(clients)]
        time.sleep(0.3)  # registrations reach the nodes and their stats reach the root
        handles = _run_checkpoints(clients, writers, 5)
        for c in clients:
            c.close()
    store = ObjectStore(base)
    last = handles[-1]
    # every change of every checkpoint is readable, in order
    for i, h in enumerate(last):
        got = [c.decode() for kg in range(4) for c in read_changes(store, h, kg)]
        want = [f"w{i}-cp{cp}-{k}" for cp in range(1, 6) for k in range(5)]
        assert sorted(got) == sorted(want)
    # the root wrote objects shared by many writers: about 1 object per checkpoint
    objects = store.list_objects()
    per_cp = [len({p for h in hs for p in {h.segments[-1].path}}) for hs in handles]
    assert max(per_cp) <= 2, per_cp
    assert len(objects) <= 2 * len(handles)


def test_malformed_message_gets_error_and_node_keeps_serving(tmp_path: Path) -> None:
    with start(tmp_path, max_message_bytes=1024) as tree:
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(tree.address("a"))
        bad = [
            [b"\xc1garbage"],
            [b"\x81\xa1t\xa4nope"],  # msgpack {"t": "nope"}
            dump(Persist((WireItem(1, "x", 0, 1, None, (), 5, 0),), ())),  # missing frame
            dump(Persist((WireItem(1, "x", 0, 1, None, (), 4096, 0),), (b"z" * 4096,))),  # too big
        ]
        poller = zmq.Poller()
        poller.register(s, zmq.POLLIN)
        for frames in bad:
            s.send_multipart(frames)
            assert poller.poll(5000), "node did not answer"
            reply = load(s.recv_multipart())
            assert isinstance(reply, Error) and reply.message
        s.close(0)
        base = str(tmp_path / "dfs")
        c = ChangelogClient.open(base, node=tree.address("a"))
        w = c.create_writer("after-garbage", range(2))
        w.append(0, b"still serving")
        h = w.persist_durably(0).result(timeout=30)
        assert list(c.read_changes(h, 0)) == [b"still serving"]
        assert c.uploader.statistics().fallbacks == 0  # type: ignore[attr-defined]
        c.close()


def test_killing_a_node_mid_flush_loses_no_acknowledged_change(tmp_path: Path) -> None:
    base = str(tmp_path / "dfs")
    # a long persist delay keeps segments queued at the nodes when we kill
    with start(tmp_path, persist_delay=0.5, parent_timeout=0.5) as tree:
        clients = _clients(tree, base, ack_timeout=2.0)
        writers = [c.create_writer(f"task{i}", range(4)) for i, c in enumerate(clients)]
        acked = _run_checkpoints(clients, writers, 2)
        for i, w in enumerate(writers):
            w.append(i % 4, f"w{i}-killed".encode())
        pending = [w.persist_durably(0) for w in writers]  # no checkpoint id: waits the delay
        time.sleep(0.1)
        tree.nodes["a"].kill()  # node a dies holding the segments of writers 0-3
        tree.nodes["root"].kill()  # and the root: node b must write itself
        handles = [f.result(timeout=30) for f in pending]
        more = _run_checkpoints(clients, writers, 1, start_cp=10)[0]
        for c in clients:
            c.close()
    store = ObjectStore(base)
    for i, (h, h2) in enumerate(zip(handles, more, strict=True)):
        got = [c.decode() for kg in range(4) for c in read_changes(store, h2, kg)]
        assert f"w{i}-killed" in got
        assert f"w{i}-killed" in [c.decode() for c in read_changes(store, h, i % 4)]
        for cp_handles in acked:  # earlier acknowledged changes are all still readable
            assert list(read_changes(store, cp_handles[i], i % 4))
