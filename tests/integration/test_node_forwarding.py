"""Forwarding through in-process nodes (threads of this process, real sockets over
loopback, a local store): a chain passes on more than a message may carry without any
refusal or parent timeout, and every persist is acked by the root and reads back."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import zmq
from fsspec.implementations.local import LocalFileSystem

from dstltree.aggregator.core import NodeConfig
from dstltree.aggregator.events import Instruction, ObjectWritten, ReplyBelow, SendUpstream
from dstltree.aggregator.node import Node
from dstltree.client import ChangelogClient
from dstltree.client.handle import ChangelogHandle
from dstltree.client.node_uploader import NodeUploader
from dstltree.client.reader import read_changes
from dstltree.client.wire import Register, load
from dstltree.storage.faults import FaultyFileSystem
from dstltree.storage.store import ObjectStore
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

MAX_MESSAGE = 256 * 1024  # bytes: the nodes' max_message_bytes


@contextmanager
def _chain(base: str, depth: int, delay: float = 0.2, **node_kw: object) -> Iterator[list[Node]]:
    """``depth`` nodes, root first; the root writes objects of 64 KiB, the others only
    pass items on (hop by hop, no plans); ``delay``: their persist delay (s)."""
    store = ObjectStore(base)
    nodes: list[Node] = []
    try:
        for i in range(depth):
            parent = nodes[-1].address if nodes else None
            size = 64 * 1024 if parent is None else 1 << 40
            cfg = NodeConfig(f"n{i}", parent, size, plans=False, persist_delay=delay)
            node = Node(cfg, store, security=None, **node_kw)  # type: ignore[arg-type]
            node.start()
            nodes.append(node)
        yield nodes
    finally:
        for n in reversed(nodes):
            n.stop()


def test_a_chain_passes_on_more_than_one_message_may_carry(tmp_path: Path) -> None:
    """Within one persist delay the leaf gathers 4x the message limit: it passes the
    items on in several messages, none refused by the root, none timed out."""
    base = str(tmp_path / "dfs")
    bodies = [os.urandom(40 * 1024) for _ in range(26)]  # 1 MiB+ in 40 KiB segments
    with (
        _chain(base, 2, max_message_bytes=MAX_MESSAGE) as (root, leaf),
        ChangelogClient.open(base, node=leaf.address, max_message_bytes=MAX_MESSAGE // 2) as client,
    ):
        w = client.create_writer("fwd", range(4))
        futures, after = [], 0
        for k, body in enumerate(bodies):
            w.append(k % 4, body)
            futures.append(w.persist_durably(after))
            after = w.next_sqn()
        handles = [f.result(timeout=30) for f in futures]
        # statistics are a snapshot the node's loop refreshes after the turn that acked
        wait_until(lambda: root.statistics().segments_written == len(bodies), timeout=10)
        up, down = leaf.statistics(), root.statistics()
        assert up.parent_timeouts == 0 and down.rejected_messages == 0
        assert up.objects_written == 0 and down.segments_written == len(bodies)
        assert down.messages_below >= 4, "the leaf's flush went up in several messages"
        assert isinstance(client.uploader, NodeUploader)
        assert client.uploader.statistics().fallbacks == 0
        assert all(r.path.startswith(base) for h in handles for r in h.segments)
    for k, (h, body) in enumerate(zip(handles, bodies, strict=True)):
        assert list(read_changes(ObjectStore(base), h, k % 4)) == [body]


def test_writers_on_many_threads_lose_no_wake_up(tmp_path: Path) -> None:
    """Posts only wake the uploader's I/O thread when no wake-up is pending: persists
    from four threads at once are all sent and acked by the node (none falls back)."""
    base = str(tmp_path / "dfs")
    with (
        _chain(base, 1, delay=0.005) as (root,),
        ChangelogClient.open(base, node=root.address) as client,
    ):

        def run(k: int) -> list[ChangelogHandle]:
            w = client.create_writer(f"t{k}", range(4))
            out, after = [], 0
            for i in range(50):
                w.append(i % 4, b"%d-%d" % (k, i))
                out.append(w.persist_durably(after).result(timeout=30))
                after = w.next_sqn()
            return out

        with ThreadPoolExecutor(4) as pool:
            handles = [h for hs in pool.map(run, range(4)) for h in hs]
        assert isinstance(client.uploader, NodeUploader)
        assert client.uploader.statistics().fallbacks == 0
        assert client.uploader.statistics().acked_by_node == len(handles) == 200


class _RecordingNode(Node):
    """A real node that notes which thread sent each reply below, by message type."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replies: list[tuple[str, str]] = []

    def _run(self, instructions: list[Instruction], on_loop: bool = True) -> None:
        for i in instructions:
            if isinstance(i, ReplyBelow):
                self.replies.append((threading.current_thread().name, type(i.message).__name__))
        super()._run(instructions, on_loop)


@pytest.mark.parametrize("loop_writes", [False, True])
def test_the_thread_that_wrote_an_object_sends_its_acks(tmp_path: Path, loop_writes: bool) -> None:
    """The thread that wrote an object hands the outcome to the core and sends its acks
    itself (no hand-off back to the loop); a persist sent meanwhile is still read (the
    loop waits on the front's edge-triggered descriptor, which those sends may take).
    With ``loop_writes`` the loop writes an object itself while no other write runs,
    else write threads write them all."""
    base = str(tmp_path / "dfs")
    cfg = NodeConfig("w", None, 1 << 20, plans=False, persist_delay=0.001)
    # any write counts as fast: the loop writes whenever no other write runs
    node = _RecordingNode(
        cfg, ObjectStore(base), security=None, loop_writes=loop_writes, loop_write_fast_s=60.0
    )
    node.start()
    try:
        with ChangelogClient.open(base, node=node.address) as client:
            writers = [client.create_writer(f"t{k}", range(4)) for k in range(2)]

            def run(w: Any) -> int:
                after = 0
                for i in range(40):
                    w.append(i % 4, os.urandom(1000))
                    w.persist_durably(after).result(timeout=30)
                    after = w.next_sqn()
                return after

            with ThreadPoolExecutor(2) as pool:
                assert list(pool.map(run, writers)) == [40, 40]
            assert isinstance(client.uploader, NodeUploader)
            assert client.uploader.statistics().fallbacks == 0
    finally:
        node.stop()
    acks = [thread for thread, kind in node.replies if kind == "PersistAck"]
    by_loop = [t for t in acks if t == "node-w"]
    assert len(acks) >= 40, acks[:5]
    assert all(t == "node-w" or t.startswith("node-w-write-") for t in acks), acks[:5]
    stats = node.statistics()
    assert len(by_loop) == stats.loop_writes  # a write that took 10 ms may pause them
    assert (stats.loop_writes > 0) == loop_writes


def test_the_loop_writes_nothing_itself_on_a_slow_store(tmp_path: Path) -> None:
    """Every put takes 5 ms: the node's writes never prove fast (a moving average of
    2 ms or less, the first written by a write thread), so the loop writes none."""
    fs = FaultyFileSystem(LocalFileSystem(), "none,stall=1.0,stall_s=0.005")
    base = str(tmp_path / "dfs")
    cfg = NodeConfig("w", None, 1, plans=False)  # every persist is an object at once
    node = Node(cfg, ObjectStore(base, fs=fs), security=None)
    node.start()
    try:
        with ChangelogClient.open(base, node=node.address) as client:
            w = client.create_writer("t", range(4))
            after = 0
            for i in range(10):
                w.append(i % 4, os.urandom(100))
                assert w.persist_durably(after).result(timeout=20).segments
                after = w.next_sqn()
        stats = node.statistics()
        assert stats.objects_written == 10
        assert stats.loop_writes == 0 and stats.loop_takeovers == 0, stats
    finally:
        fs.release()
        node.stop()


def test_the_loop_leaves_large_objects_to_write_threads(tmp_path: Path) -> None:
    """Writes count as fast here, yet an object above 256 KiB goes to a write thread
    (the loop reads the front meanwhile); small ones after the first are the loop's."""
    base = str(tmp_path / "dfs")
    cfg = NodeConfig("w", None, 1, plans=False)  # every persist is an object at once
    node = Node(cfg, ObjectStore(base), security=None, loop_write_fast_s=60.0)
    node.start()
    try:
        with ChangelogClient.open(base, node=node.address) as client:
            w = client.create_writer("t", range(4))
            after = 0
            for size in (100, 300 * 1024, 100, 300 * 1024, 100):
                w.append(0, os.urandom(size))
                assert w.persist_durably(after).result(timeout=20).segments
                after = w.next_sqn()
        stats = node.statistics()
        assert stats.objects_written == 5, stats
        # the small ones after the first are the loop's; on a stalled machine the first
        # of them can outlast the deputy's 10 ms, and then the last goes to a thread too
        small = 2 if stats.loop_takeovers == 0 else 1
        assert stats.loop_writes in (small, 2), stats
    finally:
        node.stop()


def test_a_write_hanging_on_the_loop_does_not_stop_the_node(tmp_path: Path) -> None:
    """The loop writes an object itself and the store stalls that write: a deputy
    thread serves the loop meanwhile, so another writer's persist is read, written by
    a write thread and acked while the stalled one waits; the stalled one is acked
    once the store lets it through."""
    fs = FaultyFileSystem(LocalFileSystem(), "none,stall_s=60")
    base = str(tmp_path / "dfs")
    cfg = NodeConfig("w", None, 1, plans=False)  # every persist is an object at once
    node = Node(cfg, ObjectStore(base, fs=fs), security=None, loop_write_fast_s=60.0)
    node.start()
    try:
        with ChangelogClient.open(base, node=node.address, ack_timeout=60.0) as client:
            stalled, other = (client.create_writer(f"t{k}", range(4)) for k in range(2))
            stalled.append(0, b"fast")  # on a write thread: the node's first write
            assert stalled.persist_durably(0).result(timeout=20).segments
            after = stalled.next_sqn()
            fs.inject("put", "stall")  # the next object's write (the loop's) hangs
            stalled.append(0, b"first")
            first = stalled.persist_durably(after)
            wait_until(lambda: node.statistics().loop_takeovers == 1, timeout=10)
            other.append(1, b"second")
            assert other.persist_durably(0).result(timeout=20).segments
            assert not first.done()
            stats = node.statistics()
            assert stats.loop_writes == 1 and stats.loop_takeovers == 1, stats
            fs.release()  # the stalled write goes on
            assert first.result(timeout=20).segments
            assert node.statistics().objects_written == 3
            assert isinstance(client.uploader, NodeUploader)
            assert client.uploader.statistics().fallbacks == 0
    finally:
        fs.release()
        node.stop()


def test_upstream_sends_decided_off_the_loop_are_sent_by_the_loop(tmp_path: Path) -> None:
    """A write thread may not use the DEALERs the loop polls: what the core tells it to
    send upstream waits for the loop, which sends it (in order) on its next turn."""
    ctx = zmq.Context.instance()
    parent = ctx.socket(zmq.ROUTER)
    parent.setsockopt(zmq.LINGER, 0)
    port = parent.bind_to_random_port("tcp://127.0.0.1")
    cfg = NodeConfig("leaf", f"tcp://127.0.0.1:{port}", 1 << 40, plans=False)
    node = Node(cfg, ObjectStore(str(tmp_path / "dfs")), security=None, heartbeat=10.0)
    node.start()
    try:
        up = cfg.parent_address
        assert up is not None
        with node._lock:  # as a write thread does
            node._run([SendUpstream(up, Register("a")), SendUpstream(up, Register("b"))], False)
            assert list(node._deferred) != []
        got: list[str] = []

        def received() -> bool:
            while parent.poll(0):
                msg = load(parent.recv_multipart(copy=False)[1:])
                if isinstance(msg, Register):
                    got.append(msg.log_id)
            return got == ["a", "b"]

        wait_until(received, timeout=10)
        assert not node._deferred
    finally:
        node.stop()
        parent.close()


def test_a_core_failure_on_a_write_thread_stops_the_node(tmp_path: Path) -> None:
    """The core fails while a write thread hands it an object's outcome: the node's
    loop raises that error (serve ends with it), as when the core fails on the loop;
    it is not just logged by the upload's callback while the node serves on."""
    cfg = NodeConfig("w", None, 1 << 20, plans=False, persist_delay=0.001)
    node = Node(cfg, ObjectStore(str(tmp_path / "dfs")), security=None)
    handle = node.core.handle

    def failing(event: Any) -> Any:
        if isinstance(event, ObjectWritten):
            raise RuntimeError("core failed")
        return handle(event)

    node.core.handle = failing  # type: ignore[method-assign]
    raised: list[BaseException] = []

    def serve() -> None:
        try:
            node.serve()
        except RuntimeError as e:
            raised.append(e)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with ChangelogClient.open(str(tmp_path / "dfs"), node=node.address, ack_timeout=1.0) as c:
            w = c.create_writer("t", range(4))
            w.append(0, b"x")
            w.persist_durably(0)  # its ack never comes from this node: DFS after 1 s
            wait_until(lambda: not t.is_alive(), timeout=20)
    finally:
        node.stop()
        t.join(10)
    assert [str(e) for e in raised] == ["core failed"]


def test_segments_of_large_changes_go_up_a_chain_as_several_frames(tmp_path: Path) -> None:
    """A segment whose large changes are sent as frames of their own (never copied by
    the client: ``encode_segment_parts``) passes a leaf and lands whole in the root's
    object, next to segments sent as one frame; every change reads back."""
    from dstltree.client.segment import encode_segment_parts

    base = str(tmp_path / "dfs")
    large = {kg: [os.urandom(9000 + kg), os.urandom(300_000)] for kg in range(3)}
    small = [os.urandom(30) for _ in range(50)]
    assert len(encode_segment_parts("x", 0, 1, {0: large})) > 1
    with (
        _chain(base, 2) as (root, leaf),
        ChangelogClient.open(base, node=leaf.address) as client,
    ):
        w = client.create_writer("frames", range(4))
        for kg, changes in large.items():
            for c in changes:
                w.append(kg, c)
        first = w.persist_durably(0)
        after = w.next_sqn()
        for c in small:
            w.append(3, c)
        second = w.persist_durably(after)
        handles = [first.result(timeout=30), second.result(timeout=30)]
        assert isinstance(client.uploader, NodeUploader)
        assert client.uploader.statistics().fallbacks == 0
        assert leaf.statistics().objects_written == 0
    store = ObjectStore(base)
    for kg, changes in large.items():
        assert list(read_changes(store, handles[0], kg)) == changes
    assert list(read_changes(store, handles[1], 3)) == small
