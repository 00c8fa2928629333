"""The node process shell: ZeroMQ sockets and upload threads around :class:`NodeCore`.

ROUTER for clients and children, DEALER to the parent. Segment frames are received with
``copy=False`` and passed on (to the parent or into the object) without re-encoding.
Blocking: :meth:`Node.serve` runs the loop until ``stop()``.

Hardening: every receiving socket has ``MAXMSGSIZE`` (ZeroMQ drops a connection that
sends a larger frame before buffering it) and explicit high-water marks (``hwm``
messages per peer); the ROUTER has ``ROUTER_MANDATORY``, so a reply to a gone peer or
a full queue fails loudly: it is counted, and a failed plan is resent (ReplyFailed).
While the core's backlog is full (``NodeCore.accepting``) the front is not read, so
ZeroMQ's high-water marks push back on the senders.

Threads: the loop owns the core, under a lock; a write thread that finishes an object
takes the lock, feeds the outcome to the core and sends the acks below itself, so an
ack costs no hand-off back to the loop. On a fast store (the node's writes took
``_LOOP_WRITE_FAST_S`` or less lately; a write thread writes the first) the loop
writes a small object (``_LOOP_WRITE_MAX_BYTES``) itself when no other write runs
(after its turn, outside the lock: no hand-off to a write thread either); should that
write take over ``_TAKEOVER_S`` seconds, a
:class:`~dstltree.aggregator.deputy.LoopDeputy` thread serves the loop's turns until it
returns, so a hanging store never stops the node (and the loop writes nothing itself
for ``_LOOP_WRITE_PAUSE_S`` seconds afterwards).
The ROUTER is shared under the lock (write threads send acks on it), and the loop
waits on its descriptor (``zmq.FD``, edge-triggered) instead of inside ZeroMQ:
whoever used the socket checks ``EVENTS`` and wakes the loop when a message waits.
Sends upstream decided on a write thread wait for the loop (it polls those DEALERs as
sockets).

Liveness upstream (client/liveness.py): with wire version 2 (``config.wire_versions``)
every DEALER to an upstream node sends a ``hello`` first on each connection and a
``ping`` every ``config.ping_interval`` seconds once connected; any message from that
node is a sign of life. ``config.liveness_timeout`` seconds without one is reported to
the core as ``UpstreamLost`` (as a disconnect is: its items go on along their new route,
a parent is re-homed from); the first message afterwards as ``UpstreamUp`` (the core
then holds it down for ``parent_retry_after``). With liveness on, a completed handshake
alone is not ``UpstreamUp``: a node whose loop is stuck still completes handshakes. A
refusal of this node's wire versions is a loss too, and the hello is sent again after
``parent_retry_after``. Pings from below are answered by the core, i.e. by the loop (or
by the :class:`~dstltree.aggregator.deputy.LoopDeputy` serving its turns).

At stop the batch is written here, running writes get ``shutdown_timeout`` seconds to
finish and their acks go out before the ROUTER closes with a bounded linger.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import queue
import threading
import time
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import zmq

from dstltree.aggregator.core import NodeConfig, NodeCore, NodeStatistics
from dstltree.aggregator.deputy import LoopDeputy
from dstltree.aggregator.events import (
    Event,
    Instruction,
    MalformedFromBelow,
    MessageFromBelow,
    MessageFromUpstream,
    ObjectFailed,
    ObjectWritten,
    ReplyBelow,
    ReplyFailed,
    SendUpstream,
    ShuttingDown,
    TimePassed,
    UpstreamLost,
    UpstreamUp,
    WriteObject,
)
from dstltree.aggregator.object_writer import ObjectWriter
from dstltree.client.direct import Written
from dstltree.client.errors import WireError
from dstltree.client.frames import NOBLOCK, recv_frames, send_frames
from dstltree.client.links import MonitoredDealer, readable
from dstltree.client.liveness import PeerLiveness
from dstltree.client.objectformat import FORMAT_VERSION
from dstltree.client.wire import (
    Message,
    Ping,
    Pong,
    WireHello,
    dump,
    is_refusal,
    load,
    speaks_version_2,
    unknown_type,
)
from dstltree.security.curve import Curve, configure_client, configure_server
from dstltree.storage.hedging import ReusableThreads, UploadPolicy
from dstltree.storage.store import ObjectStore

if TYPE_CHECKING:
    from dstltree.aggregator.metrics import NodeMetrics

log = logging.getLogger("dstltree.node")
_MAX_POLL_MS = 100
_METRICS_INTERVAL = 0.5  # seconds between metrics updates from the node's counters
_CLOSE_LINGER_MS = 1000  # the ROUTER's linger at close: final acks get this long to go out
_BURST = 100  # messages from below handled at once (NodeCore.handle_many)
_HEADER_SLACK = 1 << 20  # bytes a header frame may take beyond max_message_bytes
_WRITE_OUTCOMES = (ObjectWritten, ObjectFailed)  # built once, not a union per result
_TAKEOVER_S = 0.01  # seconds a write on the loop may last before the deputy serves turns
_LOOP_WRITE_PAUSE_S = 1.0  # seconds without writes on the loop after a takeover
# the largest object (segment bytes) the loop writes itself: a larger one takes long
# enough that a hand-off costs little, and the loop reads the front meanwhile
_LOOP_WRITE_MAX_BYTES = 256 * 1024
# seconds the node's writes took lately (a moving average) at most for the loop to write
# itself: a local disk's fsync, not an object store's request
_LOOP_WRITE_FAST_S = 0.002
_SILENCE_LOG_SIZE = 256  # upstream silences remembered (wall-clock time, address)


def _configure_router(sock: zmq.Socket, max_message_bytes: int, hwm: int) -> None:
    """The front ROUTER's limits: frames above ``max_message_bytes`` (plus header
    slack) drop the connection, ``hwm`` messages queued per peer each way, failed
    replies raise (EHOSTUNREACH, EAGAIN) instead of vanishing."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes + _HEADER_SLACK)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)


def _configure_dealer(sock: zmq.Socket, max_message_bytes: int, hwm: int) -> None:
    """A DEALER to an upstream node: the same frame limit and high-water marks."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes + _HEADER_SLACK)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.SNDHWM, hwm)


class Node:
    """One aggregator node. ``bind`` is a ZeroMQ endpoint; ``tcp://HOST:0`` picks a free
    port (see :attr:`address`). The parent's endpoint is ``config.parent_address``.
    ``metrics``: updated from the loop and the uploads; the node closes it (stops its
    HTTP server) when it stops serving. Objects are written by :attr:`writer`, this
    node's own :class:`ObjectWriter` (hedged per ``upload_policy``), at most
    ``upload_threads`` at once, off the event loop on reused threads (a write's first
    attempt runs on its thread; its slot is freed as soon as the upload is decided, so
    an attempt that hangs after a hedge won holds a thread, never a slot).
    ``advertise``: the endpoint other nodes connect to (:attr:`address`), needed
    when ``bind`` is a wildcard such as ``tcp://0.0.0.0:7700``; default: the bound
    endpoint. ``hwm``: the high-water mark (messages per peer and direction) of every
    socket; ``shutdown_timeout``: seconds
    :meth:`serve` waits at stop for running writes and upstream acks. ``security``:
    CURVE for the ROUTER (accepting node and writer keys) and the DEALERs to other nodes
    (:meth:`Curve.for_node`); None = plaintext (tests; the launchers default to CURVE).
    ``heartbeat``: seconds between ZeroMQ heartbeats on the DEALERs to other nodes; a
    connection silent for three of them, or closed, is reported to the core at once
    (``UpstreamLost``: its unacknowledged items go on along their new route); with wire
    version 2 the loop pings them too (the module docstring, Liveness upstream).
    ``loop_writes``: on a fast store (the node's writes took ``loop_write_fast_s``
    seconds or less on a moving average), the loop writes a small object itself when
    no other write runs (the module docstring: a deputy thread serves the loop if that
    write hangs); False: every object on a write thread. ``object_format``: the object
    format it writes (client/objectformat.py)."""

    def __init__(
        self,
        config: NodeConfig,
        store: ObjectStore,
        bind: str = "tcp://127.0.0.1:0",
        max_message_bytes: int = 64 * 1024 * 1024,
        upload_threads: int = 4,
        upload_policy: UploadPolicy | None = None,
        metrics: NodeMetrics | None = None,
        advertise: str | None = None,
        hwm: int = 1000,
        shutdown_timeout: float = 5.0,
        security: Curve | None = None,
        heartbeat: float = 0.1,
        loop_writes: bool = True,
        loop_write_fast_s: float = _LOOP_WRITE_FAST_S,
        object_format: int = FORMAT_VERSION,
    ) -> None:
        self.store = store
        self.heartbeat = heartbeat
        self._security = security
        self.max_message_bytes = max_message_bytes
        self.hwm = hwm
        self.shutdown_timeout = shutdown_timeout
        self.writer = ObjectWriter(store, upload_policy, object_format, config.node_id)
        self.upload_policy = self.writer.policy
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._front = self._ctx.socket(zmq.ROUTER)
        _configure_router(self._front, max_message_bytes, hwm)
        configure_server(self._front, security, "node")
        self._front.bind(bind[:-2] + ":*" if bind.endswith(":0") else bind)
        # what other nodes connect to (sent down in plans): the bound endpoint, unless a
        # bind on every interface (tcp://0.0.0.0:port) is advertised under another name
        self.address: str = advertise or self._front.getsockopt_string(zmq.LAST_ENDPOINT)
        # a Persist passed on stays well under the limit the parent applies (its own)
        forward = min(config.max_forward_bytes, max_message_bytes // 2)
        self.core = NodeCore(replace(config, address=self.address, max_forward_bytes=forward))
        self._poller = zmq.Poller()
        # the loop waits on the ROUTER's descriptor (zmq.FD, edge-triggered), never
        # inside ZeroMQ on the socket, so that write threads may send acks on it (under
        # the lock); whoever uses the socket checks EVENTS afterwards (_handle_written)
        self._front_fd = int(self._front.getsockopt(zmq.FD))
        self._poller.register(self._front_fd, zmq.POLLIN)
        # objects being written (at most upload_threads) and those waiting for a slot;
        # a slot is freed when the upload is decided, even if an attempt still hangs
        self._upload_threads = max(1, upload_threads)
        self._writes_running = 0
        self._writes_waiting: deque[tuple[int, tuple]] = deque()
        name = f"node-{config.node_id}-write"  # one for good, more while writes overlap
        self._write_threads = ReusableThreads(name, resident=1)
        self._closing = False
        self._results: queue.SimpleQueue[Event] = queue.SimpleQueue()
        # while serving, a write thread hands its outcome to the core itself and sends
        # the acks below; what must go upstream waits here for the loop
        self._inline = False
        self._deferred: deque[Instruction] = deque()
        self._sleep_until = 0.0  # the latest end of the loop's current poll
        self._closed = False  # the wake pipe is closed: write threads must not use it
        # what the core raised on a write thread: the loop raises it (fail fast)
        self._failure: Exception | None = None
        self._wake_r, self._wake_w = os.pipe()
        self._stop = threading.Event()
        # held by the loop while it changes the core or its counts, so that a reader of
        # statistics() computes them from a consistent state (no snapshot per turn)
        self._lock = threading.RLock()
        self.metrics = metrics
        self._metrics_due = 0.0
        self._shell_counts = {
            "undeliverable_upstream": 0,
            "malformed_upstream": 0,
            "backpressure_pauses": 0,
            "loop_writes": 0,
        }
        self._paused_since: float | None = None
        self._paused_s = 0.0
        self._front_polled = True
        self._init_loop_writes(loop_writes, loop_write_fast_s)
        self._init_upstream()

    def _init_upstream(self) -> None:
        """The links upstream (opened on first use) and their heartbeat state (the
        module docstring, Liveness upstream)."""
        self._upstream: dict[str, MonitoredDealer] = {}
        cfg = self.core.config
        self._wire = cfg.wire_versions
        self._v2 = speaks_version_2(cfg.wire_versions)
        self._alive: dict[str, PeerLiveness] = {}  # per upstream address, with version 2
        self._connected: dict[str, bool] = {}  # handshake done, not lost since
        self._silences: deque[tuple[float, str, float]] = deque(maxlen=_SILENCE_LOG_SIZE)
        self._opened: dict[str, float] = {}  # upstream address -> wall-clock time opened
        self._shell_counts["upstream_silences"] = 0
        self._shell_counts["upstream_refusals"] = 0

    def _init_loop_writes(self, on: bool, fast_s: float) -> None:
        """The state of writes on the loop (the module docstring), on if ``on``."""
        self._loop_writes_on = on
        self._loop_write_fast_s = fast_s
        self._loop_writes: list[tuple[int, tuple]] = []  # kept for after the turn
        self._loop_writes_from = 0.0  # monotonic time from which they may start again
        # moving average of the seconds a write took (any thread); None before the
        # first: the loop writes nothing itself until writes have proved fast
        self._write_s: float | None = None
        self._loop_thread = 0  # the thread id of serve()'s loop
        self._collecting = False  # the loop is in its turn: a write may wait for its end
        self._deputy = LoopDeputy(
            f"node-{self.core.config.node_id}-deputy",
            lambda: self._step(front=not self._stop.is_set()),
            self._wake_loop,
            _TAKEOVER_S,
        )

    # -- public --------------------------------------------------------------------------
    def serve(self) -> None:
        """Run the event loop until :meth:`stop` (blocking). Raises what the core raised,
        on the loop or on a write thread (the node stops; a supervisor restarts it)."""
        self._poller.register(self._wake_r, zmq.POLLIN)
        for address in self.core.configured_parents():  # every way up, connected now
            self._socket_to(address)
        self._deputy.start()
        with self._lock:
            self._inline = True
        self._loop_thread = threading.get_ident()
        try:
            while not self._stop.is_set():
                self._turn(front=True)
            self._finish()
        finally:
            self._deputy.close()
            self._close()

    def _turn(self, front: bool) -> None:
        """The loop's turn (:meth:`_step`, under the deputy's turn lock), then the
        writes it kept for itself, each one busy for the deputy."""
        with self._deputy.turn:
            if self._deputy.failure is not None:
                raise self._deputy.failure
            self._collecting = True
            try:
                self._step(front)
            finally:
                self._collecting = False
            with self._lock:
                todo, self._loop_writes = self._loop_writes, []
        for oid, items in todo:
            takeovers = self._deputy.takeovers
            with self._deputy.busy():
                self._write(oid, items)
            if self._deputy.takeovers != takeovers:
                self._loop_writes_from = time.monotonic() + _LOOP_WRITE_PAUSE_S

    def _step(self, front: bool) -> None:
        """One loop turn: poll, read (the front only if ``front`` and the core accepts
        more), feed results and time to the core."""
        with self._lock:
            if front:
                self._back_pressure(self.core.accepting())
            elif self._front_polled:  # stopping: the front is not read any more
                self._poller.unregister(self._front_fd)
                self._front_polled = False
            timeout = self._poll_ms()
        ready = dict(self._poller.poll(timeout))
        with self._lock:
            now = time.monotonic()  # under the lock: write threads feed the core too
            self._react(ready, now)
        if self.metrics is not None and now >= self._metrics_due:
            self._metrics_due = now + _METRICS_INTERVAL
            self._update_metrics()

    def _react(self, ready: dict[Any, int], now: float) -> None:
        """Handle what ``ready`` (the poll's answer) says, then time (under the lock)."""
        if self._failure is not None:
            raise self._failure
        handled = False  # the core's time-driven rules ran after an event of this turn
        if self._front_polled and readable(self._front):  # edge-triggered: always look
            handled = self._drain_front(now)
        for address, link in list(self._upstream.items()):
            if link.sock in ready:
                handled = self._drain_up(address, link.sock, now) or handled
            if link.monitor in ready:
                handled = self._link_events(address, link, now) or handled
        if self._alive:
            handled = self._heartbeats(now) or handled
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)
        if self._deferred:
            deferred, self._deferred = list(self._deferred), deque()
            self._run(deferred)
            handled = True
        handled = self._drain_results() or handled
        if not handled:
            self._run(self.core.handle(TimePassed(time.monotonic())))

    def _back_pressure(self, reading: bool) -> None:
        """Poll the front only while ``reading``; count the pauses and their time."""
        now = time.monotonic()
        if reading and self._paused_since is not None:
            self._paused_s += now - self._paused_since
            self._paused_since = None
            self._poller.register(self._front_fd, zmq.POLLIN)
            self._front_polled = True
        elif not reading and self._paused_since is None:
            self._paused_since = now
            self._shell_counts["backpressure_pauses"] += 1
            self._poller.unregister(self._front_fd)
            self._front_polled = False

    def _statistics(self, now: float) -> NodeStatistics:
        paused = self._paused_s
        if self._paused_since is not None:
            paused += now - self._paused_since
        return self.core.statistics(
            now,
            backpressure_seconds=paused,
            loop_takeovers=self._deputy.takeovers,
            **self._shell_counts,
        )

    def _finish(self) -> None:
        """At stop: the batch is written here; writes and upstream acks get
        ``shutdown_timeout`` seconds, their acks are sent (the front is not read)."""
        self._run(self.core.handle(ShuttingDown(time.monotonic())))
        deadline = time.monotonic() + self.shutdown_timeout
        while not self.core.idle() and time.monotonic() < deadline:
            self._turn(front=False)
        if not self.core.idle():
            log.warning("node stopping with writes or upstream acks still pending")

    def start(self) -> threading.Thread:
        """Serve in a daemon thread (tests, ``dstl up``)."""
        t = threading.Thread(
            target=self.serve, name=f"node-{self.core.config.node_id}", daemon=True
        )
        t.start()
        return t

    def stop(self) -> None:
        """Ask the loop to end (idempotent; returns at once)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake_loop()

    def _wake_loop(self) -> None:
        """End the loop's current poll (a byte on the wake pipe), unless closed."""
        if not self._closed:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    def silence_log(self) -> list[tuple[float, str, float]]:
        """(wall-clock time, address, wall-clock time its link opened) of the latest
        upstream nodes found silent or refusing (at most 256), oldest first: when this
        node left them."""
        with self._lock:
            return list(self._silences)

    def statistics(self) -> NodeStatistics:
        """The node's counters now (computed on the caller's thread, between two turns
        of the loop: every reply the loop sent is counted)."""
        with self._lock:
            return self._statistics(time.monotonic())

    def _update_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.update(self.statistics(), self.writer.upload_stats())

    # -- loop parts ----------------------------------------------------------------------
    def _poll_ms(self) -> int:
        """Milliseconds the next poll may wait (under the lock): none while the front
        has a message (its descriptor only signals new ones), else until the core's
        next deadline, at most ``_MAX_POLL_MS``; recorded in :attr:`_sleep_until`."""
        now = time.monotonic()
        if self._deferred or (self._front_polled and readable(self._front)):
            self._sleep_until = now
            return 0
        deadline = self.core.next_deadline()
        if self._alive:
            due = min(a.next_deadline() for a in self._alive.values())
            deadline = due if deadline is None else min(deadline, due)
        ms = _MAX_POLL_MS
        if deadline is not None:
            ms = max(0, min(_MAX_POLL_MS, int((deadline - now) * 1000) + 1))
        self._sleep_until = now + ms / 1000
        return ms

    def _drain_front(self, now: float) -> bool:
        """Read up to 1000 messages in bursts of ``_BURST``, each burst handled at once
        (:meth:`NodeCore.handle_many`); stop early while the core accepts no more.
        The caller saw a message waiting (:func:`readable`). True if a burst was
        handled (the core's time-driven rules ran)."""
        front, handled, waiting = self._front, False, True
        for _ in range(1000 // _BURST):
            if not self.core.accepting():
                return handled
            events: list[Event] = []
            while len(events) < _BURST and (waiting or readable(front)):
                waiting = False
                events.append(self._event_below(now, recv_frames(front)))
            if events:
                self._run(self.core.handle_many(events))
                handled = True
            if len(events) < _BURST:
                return handled
        return handled

    def _event_below(self, now: float, frames: list[zmq.Frame]) -> Event:
        identity = frames[0].bytes
        try:
            msg = load(frames[1:], self.max_message_bytes, self._wire)
            return MessageFromBelow(now, identity, msg)
        except WireError as e:
            log.debug("rejected message: %s", e)
            return MalformedFromBelow(now, identity, str(e))

    def _drain_up(self, address: str, sock: zmq.Socket, now: float) -> bool:
        """Handle up to 1000 messages from ``address``; True if any reached the core.
        Each one is a sign of the node's life (with version 2); heartbeat and version
        messages stay in the shell."""
        handled = False
        alive = self._alive.get(address)
        for _ in range(1000):
            if not readable(sock):
                return handled
            frames = recv_frames(sock)
            if alive is not None and alive.heard(now):
                self._run(self.core.handle(UpstreamUp(now, address)))
                handled = True
            try:
                msg = load(frames, versions=self._wire)
            except WireError as e:
                log.debug("bad message from %s: %s", address, e)
                self._shell_counts["malformed_upstream"] += 1
                continue
            if alive is not None and self._liveness_message(address, alive, msg, now):
                handled = True
                continue
            self._run(self.core.handle(MessageFromUpstream(now, address, msg)))
            handled = True
        return handled

    def _liveness_message(
        self, address: str, alive: PeerLiveness, msg: Message, now: float
    ) -> bool:
        """Handle a heartbeat or version message from upstream here; False for what
        goes to the core. A refusal (or a hello answer naming a version this node does
        not speak) is a lost node, asked again after ``parent_retry_after``."""
        if isinstance(msg, Pong):
            return True
        if isinstance(msg, WireHello) and msg.node is not None and msg.versions[0] in self._wire:
            return True
        if unknown_type(msg) in ("hello", "ping"):  # a version-1 node: alive all the same
            return True
        if not is_refusal(msg) and not isinstance(msg, WireHello):
            return False
        if alive.state != "refused":
            self._shell_counts["upstream_refusals"] += 1
            log.warning("upstream node %s refused this node: %s", address, msg)
            self._silences.append((time.time(), address, self._opened[address]))
            alive.refuse(now, self.core.config.parent_retry_after)
            self._run(self.core.handle(UpstreamLost(now, address)))
        return True

    def _link_events(self, address: str, link: MonitoredDealer, now: float) -> bool:
        """The monitor's events of the link to ``address``: a loss goes to the core at
        once; a completed handshake too without version 2, while with it the first
        message afterwards does (:meth:`_drain_up`) and the new connection gets a
        hello first. True if the core got an event."""
        handled = False
        alive = self._alive.get(address)
        for up in link.changes():
            log.info("connection to %s %s", address, "up" if up else "lost")
            if alive is not None:
                was = self._connected.get(address, False)
                self._connected[address] = up
                if not up:
                    alive.lost(now)
                elif not was and alive.state != "unknown":  # a reconnection
                    self._send(link.sock, dump(WireHello(self._wire)))
                if up:
                    continue
            kind = UpstreamUp if up else UpstreamLost
            self._run(self.core.handle(kind(now, address)))
            handled = True
        return handled

    def _heartbeats(self, now: float) -> bool:
        """Pings upstream (on connected links) and silences: a node silent for the
        liveness timeout is lost (UpstreamLost). True if the core got an event."""
        handled = False
        for address, alive in list(self._alive.items()):  # a loss may open a link
            link = self._upstream[address]
            if alive.retry_due(now):
                self._send(link.sock, dump(WireHello(self._wire)))
            seq = alive.ping(now)
            if seq is not None and self._connected.get(address, False):
                self._send(link.sock, dump(Ping(seq)))
            if alive.silent(now):
                self._shell_counts["upstream_silences"] += 1
                log.info("upstream node %s silent for %g s", address, alive.timeout)
                self._silences.append((time.time(), address, self._opened[address]))
                self._run(self.core.handle(UpstreamLost(now, address)))
                handled = True
        return handled

    def _socket_to(self, address: str) -> zmq.Socket:
        """The DEALER to an upstream node, opened on first use (one per address)."""
        link = self._upstream.get(address)
        if link is None:

            def configure(sock: zmq.Socket) -> None:
                _configure_dealer(sock, self.max_message_bytes, self.hwm)
                configure_client(sock, self._security)

            link = MonitoredDealer.open(address, configure, self._poller, self.heartbeat, self._ctx)
            self._upstream[address] = link
            if self._v2:  # the first message on the link; pings once it is connected
                self._send(link.sock, dump(WireHello(self._wire)))
                cfg = self.core.config
                self._opened[address] = time.time()
                self._alive[address] = PeerLiveness(
                    time.monotonic(), cfg.ping_interval, cfg.liveness_timeout
                )
        return link.sock

    def _drain_results(self) -> bool:
        """Feed finished writes to the core; True if there were any."""
        handled = False
        while True:
            try:
                event = self._results.get_nowait()
            except queue.Empty:
                return handled
            if isinstance(event, _WRITE_OUTCOMES):
                self._writes_running -= 1
            self._run(self.core.handle(event))
            self._start_writes()
            handled = True

    def _run(self, instructions: list[Instruction], on_loop: bool = True) -> None:
        """Execute ``instructions`` in order; a reply that cannot be delivered goes back
        to the core (ReplyFailed) and what it answers is executed after them. Off the
        loop (``on_loop`` False: a write thread, under the lock) sends upstream wait in
        :attr:`_deferred` for the loop, which owns those sockets."""
        todo = deque(instructions)
        while todo:
            match instruction := todo.popleft():
                case ReplyBelow(identity, msg):
                    if not self._send(self._front, [identity, *dump(msg)], copy=True):
                        todo.extend(self.core.handle(ReplyFailed(time.monotonic(), identity, msg)))
                case SendUpstream(address, msg) if on_loop:
                    if not self._send(self._socket_to(address), dump(msg)):
                        self._shell_counts["undeliverable_upstream"] += 1
                case SendUpstream():
                    self._deferred.append(instruction)
                case WriteObject(oid, items):
                    self._writes_waiting.append((oid, items))
                    self._start_writes()

    def _start_writes(self) -> None:
        """Start waiting writes while fewer than ``upload_threads`` are undecided
        (none once the node is closing: their origins time out and write them)."""
        if self._closing and self._writes_waiting:
            log.warning("node stopping; %d objects not written", len(self._writes_waiting))
            self._writes_waiting.clear()
        while self._writes_waiting and self._writes_running < self._upload_threads:
            oid, items = self._writes_waiting.popleft()
            self._writes_running += 1
            if self._writes_running == 1 and self._on_loop_turn(items):
                self._loop_writes.append((oid, items))
                self._shell_counts["loop_writes"] += 1
            else:
                self._write_threads.submit(functools.partial(self._write, oid, items))

    def _on_loop_turn(self, items: tuple) -> bool:
        """Whether the caller is the loop in its turn and may keep the write of
        ``items`` for after it: writes on the loop are on, writes were fast lately and
        none hung on the loop, the object is small (``_LOOP_WRITE_MAX_BYTES``), not
        closing."""
        return (
            self._collecting
            and self._loop_writes_on
            and threading.get_ident() == self._loop_thread
            and not self._closing
            and self._write_s is not None
            and self._write_s <= self._loop_write_fast_s
            and time.monotonic() >= self._loop_writes_from
            and sum(i.size for i in items) <= _LOOP_WRITE_MAX_BYTES
        )

    def _send(self, sock: zmq.Socket, frames: list[Any], copy: bool = False) -> bool:
        """Send without blocking; False (logged at debug) if ZeroMQ refused: a full
        queue or, on the ROUTER, a peer that is gone. Upstream, the items time out
        and are written here; below, the core counts it and resends plans."""
        try:
            send_frames(sock, frames, NOBLOCK, copy)
        except zmq.ZMQError as e:
            log.debug("send failed: %s", e)
            return False
        return True

    def _write(self, oid: int, items: tuple) -> None:
        """Upload the object ``oid`` (on a write thread, its first attempt here too);
        its outcome reaches the loop as soon as any attempt wins or the upload fails,
        from whichever thread decides it (:meth:`ObjectWriter.start`)."""
        t0 = time.monotonic()
        told: list[bool] = []

        def done(outcome: Written | BaseException) -> None:
            told.append(True)
            self._written(oid, items, t0, outcome)

        try:
            self.writer.start(items, done)
        except Exception as e:  # noqa: BLE001 - reported to the origins as an error ack
            if not told:
                done(e)

    def _written(self, oid: int, items: tuple, t0: float, outcome: Written | BaseException) -> None:
        """Hand the outcome of object ``oid`` to the core (on this thread while the node
        serves, else through the loop) and the metrics."""
        failed = isinstance(outcome, BaseException)
        if failed:
            log.warning("object write failed: %s", outcome)
        if self.metrics is not None:
            size = sum(i.size for i in items)
            self.metrics.observe_upload(size, len(items), time.monotonic() - t0, not failed)
        with self._lock:
            now = time.monotonic()  # under the lock: the core sees time in order
            took, avg = now - t0, self._write_s
            self._write_s = took if avg is None else avg + 0.2 * (took - avg)
            if isinstance(outcome, BaseException):
                event: Event = ObjectFailed(now, oid, str(outcome))
            else:
                event = ObjectWritten(now, oid, outcome[0], tuple(outcome[1]))
            if self._inline:
                # the loop's own write: its next turn looks at everything a wake-up
                # would be for (front, deferred sends, deadlines), unless the deputy serves
                on_loop = threading.get_ident() == self._loop_thread and not self._deputy.serving
                wake = self._handle_written(event, look=not on_loop)
            else:  # not serving (yet, or any more): the loop takes it, if it runs
                self._results.put(event)
                wake = True
            if wake:
                self._wake_loop()

    def _handle_written(self, event: Event, look: bool = True) -> bool:
        """On a write thread, under the lock: feed the outcome to the core and send its
        acks below at once (no hand-off to the loop on the way to the ack). True if the
        loop must look now: sends upstream deferred to it, a message waiting on the
        front (this thread's sends may have taken the descriptor's signal), the front to
        read again, an earlier deadline than its poll's, a stop under way, or a failure
        of the core, which the loop raises (:meth:`serve` then raises it). ``look``
        False (the loop's own write, its next turn looks at all of these): False."""
        self._writes_running -= 1
        try:
            self._run(self.core.handle(event), on_loop=False)
        except Exception as e:  # noqa: BLE001 - raised again by the loop
            log.error("the core failed on a write's outcome: %s", e)
            self._failure, self._inline = e, False
            return True
        self._start_writes()
        if not look:
            return False
        if self._deferred or self._stop.is_set():
            return True
        if self._front_polled:
            if readable(self._front):
                return True
        elif self.core.accepting():
            return True
        deadline = self.core.next_deadline()
        return deadline is not None and deadline < self._sleep_until

    def _close(self) -> None:
        with self._lock:
            self._inline = False  # write threads ending from now on leave the sockets alone
            self._closed = True
        self._closing = True
        self._start_writes()  # drops the waiting ones
        with self._lock:
            self._drain_results()
        if self.metrics is not None:
            self._update_metrics()
            self.metrics.close()
        self._front.close(_CLOSE_LINGER_MS)
        for link in self._upstream.values():
            link.close(self._poller)
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.store.close()  # its object files created ahead and never used
