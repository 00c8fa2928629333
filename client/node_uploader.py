"""The uploader that sends segments to the aggregator node of this executor.

One DEALER socket owned by an I/O thread; ``submit`` is thread-safe. A segment not
acked within ``ack_timeout`` seconds, or answered with an error, is written straight to
DFS by the in-process uploader instead (docs/design.md, Invariants: liveness never depends
on one node). A late ack after such a fallback is ignored; the second copy is an orphan.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace

import zmq

from dstltree.client.batching import PersistItem
from dstltree.client.direct import DirectUploader
from dstltree.client.errors import DstlError
from dstltree.client.handle import SegmentRef
from dstltree.client.wire import (
    Error,
    Message,
    Persist,
    PersistAck,
    PersistRequest,
    Register,
    Unregister,
    dump,
    load,
)
from dstltree.security.curve import Curve, configure_client
from dstltree.storage.hedging import UploadPolicy
from dstltree.storage.store import ObjectStore

log = logging.getLogger("dstltree.client")


@dataclass
class _AwaitingAck:
    item: PersistItem
    future: Future[SegmentRef | None]
    deadline: float


@dataclass(frozen=True)
class UploaderStatistics:
    acked_by_node: int
    fallbacks: int
    node_errors: int


class NodeUploader:
    """Sends persist items to the node at ``address`` (a ZeroMQ endpoint).
    ``security``: CURVE as a writer (:meth:`Curve.for_writer`); None = plaintext."""

    def __init__(
        self,
        address: str,
        store: ObjectStore,
        ack_timeout: float = 10.0,
        lease_renewal: float = 2.0,
        retry_after: float = 5.0,
        upload_policy: UploadPolicy | None = None,
        security: Curve | None = None,
    ) -> None:
        self.address = address
        self._security = security
        self.store = store
        self.ack_timeout = ack_timeout
        self._renewal = lease_renewal
        self._retry_after = retry_after
        self._node_down_until = float("-inf")
        self._fallback = DirectUploader(store, upload_policy=upload_policy)
        self._outbox: queue.SimpleQueue[Message | tuple[PersistItem, Future]] = queue.SimpleQueue()
        self._pending: dict[int, _AwaitingAck] = {}
        self._ids = itertools.count(1)
        self._writers: set[str] = set()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._stop = threading.Event()
        self._counts = {"acked": 0, "fallbacks": 0, "errors": 0}
        self._thread = threading.Thread(target=self._loop, name="dstl-node-client", daemon=True)
        self._thread.start()

    # -- SegmentUploader -----------------------------------------------------------------
    def register(self, log_id: str) -> None:
        with self._lock:
            self._writers.add(log_id)
        self._post(Register(log_id))

    def unregister(self, log_id: str) -> None:
        with self._lock:
            self._writers.discard(log_id)
        self._post(Unregister(log_id))

    def submit(self, item: PersistItem) -> Future[SegmentRef | None]:
        if self._stop.is_set():
            raise DstlError("uploader is closed")
        fut: Future[SegmentRef | None] = Future()
        if item.data is None:
            fut.set_result(None)
        elif time.monotonic() < self._node_down_until:
            # the node did not answer lately: write straight to DFS until retry_after
            self._fall_back(_AwaitingAck(item, fut, 0.0), "node marked down")
            return fut
        self._post((item, fut))
        return fut

    def close(self) -> None:
        """Wait (bounded by the ack timeout) for pending items, then stop. Blocking."""
        deadline = time.monotonic() + self.ack_timeout + 1.0
        while time.monotonic() < deadline and (self._pending or not self._outbox.empty()):
            time.sleep(0.01)
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        self._fallback.close()

    @property
    def fallback(self) -> DirectUploader:
        """The in-process uploader of segments the node did not take (its ``hedged``
        uploader holds the counters of those DFS writes)."""
        return self._fallback

    def statistics(self) -> UploaderStatistics:
        c = self._counts
        return UploaderStatistics(c["acked"], c["fallbacks"], c["errors"])

    # -- I/O thread ----------------------------------------------------------------------
    def _post(self, what: Message | tuple[PersistItem, Future]) -> None:
        self._outbox.put(what)
        os.write(self._wake_w, b"x")

    def _loop(self) -> None:
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        configure_client(sock, self._security)
        sock.connect(self.address)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        next_renewal = time.monotonic() + self._renewal
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(50))
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
                self._send_outbox(sock)
                if sock in ready:
                    self._receive(sock)
                now = time.monotonic()
                self._expire(now)
                if now >= next_renewal:
                    next_renewal = now + self._renewal
                    with self._lock:
                        for log_id in self._writers:
                            self._send(sock, Register(log_id))
        finally:
            sock.close(0)
            os.close(self._wake_r)
            os.close(self._wake_w)
            for p in self._pending.values():
                self._fall_back(p, "uploader closed")

    def _send_outbox(self, sock: zmq.Socket) -> None:
        batch: list[tuple[PersistItem, Future]] = []
        while True:
            try:
                what = self._outbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(what, tuple):
                batch.append(what)
            else:
                self._send(sock, what)
        if batch:
            self._send_items(sock, batch)

    def _send_items(self, sock: zmq.Socket, batch: list[tuple[PersistItem, Future]]) -> None:
        now = time.monotonic()
        requests = []
        for item, fut in batch:
            rid = next(self._ids)
            if item.data is not None:
                self._pending[rid] = _AwaitingAck(item, fut, now + self.ack_timeout)
            requests.append(PersistRequest(rid, item))
        self._send(sock, Persist(tuple(requests)))

    def _send(self, sock: zmq.Socket, msg: Message) -> None:
        try:
            sock.send_multipart(dump(msg), zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as e:
            log.debug("send to node failed (%s); pending items time out and fall back", e)

    def _receive(self, sock: zmq.Socket) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                msg = load(frames)
            except Exception as e:  # noqa: BLE001 - a bad reply must not stop the thread
                log.warning("bad reply from node: %s", e)
                continue
            if isinstance(msg, PersistAck):
                self._on_ack(msg)
            elif isinstance(msg, Error):
                log.warning("node rejected a message: %s", msg.message)
                self._counts["errors"] += 1

    def _on_ack(self, ack: PersistAck) -> None:
        for e in ack.items:
            p = self._pending.pop(e.id, None)
            if p is None:
                continue
            if e.error is not None or e.path is None:
                self._counts["errors"] += 1
                self._fall_back(p, e.error or "no path")
                continue
            ref = SegmentRef(p.item.meta, e.path, e.offset)
            self._counts["acked"] += 1
            p.future.set_result(ref)

    def _expire(self, now: float) -> None:
        late = [r for r, p in self._pending.items() if p.deadline <= now]
        if late:
            self._node_down_until = now + self._retry_after
        for rid in late:
            self._fall_back(self._pending.pop(rid), f"no ack within {self.ack_timeout} s")

    def _fall_back(self, p: _AwaitingAck, why: str) -> None:
        """Write the segment straight to DFS; the future follows that upload."""
        meta = p.item.meta
        log.info(
            "node %s: %s; writing %s [%d, %d) directly",
            self.address,
            why,
            meta.log_id,
            meta.sqn_from,
            meta.sqn_to,
        )
        self._counts["fallbacks"] += 1
        item = replace(p.item, checkpoint_id=None, origin=None)
        try:
            direct = self._fallback.submit(item)
        except Exception as e:  # noqa: BLE001
            p.future.set_exception(e)
            return
        direct.add_done_callback(lambda f: _chain(f, p.future))


def _chain(src: Future[SegmentRef | None], dst: Future[SegmentRef | None]) -> None:
    if dst.done():
        return
    if (e := src.exception()) is not None:
        dst.set_exception(e)
    else:
        dst.set_result(src.result())
