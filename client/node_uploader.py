"""The uploader that sends segments to the aggregator node of this executor.

One DEALER socket owned by an I/O thread; ``submit`` is thread-safe. A segment not
acked within ``ack_timeout`` seconds, or answered with an error, is written straight to
DFS by the in-process uploader instead (docs/design.md, Invariants: liveness never depends
on one node). A late ack after such a fallback is ignored; the second copy is an orphan.

Lifecycle: ``close`` is idempotent; after it, ``register``, ``unregister`` and ``submit``
raise DstlError and touch nothing. The wake-up pipe belongs to the uploader: ``close``
closes it once, after the I/O thread has stopped (or the thread does on its way out if
it outlives ``close``'s join).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import zmq

from dstltree.client.batching import PersistItem
from dstltree.client.direct import DirectUploader
from dstltree.client.errors import DstlError
from dstltree.client.failover import NodePreference
from dstltree.client.futures import SegmentFuture
from dstltree.client.handle import SegmentRef
from dstltree.client.links import MonitoredDealer
from dstltree.client.wire import (
    Error,
    Message,
    PersistAck,
    PersistRequest,
    Register,
    Unregister,
    dump,
    load,
    persist_messages,
)
from dstltree.security.curve import Curve, configure_client
from dstltree.storage.hedging import UploadPolicy
from dstltree.storage.store import ObjectStore

log = logging.getLogger("dstltree.client")


@dataclass
class _AwaitingAck:
    item: PersistItem
    future: SegmentFuture[SegmentRef | None]
    deadline: float


#: the largest reply accepted from a node, bytes (acks are small; ZeroMQ drops larger)
MAX_REPLY_BYTES = 16 * 1024 * 1024
#: messages queued per direction before sends fail (counted) or receives stall
HIGH_WATER_MARK = 1024
# the I/O thread's poll timeout (posts wake it through the pipe; this only paces ack
# expiry and lease renewal); it never busy-polls while items await acks: that cost ~1000
# wake-ups/s per uploader for as long as an ack is due and won no throughput
_IDLE_POLL_MS = 50


@dataclass(frozen=True)
class UploaderStatistics:
    """Counters of one node uploader: items acked by the node, items written to DFS
    directly (``fallbacks``), items the node answered with an error (``node_errors``:
    failed ack entries plus ``error_replies``, the node's ``Error`` messages), and
    messages ZeroMQ would not queue (``send_failures``: the items time out and fall back),
    ``next_down_s``, seconds the node is marked down at its next silence, moves to the
    next node after a lost connection (``failovers``) and the items sent again there
    (``resent``)."""

    acked_by_node: int
    fallbacks: int
    node_errors: int
    error_replies: int = 0
    send_failures: int = 0
    next_down_s: float = 0.0
    failovers: int = 0
    resent: int = 0


def configure_dealer(sock: zmq.Socket) -> None:
    """The uploader's DEALER options: no linger, replies up to MAX_REPLY_BYTES,
    HIGH_WATER_MARK messages each way."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
    sock.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
    sock.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)


_LEAVE_LINGER_MS = 200  # ms a connection we leave keeps trying to send its last messages


class NodeUploader:
    """Sends persist items to the node at ``address`` (a ZeroMQ endpoint), or to the
    first of several nodes in order of preference (:mod:`dstltree.client.failover`):
    when ZeroMQ's heartbeats (every ``heartbeat`` s, a silence of three intervals) or
    the socket monitor report the connection lost, the items not yet acknowledged go
    again to the next node at once; the preferred node gets the traffic back once a
    probe connection to it stayed up for ``hold_down`` s.

    Times in seconds: an item not acked within ``ack_timeout`` goes to DFS directly and
    marks the node down for ``retry_after`` (doubling, up to ``max_retry_after``, while
    the node stays silent; reset by its next ack); meanwhile items go to DFS at once.
    ``security``: CURVE as a writer (:meth:`Curve.for_writer`); None = plaintext.
    ``max_message_bytes``: segment bytes per Persist message; more items queued at once
    go in several messages (a node refuses a message above its own limit, 64 MiB by
    default); an item above it goes alone."""

    def __init__(
        self,
        address: str | Sequence[str],
        store: ObjectStore,
        ack_timeout: float = 10.0,
        lease_renewal: float = 2.0,
        retry_after: float = 5.0,
        max_retry_after: float = 60.0,
        upload_policy: UploadPolicy | None = None,
        security: Curve | None = None,
        max_message_bytes: int = 16 * 1024 * 1024,
        heartbeat: float = 0.1,
        hold_down: float = 5.0,
    ) -> None:
        addresses = (address,) if isinstance(address, str) else tuple(address)
        self._pref = NodePreference(addresses, hold_down)
        self._heartbeat = heartbeat
        self._probe: MonitoredDealer | None = None  # its probe of a more preferred node
        self.max_message_bytes = max_message_bytes
        self._security = security
        self.store = store
        self.ack_timeout = ack_timeout
        self._renewal = lease_renewal
        self._retry_after = retry_after
        self._max_retry_after = max(max_retry_after, retry_after)
        self._down_for = retry_after  # doubles while the node stays silent
        self._node_down_until = float("-inf")
        self._fallback = DirectUploader(store, upload_policy=upload_policy)
        self._outbox: queue.SimpleQueue[Message | tuple[PersistItem, SegmentFuture]] = (
            queue.SimpleQueue()
        )
        self._pending: dict[int, _AwaitingAck] = {}
        self._ids = itertools.count(1)
        self._writers: set[str] = set()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)  # a full pipe already wakes the thread
        # a wake-up byte is on its way and the I/O thread has not drained the outbox
        # since: later posts need none (one pipe write per drain, not per item)
        self._wake_pending = False
        self._closed = False  # close() called: no more use
        self._fds_open = True
        self._thread_done = False
        self._fds_to_thread = False  # close() gave up waiting: the thread closes the pipe
        self._stop = threading.Event()
        self._counts = dict.fromkeys(
            ("acked", "fallbacks", "errors", "replies", "send", "failovers", "resent"), 0
        )
        self._thread = threading.Thread(target=self._loop, name="dstl-node-client", daemon=True)
        self._thread.start()

    # -- SegmentUploader -----------------------------------------------------------------
    def register(self, log_id: str) -> None:
        """Announce writer ``log_id`` to the node. Raises DstlError once closed."""
        with self._lock:
            self._check_usable()
            self._writers.add(log_id)
        self._post(Register(log_id))

    def unregister(self, log_id: str) -> None:
        """Withdraw writer ``log_id``. Raises DstlError once closed."""
        with self._lock:
            self._check_usable()
            self._writers.discard(log_id)
        self._post(Unregister(log_id))

    def submit(self, item: PersistItem) -> SegmentFuture[SegmentRef | None]:
        """Send ``item`` to the node (or to DFS while the node is marked down); the
        future resolves to its ref. Raises DstlError once closed."""
        with self._lock:
            self._check_usable()
        fut: SegmentFuture[SegmentRef | None] = SegmentFuture()
        if item.data is None:
            fut.set_result(None)
        elif time.monotonic() < self._node_down_until:
            # the node did not answer lately: write straight to DFS until retry_after
            self._fall_back(_AwaitingAck(item, fut, 0.0), "node marked down")
            return fut
        self._post((item, fut))
        return fut

    def close(self) -> None:
        """Wait (bounded by the ack timeout) for pending items, then stop the I/O thread
        and close the wake-up pipe. Blocking; idempotent (a second call returns at once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + self.ack_timeout + 1.0
        while (
            time.monotonic() < deadline
            and self._thread.is_alive()
            and (self._pending or not self._outbox.empty())
        ):
            time.sleep(0.01)
        self._stop.set()
        self._wake()
        self._thread.join(timeout=5)
        with self._lock:
            if self._thread_done:
                self._close_fds()
            else:  # still in its last poll: it closes the pipe on its way out
                self._fds_to_thread = True
        self._fallback.close()

    @property
    def address(self) -> str:
        """The node items go to now (the first of ``addresses`` unless it failed)."""
        return self._pref.address

    @property
    def addresses(self) -> tuple[str, ...]:
        """The nodes in order of preference."""
        return self._pref.addresses

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def fallback(self) -> DirectUploader:
        """The in-process uploader of segments the node did not take (its ``hedged``
        uploader holds the counters of those DFS writes)."""
        return self._fallback

    def statistics(self) -> UploaderStatistics:
        c = self._counts
        return UploaderStatistics(
            c["acked"],
            c["fallbacks"],
            c["errors"],
            c["replies"],
            c["send"],
            self._down_for,
            c["failovers"],
            c["resent"],
        )

    # -- pipe and lifecycle (callers hold no lock unless said) ----------------------------
    def _check_usable(self) -> None:
        """Raise DstlError if closed or the I/O thread is gone. Caller holds the lock."""
        if self._closed:
            raise DstlError(f"node uploader for {self.address} is closed")
        if self._thread_done:
            raise DstlError(f"node uploader for {self.address}: its I/O thread stopped")

    def _wake(self) -> None:
        """One byte into the wake-up pipe, unless the pipe is closed."""
        with self._lock:
            if self._fds_open:
                with contextlib.suppress(BlockingIOError):
                    os.write(self._wake_w, b"x")

    def _close_fds(self) -> None:
        """Close both ends of the pipe, once. Caller holds the lock."""
        if self._fds_open:
            self._fds_open = False
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _thread_exit(self) -> None:
        with self._lock:
            self._thread_done = True
            if self._fds_to_thread:
                self._close_fds()

    # -- I/O thread ----------------------------------------------------------------------
    def _post(self, what: Message | tuple[PersistItem, SegmentFuture]) -> None:
        """Queue ``what`` for the I/O thread; wake it unless a wake-up is pending (the
        thread clears the flag after reading the pipe and before draining the outbox,
        so an item queued before a post that saw the flag set is always drained)."""
        self._outbox.put(what)
        if not self._wake_pending:
            self._wake_pending = True
            self._wake()

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        link = self._open(self._pref.address, poller)
        next_renewal = time.monotonic() + self._renewal
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(self._poll_ms()))
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
                    self._wake_pending = False
                self._send_outbox(link.sock)
                if link.sock in ready:
                    self._receive(link.sock)
                now = time.monotonic()
                link = self._watch_links(link, ready, poller, now)
                self._expire(now)
                if now >= next_renewal:
                    next_renewal = now + self._renewal
                    self._register_all(link.sock)
        finally:
            link.close(poller)
            if self._probe is not None:
                self._probe.close(poller)
            self._fall_back_all()
            self._thread_exit()

    def _open(self, address: str, poller: zmq.Poller | None) -> MonitoredDealer:
        def configure(sock: zmq.Socket) -> None:
            configure_dealer(sock)
            configure_client(sock, self._security)

        return MonitoredDealer.open(address, configure, poller, self._heartbeat)

    def _register_all(self, sock: zmq.Socket) -> None:
        with self._lock:
            writers = list(self._writers)
        for log_id in writers:
            self._send(sock, Register(log_id))

    def _unregister_all(self, link: MonitoredDealer) -> None:
        """Withdraw the writers from a node still alive that we leave, so that it does
        not wait for them at its next checkpoint; the socket lingers briefly to send."""
        with self._lock:
            writers = list(self._writers)
        for log_id in writers:
            self._send(link.sock, Unregister(log_id))
        link.sock.setsockopt(zmq.LINGER, _LEAVE_LINGER_MS)

    # -- failover (the I/O thread) -------------------------------------------------------
    def _watch_links(
        self, link: MonitoredDealer, ready: dict, poller: zmq.Poller, now: float
    ) -> MonitoredDealer:
        """Act on the monitors: a lost connection to the current node moves to the next
        node (its unacknowledged items sent again there); a probe of a more preferred
        node that stayed up for the hold-down brings the traffic back. Returns the
        connection to send on."""
        pref = self._pref
        if link.monitor in ready and link.lost() and pref.lost(now) is not None:
            self._counts["failovers"] += 1
            return self._switch(link, poller, now, f"lost the connection to {link.address}")
        probe = self._probe
        if probe is not None and probe.monitor in ready:
            for up in probe.changes():
                pref.probe_seen(up, now)
        if pref.should_return(now) is not None:
            self._unregister_all(link)  # the node we leave stops counting our writers
            return self._switch(link, poller, now, f"it stayed up for {pref.hold_down:g} s")
        self._keep_probe(poller)
        return link

    def _keep_probe(self, poller: zmq.Poller) -> None:
        """A probe connection to the node to return to, while there is one."""
        pref, probe = self._pref, self._probe
        target = pref.probe_target()
        if target is None and probe is not None:
            probe.close(poller)
            self._probe = None
        elif target is not None and probe is None:
            self._probe = self._open(pref.addresses[target], None)
            poller.register(self._probe.monitor, zmq.POLLIN)

    def _switch(
        self, old: MonitoredDealer, poller: zmq.Poller, now: float, why: str
    ) -> MonitoredDealer:
        """Send to the node the preference chose from now on: a new connection, the
        writers registered, every unacknowledged item sent again (the old node's copy,
        if it wrote one, is never referenced: an orphan for the sweep)."""
        log.info("node %s -> %s: %s", old.address, self._pref.address, why)
        old.close(poller)
        if self._probe is not None and self._probe.address == self._pref.address:
            self._probe.close(poller)
            self._probe = None
        link = self._open(self._pref.address, poller)
        self._register_all(link.sock)
        pending, self._pending = self._pending, {}
        deadline = now + self.ack_timeout
        requests = []
        for rid, p in pending.items():
            self._pending[rid] = _AwaitingAck(p.item, p.future, deadline)
            requests.append(PersistRequest(rid, p.item))
        self._counts["resent"] += len(requests)
        for msg in persist_messages(requests, self.max_message_bytes) if requests else ():
            self._send(link.sock, msg)  # nothing pending: no (empty, refused) message
        return link

    def _poll_ms(self) -> int:
        """The next poll's timeout, ms: 0 if the outbox already holds something, else
        _IDLE_POLL_MS (every post wakes the thread through the pipe unless a wake-up is
        already on its way, so no post waits out the poll)."""
        return 0 if not self._outbox.empty() else _IDLE_POLL_MS

    def _fall_back_all(self) -> None:
        """The thread is stopping: items pending or never sent go to DFS directly."""
        for p in self._pending.values():
            self._fall_back(p, "uploader closed")
        self._pending.clear()
        while True:
            try:
                what = self._outbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(what, tuple) and what[0].data is not None:
                self._fall_back(_AwaitingAck(what[0], what[1], 0.0), "uploader closed")

    def _send_outbox(self, sock: zmq.Socket) -> None:
        batch: list[tuple[PersistItem, SegmentFuture]] = []
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

    def _send_items(self, sock: zmq.Socket, batch: list[tuple[PersistItem, SegmentFuture]]) -> None:
        deadline = time.monotonic() + self.ack_timeout
        requests = []
        for item, fut in batch:
            rid = next(self._ids)
            if item.data is not None:
                self._pending[rid] = _AwaitingAck(item, fut, deadline)
            requests.append(PersistRequest(rid, item))
        for msg in persist_messages(requests, self.max_message_bytes):
            self._send(sock, msg)

    def _send(self, sock: zmq.Socket, msg: Message) -> None:
        try:
            sock.send_multipart(dump(msg), zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as e:
            self._counts["send"] += 1
            log.debug("send to node failed (%s); pending items time out and fall back", e)

    def _receive(self, sock: zmq.Socket) -> None:
        """Handle every reply queued on ``sock`` (checked with ``EVENTS``: cheaper than
        a NOBLOCK receive raising zmq.Again at the end of each drain)."""
        while int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
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
                self._counts["replies"] += 1

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
            self._down_for = self._retry_after  # the node answers again
            p.future.set_result(ref)

    def _expire(self, now: float) -> None:
        # pending items are in send order, so their deadlines rise: stop at the first
        # one not due (O(late), not O(pending) per loop turn)
        late = []
        for r, p in self._pending.items():
            if p.deadline > now:
                break
            late.append(r)
        if late:
            # a node that stays silent is tried again less and less often (a dead node
            # costs its clients one ack timeout per try)
            self._node_down_until = now + self._down_for
            self._down_for = min(self._down_for * 2, self._max_retry_after)
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


def _chain(src: SegmentFuture[SegmentRef | None], dst: SegmentFuture[SegmentRef | None]) -> None:
    if dst.done():
        return
    if (e := src.exception()) is not None:
        dst.set_exception(e)
    else:
        dst.set_result(src.result())
