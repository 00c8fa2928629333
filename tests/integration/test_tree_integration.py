"""A real 3-node tree over loopback with 8 writers: objects are shared, acks route back,
and killing a node mid-flush loses no acknowledged change."""

from __future__ import annotations

from pathlib import Path

import zmq

from dstltree.client import ChangelogClient, ChangelogHandle, ObjectStore
from dstltree.client.batching import PersistItem
from dstltree.client.reader import read_changes
from dstltree.client.segment import SegmentMeta, encode_segment
from dstltree.client.wire import Error, Persist, PersistRequest, dump, load
from dstltree.security import configure_client
from tests.support.tree_fixtures import metric, start
from tests.support.waiting import wait_until

WRITERS = 8


def _clients(tree, base: str, ack_timeout: float = 5.0) -> list[ChangelogClient]:
    # writers 0-3 on node a, 4-7 on node b (two "executors")
    return [
        ChangelogClient.open(
            base,
            node=tree.address("a" if i < 4 else "b"),
            ack_timeout=ack_timeout,
            security=tree.client_security,  # CURVE: the tree's writer keys
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


def _registered_at_root(tree) -> None:  # type: ignore[no-untyped-def]
    """Wait until every writer's registration reached its node and the nodes' stats
    reached the root (the root's all-persisted rule counts them)."""
    url = tree.metrics_url("root")
    wait_until(lambda: metric(url, "dstl_writers_below") == WRITERS, timeout=15)


def test_tree_merges_writers_into_shared_objects(tmp_path: Path) -> None:
    with start(tmp_path, metrics_port=0) as tree:
        base = str(tmp_path / "dfs")
        clients = _clients(tree, base)
        writers = [c.create_writer(f"task{i}", range(4)) for i, c in enumerate(clients)]
        _registered_at_root(tree)
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


def _request(size: int, data: bytes | None) -> PersistRequest:
    return PersistRequest(1, PersistItem(SegmentMeta("x", 0, 1, (), size), None, data))


def test_malformed_message_gets_error_and_node_keeps_serving(tmp_path: Path) -> None:
    with start(tmp_path, max_message_bytes=1024) as tree:
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        configure_client(s, tree.client_security)
        s.connect(tree.address("a"))
        bad = [
            [b"\xc1garbage"],
            [b"\x81\xa1t\xa4nope"],  # msgpack {"t": "nope"}
            dump(Persist((_request(5, None),))),  # header says 5 bytes, no frame
            dump(Persist((_request(4096, b"z" * 4096),))),  # too big
        ]
        poller = zmq.Poller()
        poller.register(s, zmq.POLLIN)
        for frames in bad:
            s.send_multipart(frames)
            assert poller.poll(5000), "node did not answer"
            reply = load(s.recv_multipart())
            assert isinstance(reply, Error), reply
            assert reply.message.startswith(
                ("header", "unknown message type", "persist has", "message of")
            )
        s.close(0)
        base = str(tmp_path / "dfs")
        c = ChangelogClient.open(base, node=tree.address("a"), security=tree.client_security)
        w = c.create_writer("after-garbage", range(2))
        w.append(0, b"still serving")
        h = w.persist_durably(0).result(timeout=30)
        assert list(c.read_changes(h, 0)) == [b"still serving"]
        assert c.uploader.statistics().fallbacks == 0  # type: ignore[attr-defined]
        c.close()


def _received(handles: list[list[ChangelogHandle]], writers: int) -> int:
    """Segment bytes node a received for its first ``writers`` writers' handles."""
    return sum(h[i].segments[-1].length for h in handles for i in range(writers))


def test_killing_a_node_mid_flush_loses_no_acknowledged_change(tmp_path: Path) -> None:
    base = str(tmp_path / "dfs")
    # a long persist delay keeps segments queued at the nodes when we kill
    with start(tmp_path, persist_delay=0.5, parent_timeout=0.5, metrics_port=0) as tree:
        clients = _clients(tree, base, ack_timeout=2.0)
        writers = [c.create_writer(f"task{i}", range(4)) for i, c in enumerate(clients)]
        acked = _run_checkpoints(clients, writers, 2)
        url_a = tree.metrics_url("a")
        wait_until(lambda: metric(url_a, "dstl_bytes_received_total") >= _received(acked, 4))
        received = metric(url_a, "dstl_bytes_received_total")
        new_bytes = 0
        for i, w in enumerate(writers):
            sqn, change = w.statistics().active_sqn, f"w{i}-killed".encode()
            w.append(i % 4, change)
            if i < 4:
                new_bytes += len(encode_segment(w.log_id, sqn, sqn + 1, {sqn: {i % 4: [change]}}))
        pending = [w.persist_durably(0) for w in writers]  # no checkpoint id: waits the delay
        # node a has the new segments of writers 0-3 (it holds them for the persist delay)
        wait_until(
            lambda: metric(url_a, "dstl_bytes_received_total") >= received + new_bytes, timeout=5
        )
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
        for cp, cp_handles in enumerate(acked, start=1):  # earlier acked changes are readable
            got = {c.decode() for c in read_changes(store, cp_handles[i], i % 4)}
            assert {f"w{i}-cp{cp}-{k}" for k in range(5)} <= got
