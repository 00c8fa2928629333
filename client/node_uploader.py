"""The uploader that sends segments to the aggregator node of this executor.

One DEALER socket shared under a lock: the caller of ``submit`` (thread-safe) sends its
request itself, so a segment costs no thread hand-off on its way out; an I/O thread
takes the replies, watches the connection and expires late items. It waits on the
socket's file descriptor (``zmq.FD``), never in a ZeroMQ call on the socket, so that the
socket is only ever used under the lock (ZeroMQ sockets may move between threads with
a memory barrier, never be used by two at once). The descriptor signals edge-triggered:
whoever used the socket last checks ``EVENTS`` and wakes the I/O thread through its pipe
when replies wait.

Liveness (:mod:`dstltree.client.liveness`): with wire version 2 the uploader sends a
``hello`` first on each link and pings its node (and its probe of a more preferred
node) every ``ping_interval`` seconds; ``liveness_timeout`` seconds without any message
from the node (a node whose loop is stuck still answers ZeroMQ's own heartbeats) is a
lost connection: the same failover as a disconnect. A node that refuses the writer's
wire versions is taken as down the same way (counted, logged).

A segment not acked within ``ack_timeout`` seconds, or answered with an error, is
written straight to DFS by the in-process uploader instead (docs/design.md, Invariants:
liveness never depends on one node). A late ack after such a fallback is ignored; the
second copy is an orphan. Futures are resolved, and fallbacks started, outside the
lock: a callback may submit again.

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
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import zmq

from dstltree.client.backoff import NodeBackoff
from dstltree.client.batching import PersistItem
from dstltree.client.direct import DirectUploader
from dstltree.client.errors import DstlError
from dstltree.client.failover import NodePreference
from dstltree.client.frames import NOBLOCK, recv_frames, send_frames
from dstltree.client.futures import SegmentFuture
from dstltree.client.handle import SegmentRef
from dstltree.client.links import MonitoredDealer, readable
from dstltree.client.liveness import (
    DEFAULT_LIVENESS_TIMEOUT,
    DEFAULT_PING_INTERVAL,
    PeerLiveness,
    check_timing,
)
from dstltree.client.wire import (
    BROADCAST,
    REFUSAL,
    WIRE_VERSIONS,
    Error,
    Message,
    Note,
    PersistAck,
    PersistRequest,
    Ping,
    Register,
    Unregister,
    WireHello,
    check_versions,
    dump,
    is_refusal,
    load,
    persist_messages,
    speaks_version_2,
    unknown_type,
)
from dstltree.security.curve import Curve, configure_client
from dstltree.storage.hedging import UploadPolicy
from dstltree.storage.store import ObjectStore

log = logging.getLogger("dstltree.client")


_Entry = PersistRequest | Message  # what waits to be sent: a request, or a whole message


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
ALL_DOWN_SWITCH_S = 1.0
"""Seconds between two failovers while every node is down: each node refuses its
connection at once, and switching at every refusal opened connections in a tight loop
(a bridge whose nodes were stopped ran out of file descriptors)."""


@dataclass(frozen=True)
class UploaderStatistics:
    """Counters of one node uploader: items acked by the node, items written to DFS
    directly (``fallbacks``), items the node answered with an error (``node_errors``:
    failed ack entries plus ``error_replies``, the node's ``Error`` messages), and
    messages ZeroMQ would not queue (``send_failures``: the items time out and fall back),
    ``next_down_s``, seconds the node is marked down at its next silence, moves to the
    next node after a lost connection (``failovers``) and the items sent again there
    (``resent``); nodes that went silent (``silences``: no message for the liveness
    timeout) and that refused the writer's wire versions (``refusals``); the wire
    version agreed with the current node (None: not known yet, or no hello sent);
    ``failover_log``: (wall-clock time, address left, wall-clock time the writer had
    come to it) of the latest failovers after a loss, oldest first (at most
    FAILOVER_LOG_SIZE); ``reconnects``: new connections to the only node after it
    disconnected (its unacknowledged items sent again)."""

    acked_by_node: int
    fallbacks: int
    node_errors: int
    error_replies: int = 0
    send_failures: int = 0
    next_down_s: float = 0.0
    failovers: int = 0
    resent: int = 0
    silences: int = 0
    refusals: int = 0
    wire_version: int | None = None
    failover_log: tuple[tuple[float, str, float], ...] = ()
    reconnects: int = 0


FAILOVER_LOG_SIZE = 256  # failovers remembered for the statistics


def configure_dealer(sock: zmq.Socket) -> None:
    """The uploader's DEALER options: no linger, replies up to MAX_REPLY_BYTES,
    HIGH_WATER_MARK messages each way."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
    sock.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
    sock.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)


# the uploader's counters (UploaderStatistics)
_COUNTS = [
    "acked",
    "fallbacks",
    "errors",
    "replies",
    "send",
    "failovers",
    "resent",
    "silences",
    "refusals",
    "reconnects",
]
_LEAVE_LINGER_MS = 200  # ms a connection we leave keeps trying to send its last messages


class NodeUploader:
    """Sends persist items to the node at ``address`` (a ZeroMQ endpoint), or to the
    first of several nodes in order of preference (:mod:`dstltree.client.failover`):
    when ZeroMQ's heartbeats (every ``heartbeat`` s, a silence of three intervals) or
    the socket monitor report the connection lost, the items not yet acknowledged go
    again to the next node at once; the preferred node gets the traffic back once a
    probe connection to it stayed up for ``hold_down`` s (with pings: answered them
    for ``hold_down`` s).

    Times in seconds: an item not acked within ``ack_timeout`` goes to DFS directly and
    marks the node down for ``retry_after`` (doubling, up to ``max_retry_after``, per
    try the node leaves silent); meanwhile items go to DFS at once. An ack ends the mark
    (and the doubling), answers to pings for ``hold_down`` end it too
    (:class:`~dstltree.client.backoff.NodeBackoff`).
    ``security``: CURVE as a writer (:meth:`Curve.for_writer`); None = plaintext.
    ``max_message_bytes``: segment bytes per Persist message; an item above it goes
    alone in one (a node refuses a message above its own limit, 64 MiB by default).
    ``wire_versions``: the protocol versions spoken (:mod:`dstltree.client.wire`;
    ``(1,)``: the previous release, no hello and no ping); with version 2, a ping every
    ``ping_interval`` s and a node silent for ``liveness_timeout`` s is lost. Raises
    ValueError for bad versions or timings (:func:`check_versions`,
    :func:`~dstltree.client.liveness.check_timing`)."""

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
        wire_versions: Sequence[int] = WIRE_VERSIONS,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        liveness_timeout: float = DEFAULT_LIVENESS_TIMEOUT,
    ) -> None:
        addresses = (address,) if isinstance(address, str) else tuple(address)
        self._pref = NodePreference(addresses, hold_down)
        self._heartbeat = heartbeat
        self.wire_versions = check_versions(wire_versions)
        check_timing(ping_interval, liveness_timeout)
        self._v2 = speaks_version_2(self.wire_versions)  # hello and pings
        self._timing = (ping_interval, liveness_timeout)
        self._probe: MonitoredDealer | None = None  # its probe of a more preferred node
        self._init_liveness()
        self.max_message_bytes = max_message_bytes
        self._security = security
        self.store = store
        self.ack_timeout = ack_timeout
        self._renewal = lease_renewal
        # the down mark of the only node, or of the current one (doubles per silent try)
        self._backoff = NodeBackoff(retry_after, max_retry_after, hold_down, liveness_timeout)
        self._lost_at: float | None = None  # a loss of the current link not acted on yet
        # ... and what it was: "safe" (a silence, or a connection never made: ZeroMQ
        # still holds what was sent, so the node answering again cancels it),
        # "disconnect" (what was sent may be gone) or "refused" (our wire versions)
        self._lost_kind = "safe"
        self._switch_after = float("-inf")  # no failover before (every node down)
        self._fallback = DirectUploader(store, upload_policy=upload_policy)
        self._ids = itertools.count(1)
        self._writers: set[str] = set()
        self._listeners: dict[str, Callable[[Note], None]] = {}  # note names subscribed
        self._lock = threading.Lock()  # writers, lifecycle flags, the pipe's descriptors
        # the socket, the current link and the items awaiting acks (never held while
        # a future is resolved or a fallback starts)
        self._io = threading.Lock()
        self._pending: dict[int, _AwaitingAck] = {}
        # what ZeroMQ would not queue yet (its high-water mark), in order: later sends
        # queue behind it; the I/O thread sends it as the socket drains
        self._outbox: deque[_Entry] = deque()
        self._link: MonitoredDealer | None = self._open(self._pref.address)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)  # a full pipe already wakes the thread
        # a wake-up byte is on its way and the I/O thread has not read the pipe since:
        # later wakes need none
        self._wake_pending = False
        self._closed = False  # close() called: no more use
        self._fds_open = True
        self._thread_done = False
        self._fds_to_thread = False  # close() gave up waiting: the thread closes the pipe
        self._stop = threading.Event()
        self._counts = dict.fromkeys(_COUNTS, 0)
        self._alive = self._liveness(time.monotonic())
        if self._v2:  # the first message on the link (sent with the first flush)
            self._outbox.append(WireHello(self.wire_versions))
        self._thread = threading.Thread(target=self._loop, name="dstl-node-client", daemon=True)
        self._thread.start()

    # -- SegmentUploader -----------------------------------------------------------------
    def register(self, log_id: str) -> None:
        """Announce writer ``log_id`` to the node. Raises DstlError once closed."""
        with self._lock:
            self._check_usable()
            self._writers.add(log_id)
        self._send_now([Register(log_id)])

    def unregister(self, log_id: str) -> None:
        """Withdraw writer ``log_id``. Raises DstlError once closed."""
        with self._lock:
            self._check_usable()
            self._writers.discard(log_id)
        self._send_now([Unregister(log_id)])

    def subscribe(self, name: str, on_note: Callable[[Note], None]) -> None:
        """Receive the notes addressed to ``name`` (and broadcasts) through the node:
        ``on_note`` runs on the I/O thread, so it must only hand the note on. The
        subscription is renewed with the writers' lease and follows a failover.
        Raises DstlError once closed, ValueError for a bad name."""
        hello = Note("", name, b"")
        with self._lock:
            self._check_usable()
            self._listeners[name] = on_note
        self._send_now([hello])

    def send_note(self, note: Note) -> None:
        """Send ``note`` to the node (best effort: a note is never resent). Raises
        DstlError once closed."""
        with self._lock:
            self._check_usable()
        self._send_now([note])

    def submit(self, item: PersistItem) -> SegmentFuture[SegmentRef | None]:
        """Send ``item`` to the node on the caller's thread (or write it to DFS while
        the node is marked down); the future resolves to its ref. Raises DstlError
        once closed."""
        with self._lock:
            self._check_usable()
        fut: SegmentFuture[SegmentRef | None] = SegmentFuture()
        if item.data is None:
            fut.set_result(None)
        elif self._backoff.down(time.monotonic()):
            # the node did not answer lately: straight to DFS until it does (or retry)
            self._fall_back(_AwaitingAck(item, fut, 0.0), "node marked down")
            return fut
        request = PersistRequest(next(self._ids), item)
        waiting = _AwaitingAck(item, fut, time.monotonic() + self.ack_timeout)
        with self._io:
            link = self._link
            # nothing awaits an ack: send now; else the I/O thread sends what queued up
            # meanwhile together, in as few messages as fit (a stream of segments)
            now = not self._pending
            if link is not None and item.data is not None:
                self._pending[request.id] = waiting
            wake = link is not None and self._put(link.sock, [request], now)
        if link is None and item.data is not None:  # the I/O thread stopped meanwhile
            self._fall_back(waiting, "uploader closed")
        if wake:
            self._wake()
        return fut

    def close(self) -> None:
        """Wait (bounded by the ack timeout) for pending items, then stop the I/O thread
        and close the wake-up pipe. Blocking; idempotent (a second call returns at once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + self.ack_timeout + 1.0
        while time.monotonic() < deadline and self._thread.is_alive() and self._pending:
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
            self._backoff.down_for,
            c["failovers"],
            c["resent"],
            c["silences"],
            c["refusals"],
            self._version,
            tuple(self._failover_log),
            c["reconnects"],
        )

    # -- liveness (the I/O thread, after __init__) ----------------------------------------
    def _init_liveness(self) -> None:
        self._version: int | None = None  # agreed with the current node
        self._connected = False  # the current link's handshake done, not lost since
        self._rehello = False  # the current link lost its connection: hello again when up
        self._ever_connected = False  # a handshake of the current link succeeded once
        self._probe_alive: PeerLiveness | None = None
        self._probe_connected = False
        self._probe_after = float("-inf")  # no probe before (after a refusal)
        self._failover_log: deque[tuple[float, str, float]] = deque(maxlen=FAILOVER_LOG_SIZE)
        self._link_since = time.time()  # when the current link opened (wall clock)

    def _liveness(self, now: float) -> PeerLiveness | None:
        """The heartbeat state of a link opened at ``now`` (None without version 2)."""
        return PeerLiveness(now, *self._timing) if self._v2 else None

    # -- pipe and lifecycle (callers hold no lock unless said) ----------------------------
    def _check_usable(self) -> None:
        """Raise DstlError if closed or the I/O thread is gone. Caller holds the lock."""
        if self._closed:
            raise DstlError(f"node uploader for {self.address} is closed")
        if self._thread_done:
            raise DstlError(f"node uploader for {self.address}: its I/O thread stopped")

    def _wake(self) -> None:
        """One byte into the wake-up pipe, unless one is on its way or the pipe is
        closed."""
        with self._lock:
            if self._fds_open and not self._wake_pending:
                self._wake_pending = True
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

    # -- the socket (callers hold self._io) -----------------------------------------------
    def _put(self, sock: zmq.Socket, entries: Sequence[_Entry], now: bool = True) -> bool:
        """Queue ``entries`` behind any still queued and, if ``now``, send what is
        queued (:meth:`_flush`). Returns whether the I/O thread must act: something stays
        queued, or replies wait on the socket (this use may have taken the descriptor's
        signal)."""
        self._outbox.extend(entries)
        if not now:
            return True
        self._flush(sock)
        return bool(self._outbox) or readable(sock)

    def _flush(self, sock: zmq.Socket) -> None:
        """Send the queued entries in order, consecutive requests together in Persist
        messages (:func:`persist_messages`), until ZeroMQ refuses one for a full queue
        (it and the rest stay queued). Requests whose item no longer awaits its ack
        (it fell back meanwhile) are dropped; another refusal is counted and its items
        time out and fall back."""
        box = self._outbox
        while box:
            if not isinstance(head := box[0], PersistRequest):
                if not self._send_message(sock, head):
                    return
                box.popleft()
                continue
            requests = []
            while box and isinstance(r := box[0], PersistRequest):
                box.popleft()
                if r.item.data is None or r.id in self._pending:
                    requests.append(r)
            messages = persist_messages(requests, self.max_message_bytes) if requests else []
            for k, msg in enumerate(messages):
                if not self._send_message(sock, msg):
                    box.extendleft(reversed([r for m in messages[k:] for r in m.requests]))
                    return

    def _send_message(self, sock: zmq.Socket, msg: Message) -> bool:
        """Send one message; False if ZeroMQ's queue is full (nothing sent)."""
        try:
            send_frames(sock, dump(msg), NOBLOCK, copy=False)
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            self._counts["send"] += 1
            log.debug("send to node failed (%s); pending items time out and fall back", e)
        return True

    def _send_now(self, messages: list[Message]) -> None:
        """Send control messages from the caller's thread (nothing once the link
        closed)."""
        with self._io:
            wake = self._link is not None and self._put(self._link.sock, messages)
        if wake:
            self._wake()

    # -- I/O thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        assert self._link is not None
        _watch(poller, self._link)
        next_renewal = time.monotonic() + self._renewal
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(self._poll_ms()))
                if self._wake_r in ready:
                    with self._lock:
                        self._wake_pending = False
                        os.read(self._wake_r, 4096)
                now = time.monotonic()  # replies first: they count before any silence
                self._receive(now)
                with self._io:
                    if self._outbox and self._link is not None:
                        self._flush(self._link.sock)
                self._watch_links(ready, poller, now)
                self._heartbeats(now)
                self._expire(now)
                if now >= next_renewal:
                    next_renewal = now + self._renewal
                    self._renew()
        finally:
            with self._io:
                link, self._link = self._link, None
                pending, self._pending = self._pending, {}
                self._outbox.clear()
            if link is not None:
                _unwatch(poller, link)
            self._close_probe(poller)
            for p in pending.values():
                self._fall_back(p, "uploader closed")
            self._thread_exit()

    def _open(self, address: str) -> MonitoredDealer:
        def configure(sock: zmq.Socket) -> None:
            configure_dealer(sock)
            configure_client(sock, self._security)

        # the I/O thread may switch the socket's CURVE server key (a key rotation) while
        # callers send on it under self._io
        return MonitoredDealer.open(address, configure, None, self._heartbeat, lock=self._io)

    def _writer_messages(self, kind: type[Register] | type[Unregister]) -> list[Message]:
        with self._lock:
            out: list[Message] = [kind(w) for w in self._writers]
            if kind is Register:  # note subscriptions are renewed with the writers
                out += [Note("", name, b"") for name in self._listeners]
            return out

    def _renew(self) -> None:
        """Announce every writer again (the node's lease on them), unless sends wait
        in the queue already (then the node is not taking messages; the next renewal
        goes)."""
        with self._io:
            link, wake = self._link, False
            if link is not None and not self._outbox:
                wake = self._put(link.sock, self._writer_messages(Register))
        if wake:
            self._wake()

    def _unregister_all(self, link: MonitoredDealer) -> None:
        """Withdraw the writers from a node still alive that we leave, so that it does
        not wait for them at its next checkpoint; the socket lingers briefly to send
        (what its full queue refuses is not sent). Caller holds self._io."""
        for msg in self._writer_messages(Unregister):
            self._send_message(link.sock, msg)
        link.sock.setsockopt(zmq.LINGER, _LEAVE_LINGER_MS)

    def _poll_ms(self) -> int:
        """The I/O thread's poll timeout: _IDLE_POLL_MS, or less until a ping or a
        silence is due."""
        due = [a.next_deadline() for a in (self._alive, self._probe_alive) if a is not None]
        if not due:
            return _IDLE_POLL_MS
        ms = int((min(due) - time.monotonic()) * 1000) + 1
        return max(0, min(_IDLE_POLL_MS, ms))

    def _receive(self, now: float) -> None:
        """Take every reply queued on the socket (checked with ``EVENTS``: cheaper than
        a NOBLOCK receive raising zmq.Again at the end of each drain; reading them all
        re-arms the descriptor), then act on them outside the lock. Any reply is a
        sign of the node's life."""
        replies = []
        with self._io:
            sock = self._link.sock if self._link is not None else None
            while sock is not None and readable(sock):
                try:
                    replies.append(recv_frames(sock, NOBLOCK))
                except zmq.Again:
                    break
        if replies and self._alive is not None:
            self._alive.heard(now)
        if replies:
            self._backoff.heard(now)
        for frames in replies:
            try:
                msg = load(frames, versions=self.wire_versions)
            except Exception as e:  # noqa: BLE001 - a bad reply must not stop the thread
                log.warning("bad reply from node: %s", e)
                continue
            if isinstance(msg, PersistAck):
                self._on_ack(msg, now)
            elif isinstance(msg, WireHello):
                self._on_hello(msg, now)
            elif isinstance(msg, Error):
                self._on_error(msg, now)
            elif isinstance(msg, Note):
                self._on_note(msg)

    def _on_note(self, note: Note) -> None:
        """A note from the tree: to the listener it names (every one for a broadcast)."""
        with self._lock:
            listeners = (
                list(self._listeners.values())
                if note.to == BROADCAST
                else [f]
                if (f := self._listeners.get(note.to)) is not None
                else []
            )
        for on_note in listeners:
            try:
                on_note(note)
            except Exception:  # noqa: BLE001 - a listener must not stop the I/O thread
                log.exception("note listener failed")

    def _on_hello(self, msg: WireHello, now: float) -> None:
        """The node's answer to our hello: the version it chose (one we speak, or the
        node is taken as refusing)."""
        version = msg.versions[0] if msg.node is not None and len(msg.versions) == 1 else None
        if version not in self.wire_versions:
            why = f"its hello answer {msg} names no version of {list(self.wire_versions)}"
            self._refused(why, now)
            return
        self._version = version
        log.debug("node %s (%s) speaks wire version %d", msg.node, self.address, version)

    def _on_error(self, msg: Error, now: float) -> None:
        """An error reply: a refusal of our versions (the node is down for us), a
        version-1 node not knowing hello or ping (alive, version 1), or a rejection."""
        if is_refusal(msg):
            self._refused(msg.message, now)
            return
        kind = unknown_type(msg)
        if kind in ("hello", "ping", "note"):  # "note": a node of before notes
            if kind == "hello":
                self._version = 1
                log.debug("node %s speaks wire version 1 only", self.address)
            return
        log.warning("node rejected a message: %s", msg.message)
        self._counts["errors"] += 1
        self._counts["replies"] += 1

    def _refused(self, why: str, now: float) -> None:
        """The current node refused our wire versions: counted, logged, taken as a lost
        connection (failover; with a single node, items go to DFS for a while). Once
        per refusal: the node's answers to what followed our hello repeat it."""
        if self._alive is not None and self._alive.state == "refused":
            return
        self._counts["refusals"] += 1
        log.warning("node %s refused this writer: %s", self.address, why)
        if self._alive is not None:
            self._alive.refuse(now, self._pref.hold_down)
        if self._lost_at is None:
            self._lost_at = now
        self._lost_kind = "refused"
        if len(self._pref.addresses) == 1:
            self._backoff.refused(now)

    def _on_ack(self, ack: PersistAck, now: float) -> None:
        """Resolve the acked items; an error entry falls back to the DFS, unless it is
        a refusal of our wire versions and another node is there to fail over to (the
        item stays pending: the failover sends it there)."""
        elsewhere = len(self._pref.addresses) > 1
        with self._io:
            acked = [
                (e, self._pending.pop(e.id, None))
                for e in ack.items
                if not (elsewhere and e.error is not None and e.error.startswith(REFUSAL))
            ]
        if any(p is not None and e.error is None and e.path is not None for e, p in acked):
            self._backoff.acked(now)  # the node answers again: once per reply
        for e, p in acked:
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
        # pending items are in send order, so their deadlines rise: stop at the first
        # one not due (O(late), not O(pending) per loop turn)
        with self._io:
            late = []
            for r, p in self._pending.items():
                if p.deadline > now:
                    break
                late.append(r)
            expired = [self._pending.pop(r) for r in late]
        # a node that stays silent is tried again less and less often (a dead node costs
        # its clients one ack timeout per try), once per try: client/backoff.py
        for p in expired:
            self._backoff.expired(p.deadline - self.ack_timeout, now)
        for p in expired:
            self._fall_back(p, f"no ack within {self.ack_timeout} s")

    # -- failover (the I/O thread) -------------------------------------------------------
    def _watch_links(self, ready: dict, poller: zmq.Poller, now: float) -> None:
        """Act on the monitors: a lost connection to the current node moves to the next
        node (its unacknowledged items sent again there), at once unless the last
        failover found every node down (then ALL_DOWN_SWITCH_S after it; a node that was
        only silent, or never connected, and answers meanwhile is kept: what it was
        sent is still on its way); the only node, disconnected, gets a new connection
        and what it had not acknowledged again (at most once per ALL_DOWN_SWITCH_S,
        keeping the items' ack deadlines); a probe of a more preferred node that stayed
        up for the hold-down brings the traffic back."""
        pref, link = self._pref, self._link
        assert link is not None
        if link.monitor in ready:
            self._link_events(link, link.changes(), now)
        safe = self._lost_kind == "safe"
        if safe and self._lost_at is not None and self._alive is not None and self._alive.alive:
            self._lost_at = None
        if self._lost_at is not None and now >= self._switch_after:
            lost_at, self._lost_at, kind = self._lost_at, None, self._lost_kind
            self._lost_kind = "safe"
            if pref.lost(lost_at) is not None:
                all_down = pref.all_down(now)
                if all_down:  # the next refusal waits a little
                    self._switch_after = now + ALL_DOWN_SWITCH_S
                self._counts["failovers"] += 1
                self._failover_log.append((time.time(), link.address, self._link_since))
                why = f"lost the connection to {link.address}"
                self._switch(poller, now, why, leave=False, keep_deadlines=all_down)
                return
            if kind == "disconnect":  # the only node: what it had may be gone, send again
                self._switch_after = now + ALL_DOWN_SWITCH_S
                self._counts["reconnects"] += 1
                why = f"lost the connection to {link.address}, the only node; connecting again"
                self._switch(poller, now, why, leave=False, keep_deadlines=True)
                return
        self._watch_probe(ready, poller, now)
        if pref.should_return(now) is not None:
            # the node we leave stops counting our writers
            self._switch(poller, now, f"it stayed up for {pref.hold_down:g} s", leave=True)
            return
        self._keep_probe(poller)

    def _link_events(self, link: MonitoredDealer, changes: list[bool], now: float) -> None:
        """The current link's monitor events (oldest first; True: a handshake, False:
        a loss): a loss is acted on (:meth:`_watch_links`); a new connection after a
        loss on the same link gets a hello first (with version 2)."""
        for up in changes:
            if not up:
                self._connected, self._rehello = False, self._v2
                if self._alive is not None:
                    self._alive.lost(now)
                if self._lost_at is None:
                    self._lost_at, self._lost_kind = now, "safe"
                if self._ever_connected and self._lost_kind == "safe":
                    self._lost_kind = "disconnect"
            elif not self._connected:
                self._connected = self._ever_connected = True
                if self._rehello:
                    self._rehello = False
                    with self._io:
                        self._put(link.sock, [WireHello(self.wire_versions)])

    def _watch_probe(self, ready: dict, poller: zmq.Poller, now: float) -> None:
        """The probe's monitor events and replies: without version 2 its handshakes
        and losses are all the preference sees; with it, a loss, a silence or a
        refusal is down and the first reply (to its pings) is up."""
        probe, pref, alive = self._probe, self._pref, self._probe_alive
        if probe is None:
            return
        if probe.monitor in ready:
            for up in probe.changes():
                self._probe_connected = up
                if alive is None:
                    pref.probe_seen(up, now)
                elif not up:
                    alive.lost(now)
                    pref.probe_seen(False, now)
        if alive is None:
            return
        for frames in _drain(probe.sock):
            try:
                msg = load(frames, versions=self.wire_versions)
            except Exception as e:  # noqa: BLE001 - a bad reply must not stop the thread
                log.debug("bad reply from probed node %s: %s", probe.address, e)
                continue
            if is_refusal(msg):
                self._counts["refusals"] += 1
                log.warning("node %s refused this writer: %s", probe.address, msg)
                pref.probe_seen(False, now)
                self._close_probe(poller)
                self._probe_after = now + pref.hold_down
                return
            if alive.heard(now):
                pref.probe_seen(True, now)

    def _keep_probe(self, poller: zmq.Poller) -> None:
        """A probe connection to the node to return to, while there is one (none for
        the hold-down after that node refused us)."""
        pref, probe = self._pref, self._probe
        target = pref.probe_target()
        if target is None and probe is not None:
            self._close_probe(poller)
        elif target is not None and probe is None and time.monotonic() >= self._probe_after:
            self._probe = probe = self._open(pref.addresses[target])
            self._probe_connected = False
            poller.register(probe.monitor, zmq.POLLIN)
            self._probe_alive = self._liveness(time.monotonic())
            if self._probe_alive is not None:  # its replies are read by this thread only
                poller.register(probe.sock, zmq.POLLIN)
                self._send_message(probe.sock, WireHello(self.wire_versions))

    def _close_probe(self, poller: zmq.Poller) -> None:
        if self._probe is not None:
            self._probe.close(poller)
        self._probe, self._probe_alive = None, None

    def _heartbeats(self, now: float) -> None:
        """Pings to the current node and the probe (once their connection is up), and
        their silences: the current node's is a lost connection, the probe's a down."""
        alive, link = self._alive, self._link
        if alive is not None and link is not None:
            if alive.retry_due(now):  # a refusal's hold-down passed: ask again
                with self._io:
                    self._put(link.sock, [WireHello(self.wire_versions)])
            seq = alive.ping(now)
            if seq is not None and self._connected:
                with self._io:
                    if not self._outbox:  # a full queue: the node takes nothing anyway
                        self._send_message(link.sock, Ping(seq))
            if alive.silent(now):
                self._counts["silences"] += 1
                log.info("node %s silent for %g s", link.address, alive.timeout)
                if self._lost_at is None:
                    self._lost_at, self._lost_kind = now, "safe"
        probe, palive = self._probe, self._probe_alive
        if probe is not None and palive is not None:
            seq = palive.ping(now)
            if seq is not None and self._probe_connected:
                self._send_message(probe.sock, Ping(seq))
            if palive.silent(now):
                self._pref.probe_seen(False, now)

    def _switch(
        self, poller: zmq.Poller, now: float, why: str, leave: bool, keep_deadlines: bool = False
    ) -> None:
        """Send to the node the preference chose from now on: a new connection, the
        writers registered, every unacknowledged item sent again (the old node's copy,
        if it wrote one, is never referenced: an orphan for the sweep). ``leave``: the
        old node is alive, withdraw the writers from it first. The items get a new ack
        deadline, unless ``keep_deadlines`` (every node is down: moving among them must
        not hold the items back from their fallback to the DFS forever)."""
        with self._io:
            old = self._link
            assert old is not None
            log.info("node %s -> %s: %s", old.address, self._pref.address, why)
            if leave:
                self._unregister_all(old)
            _unwatch(poller, old)
            if self._probe is not None and self._probe.address == self._pref.address:
                self._close_probe(poller)
            self._link = self._open(self._pref.address)
            self._alive, self._version, self._link_since = self._liveness(now), None, time.time()
            self._connected = self._rehello = self._ever_connected = False
            _watch(poller, self._link)
            deadline = now + self.ack_timeout
            requests = []
            for rid, p in self._pending.items():
                self._pending[rid] = _AwaitingAck(
                    p.item, p.future, p.deadline if keep_deadlines else deadline
                )
                requests.append(PersistRequest(rid, p.item))
            self._counts["resent"] += len(requests)
            # the new node: the writers, the items awaiting acks, then the markers not
            # sent yet (queued control messages were for the old one)
            markers = [
                e for e in self._outbox if isinstance(e, PersistRequest) and e.item.data is None
            ]
            self._outbox.clear()
            hello: list[_Entry] = [WireHello(self.wire_versions)] if self._v2 else []
            entries = [*hello, *self._writer_messages(Register), *requests, *markers]
            self._put(self._link.sock, entries)
        self._wake()  # replies may wait on the new socket before its descriptor is read

    def _fall_back(self, p: _AwaitingAck, why: str) -> None:
        """Write the segment straight to DFS; the future follows that upload. Called
        without self._io."""
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


def _watch(poller: zmq.Poller, link: MonitoredDealer) -> None:
    """Poll ``link``'s socket through its descriptor (no ZeroMQ call on the socket
    itself, which callers use under the lock meanwhile) and its monitor."""
    poller.register(int(link.sock.getsockopt(zmq.FD)), zmq.POLLIN)
    poller.register(link.monitor, zmq.POLLIN)


def _drain(sock: zmq.Socket) -> list[list[zmq.Frame]]:
    """Every message waiting on ``sock`` (a socket only the calling thread uses)."""
    out = []
    while readable(sock):
        try:
            out.append(recv_frames(sock, NOBLOCK))
        except zmq.Again:
            break
    return out


def _unwatch(poller: zmq.Poller, link: MonitoredDealer) -> None:
    """Stop polling ``link`` and close it."""
    with contextlib.suppress(KeyError, zmq.ZMQError):
        poller.unregister(int(link.sock.getsockopt(zmq.FD)))
    link.close(poller)


def _chain(src: SegmentFuture[SegmentRef | None], dst: SegmentFuture[SegmentRef | None]) -> None:
    if dst.done():
        return
    if (e := src.exception()) is not None:
        dst.set_exception(e)
    else:
        dst.set_result(src.result())
