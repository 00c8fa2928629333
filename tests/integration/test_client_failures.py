"""Clients that fail cleanly: a node uploader after ``close`` raises the project's error
and touches no descriptor, its DEALER is bounded, node error replies are counted; an
upload that never returns fails its persist at the upload deadline (the writer retries,
the in-flight bytes are released, the late object is deleted); losing and failed hedged
attempts are deleted during the run. Stores are ``faulty::`` (storage/faults.py)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator

import msgpack
import pytest
import zmq

from dstltree.aggregator.object_writer import ObjectWriter
from dstltree.client import ChangelogClient, node_uploader
from dstltree.client.errors import DstlError, PersistError
from dstltree.client.node_uploader import (
    HIGH_WATER_MARK,
    MAX_REPLY_BYTES,
    NodeUploader,
    configure_dealer,
)
from dstltree.client.wire import AckEntry, Error, PersistAck, dump
from dstltree.storage.errors import RetryableStorageError
from dstltree.storage.faults import FaultyFileSystem
from dstltree.storage.hedging import DEFAULT_UPLOAD_DEADLINE, UploadPolicy
from dstltree.storage.store import NO_RETRY, ObjectStore
from tests.support.items import persist_item
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store() -> Iterator[ObjectStore]:
    """A ``faulty::`` in-memory store without faults unless injected; stalls last until
    released (at teardown at the latest)."""
    url = f"faulty::memory://cf-{uuid.uuid4().hex[:8]}"
    s = ObjectStore(url, {"faulty": {"spec": "none,stall_s=600"}}, retry=NO_RETRY)
    assert isinstance(s.fs, FaultyFileSystem)
    yield s
    s.fs.release()


def _faults(store: ObjectStore) -> FaultyFileSystem:
    assert isinstance(store.fs, FaultyFileSystem)
    return store.fs


class _ErrorNode:
    """A ROUTER on loopback that answers every message with ``Error``; stopped by
    ``close``."""

    def __init__(self) -> None:
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.sock.poll(20):
                identity, *_ = self.sock.recv_multipart()
                self.received += 1
                self.sock.send_multipart([identity, *dump(Error("refused"))])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close(0)


def test_node_uploader_close_is_idempotent_and_use_after_close_touches_nothing(
    store: ObjectStore,
) -> None:
    up = NodeUploader("tcp://127.0.0.1:9", store, ack_timeout=0.2)
    up.register("w")
    up.close()
    up.close()  # a second close: no OSError
    assert up.closed
    # the freed descriptor numbers are reused by a pipe of someone else: nothing lands there
    r, w = os.pipe()
    try:
        os.set_blocking(r, False)
        with pytest.raises(DstlError, match="closed"):
            up.submit(persist_item("w", 0, {0: [b"x"]}))
        with pytest.raises(DstlError, match="closed"):
            up.register("w2")
        with pytest.raises(DstlError, match="closed"):
            up.unregister("w")
        with pytest.raises(BlockingIOError):
            os.read(r, 1)
    finally:
        os.close(r)
        os.close(w)


def test_node_uploader_counts_error_replies_and_falls_back(store: ObjectStore) -> None:
    node = _ErrorNode()
    try:
        uploader = NodeUploader(node.address, store, ack_timeout=1)
        with ChangelogClient(store, uploader, 1 << 20) as client:
            w = client.create_writer("w", range(2))
            w.append(1, b"change")
            handle = w.persist_durably(0, checkpoint_id=1).result(timeout=30)
            wait_until(lambda: uploader.statistics().error_replies >= 1)
            stats = uploader.statistics()
            assert stats.node_errors >= stats.error_replies >= 1
            # the node refused: the item went to DFS directly after the ack timeout
            assert stats.fallbacks == 1 and stats.acked_by_node == 0
            assert list(client.read_changes(handle, 1)) == [b"change"]
    finally:
        node.close()


def test_dealer_options_bound_messages_and_queues() -> None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        configure_dealer(sock)
        assert sock.getsockopt(zmq.MAXMSGSIZE) == MAX_REPLY_BYTES
        assert sock.getsockopt(zmq.SNDHWM) == sock.getsockopt(zmq.RCVHWM) == HIGH_WATER_MARK
        assert sock.getsockopt(zmq.LINGER) == 0
    finally:
        sock.close(0)


def test_uploads_have_a_default_deadline() -> None:
    assert UploadPolicy().deadline == DEFAULT_UPLOAD_DEADLINE > 0


def test_hung_upload_fails_at_its_deadline_then_the_writer_retries(store: ObjectStore) -> None:
    policy = UploadPolicy(attempts=1, deadline=0.3)
    client = ChangelogClient.open(store.base_url, fs=store.fs, upload_policy=policy)
    hedged = client.uploader.hedged  # type: ignore[attr-defined]
    try:
        w = client.create_writer("w", range(2))
        w.append(0, b"first")
        _faults(store).inject("put", "stall")  # this put hangs until released
        with pytest.raises(PersistError, match="upload deadline") as failed:
            w.persist_durably(0, checkpoint_id=1).result(timeout=10)
        assert isinstance(failed.value.__cause__, RetryableStorageError)
        assert client.in_flight.statistics().in_flight_bytes == 0
        assert hedged.stats.snapshot()["deadline_failures"] == 1
        # the next persist uploads the kept change again, and it reads back
        handle = w.persist_durably(0, checkpoint_id=2).result(timeout=10)
        assert list(client.read_changes(handle, 0)) == [b"first"]
        # the hung put completes late: ignored, its object deleted as a loser
        _faults(store).release()
        assert hedged.drain(10)
        assert hedged.stats.snapshot()["losers_deleted"] == 1
        assert store.list_objects() == [handle.segments[0].path]
    finally:
        client.close()


def test_losing_hedged_attempt_is_deleted_during_the_run(store: ObjectStore) -> None:
    writer = ObjectWriter(store, UploadPolicy(attempts=2, upload_timeout=0.05))
    _faults(store).inject("put", "stall")  # the first attempt is slow
    path, refs = writer.write([persist_item("w", 0, {0: [b"x"]})])
    assert refs[0].path == path
    assert writer.upload_stats()["hedge_wins"] == 1
    _faults(store).release()
    wait_until(lambda: writer.upload_stats()["losers_deleted"] == 1)
    assert store.list_objects() == [path]


def test_failed_hedged_attempt_is_deleted(store: ObjectStore) -> None:
    writer = ObjectWriter(store, UploadPolicy(attempts=2, upload_timeout=0.05))
    _faults(store).inject("put", "stall")  # the first attempt is slow but wins
    _faults(store).inject("put", "reset")  # the hedge fails

    def release_once_the_hedge_failed() -> None:
        wait_until(lambda: writer.upload_stats()["failed_attempts_deleted"] == 1)
        _faults(store).release()

    releaser = threading.Thread(target=release_once_the_hedge_failed, daemon=True)
    releaser.start()
    path, _ = writer.write([persist_item("w", 0, {0: [b"x"]})])
    releaser.join(timeout=15)
    assert writer.drain(10)
    stats = writer.upload_stats()
    assert stats["failed_attempts"] == 1 and stats["failed_attempts_deleted"] == 1
    assert store.list_objects() == [path]


def test_a_silent_node_is_tried_less_and_less_often(store: ObjectStore) -> None:
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # takes messages, never answers
    silent.setsockopt(zmq.LINGER, 0)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    up = NodeUploader(
        f"tcp://127.0.0.1:{port}", store, ack_timeout=0.1, retry_after=0.1, max_retry_after=0.4
    )
    try:
        for sqn in range(4):
            fut = up.submit(persist_item("w", sqn, {0: [b"x"]}))
            assert fut.result(timeout=10) is not None  # written to DFS directly
            wait_until(lambda: not up._backoff.down(time.monotonic()), timeout=5)
        stats = up.statistics()
        assert stats.fallbacks == 4 and stats.acked_by_node == 0
        assert stats.next_down_s == 0.4  # 0.1, 0.2, 0.4, then capped
    finally:
        up.close()
        silent.close(0)


def test_items_posted_while_others_await_acks_are_sent_at_once(store: ObjectStore) -> None:
    """Each item reaches the node when submitted, on the caller's thread, while earlier
    ones still await their acks; the acks of all resolve them."""
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # takes messages, never answers
    silent.setsockopt(zmq.LINGER, 0)
    silent.setsockopt(zmq.RCVTIMEO, 10_000)
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    up = NodeUploader(f"tcp://127.0.0.1:{port}", store, ack_timeout=30)
    try:
        futures, ids = [], []
        for sqn in range(3):
            futures.append(up.submit(persist_item("w", sqn, {0: [b"x"]})))
            frames = silent.recv_multipart()  # raises zmq.Again after 10 s
            while msgpack.unpackb(frames[1])["t"] != "persist":  # lease renewals interleave
                frames = silent.recv_multipart()
            ids += [r["id"] for r in msgpack.unpackb(frames[1])["items"]]
            assert len(up._pending) == sqn + 1
        assert not any(f.done() for f in futures)
        ack = PersistAck(tuple(AckEntry(i, "mem://obj", 7) for i in ids))
        silent.send_multipart([frames[0], *dump(ack)])
        refs = [f.result(timeout=10) for f in futures]
        assert [(r.path, r.offset) for r in refs if r is not None] == [("mem://obj", 7)] * 3
    finally:
        up.close()
        silent.close(0)


def test_sends_a_full_queue_refuses_wait_in_order_and_go_once_the_node_reads(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that stops reading fills ZeroMQ's queue (a high-water mark of 2 messages
    here, and the kernel's buffers): later items wait in the uploader instead of
    failing; once the node reads again every item reaches it once, in the order
    submitted, and its ack resolves it (no send failure, no fallback)."""
    monkeypatch.setattr(node_uploader, "HIGH_WATER_MARK", 2)
    node = zmq.Context.instance().socket(zmq.ROUTER)
    node.setsockopt(zmq.LINGER, 0)
    node.setsockopt(zmq.RCVHWM, 2)
    node.setsockopt(zmq.RCVTIMEO, 10_000)
    port = node.bind_to_random_port("tcp://127.0.0.1")
    up = NodeUploader(f"tcp://127.0.0.1:{port}", store, ack_timeout=120)
    body = os.urandom(1 << 20)
    try:
        futures = [up.submit(persist_item("w", sqn, {0: [body]})) for sqn in range(96)]
        wait_until(lambda: len(up._outbox) > 0, timeout=30)  # the queue and buffers are full
        ids: list[int] = []
        while len(ids) < len(futures):
            frames = node.recv_multipart()  # raises zmq.Again after 10 s
            header = msgpack.unpackb(frames[1])
            if header["t"] != "persist":  # a lease renewal
                continue
            batch = [r["id"] for r in header["items"]]
            ids += batch
            ack = PersistAck(tuple(AckEntry(i, "mem://obj", i) for i in batch))
            node.send_multipart([frames[0], *dump(ack)])
        refs = [f.result(timeout=30) for f in futures]
        assert ids == sorted(ids) and len(set(ids)) == len(futures)
        assert [r.offset for r in refs if r is not None] == ids
        stats = up.statistics()
        assert (stats.send_failures, stats.fallbacks) == (0, 0)
        assert stats.acked_by_node == len(futures)
    finally:
        up.close()
        node.close(0)
