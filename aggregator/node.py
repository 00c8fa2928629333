"""The node process shell: ZeroMQ sockets and upload threads around :class:`NodeCore`.

ROUTER for clients and children, DEALER to the parent. Segment frames are received with
``copy=False`` and passed on (to the parent or into the object) without re-encoding.
Blocking: :meth:`Node.serve` runs the loop until ``stop()``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import zmq

from dstltree.aggregator.core import NodeConfig, NodeCore, NodeStatistics
from dstltree.aggregator.events import (
    Event,
    Instruction,
    MalformedFromBelow,
    MessageFromBelow,
    MessageFromUpstream,
    ObjectFailed,
    ObjectWritten,
    ReplyBelow,
    SendUpstream,
    TimePassed,
    WriteObject,
)
from dstltree.aggregator.object_writer import ObjectWriter
from dstltree.client.errors import WireError
from dstltree.client.wire import dump, load
from dstltree.security.curve import Curve, configure_client, configure_server
from dstltree.storage.hedging import UploadPolicy
from dstltree.storage.store import ObjectStore

if TYPE_CHECKING:
    from dstltree.aggregator.metrics import NodeMetrics

log = logging.getLogger("dstltree.node")
_MAX_POLL_MS = 100
_METRICS_INTERVAL = 0.5  # seconds between metrics updates from the node's counters


class Node:
    """One aggregator node. ``bind`` is a ZeroMQ endpoint; ``tcp://HOST:0`` picks a free
    port (see :attr:`address`). The parent's endpoint is ``config.parent_address``.
    ``metrics``: updated from the loop and the uploads; the node closes it (stops its
    HTTP server) when it stops serving. Objects are written by :attr:`writer`, this
    node's own :class:`ObjectWriter` (hedged per ``upload_policy``), on
    ``upload_threads`` threads off the event loop. ``advertise``: the endpoint other
    nodes connect to (:attr:`address`), needed when ``bind`` is a wildcard such as
    ``tcp://0.0.0.0:7700``; default: the bound endpoint. ``security``: CURVE for the
    ROUTER (accepting node and writer keys) and the DEALERs to other nodes
    (:meth:`Curve.for_node`); None = plaintext (tests; the launchers default to CURVE)."""

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
        security: Curve | None = None,
    ) -> None:
        self.store = store
        self._security = security
        self.max_message_bytes = max_message_bytes
        self.writer = ObjectWriter(store, upload_policy)
        self.upload_policy = self.writer.policy
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._front = self._ctx.socket(zmq.ROUTER)
        self._front.setsockopt(zmq.LINGER, 0)
        configure_server(self._front, security, "node")
        self._front.bind(bind[:-2] + ":*" if bind.endswith(":0") else bind)
        # what other nodes connect to (sent down in plans): the bound endpoint, unless a
        # bind on every interface (tcp://0.0.0.0:port) is advertised under another name
        self.address: str = advertise or self._front.getsockopt_string(zmq.LAST_ENDPOINT)
        self.core = NodeCore(replace(config, address=self.address))
        self._upstream: dict[str, zmq.Socket] = {}
        self._poller = zmq.Poller()
        self._poller.register(self._front, zmq.POLLIN)
        self._pool = ThreadPoolExecutor(upload_threads, thread_name_prefix=f"node-{config.node_id}")
        self._results: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stats: NodeStatistics = self.core.statistics()
        self.metrics = metrics
        self._metrics_due = 0.0

    # -- public --------------------------------------------------------------------------
    def serve(self) -> None:
        """Run the event loop until :meth:`stop` (blocking)."""
        self._poller.register(self._wake_r, zmq.POLLIN)
        if self.core.parent is not None:
            self._socket_to(self.core.parent)
        try:
            while not self._stop.is_set():
                ready = dict(self._poller.poll(self._poll_ms()))
                now = time.monotonic()
                if self._front in ready:
                    self._drain_front(now)
                for address, sock in list(self._upstream.items()):
                    if sock in ready:
                        self._drain_up(address, sock, now)
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
                self._drain_results()
                self._run(self.core.handle(TimePassed(time.monotonic())))
                with self._lock:
                    self._stats = self.core.statistics(now)
                if self.metrics is not None and now >= self._metrics_due:
                    self._metrics_due = now + _METRICS_INTERVAL
                    self._update_metrics()
        finally:
            self._close()

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
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def statistics(self) -> NodeStatistics:
        with self._lock:
            return self._stats

    def _update_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.update(self.statistics(), self.writer.upload_stats())

    # -- loop parts ----------------------------------------------------------------------
    def _poll_ms(self) -> int:
        deadline = self.core.next_deadline()
        if deadline is None:
            return _MAX_POLL_MS
        return max(0, min(_MAX_POLL_MS, int((deadline - time.monotonic()) * 1000) + 1))

    def _drain_front(self, now: float) -> None:
        for _ in range(1000):
            try:
                frames = self._front.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity = frames[0].bytes
            try:
                msg = load(frames[1:], self.max_message_bytes)
            except WireError as e:
                log.warning("rejected message: %s", e)
                self._run(self.core.handle(MalformedFromBelow(now, identity, str(e))))
                continue
            self._run(self.core.handle(MessageFromBelow(now, identity, msg)))

    def _drain_up(self, address: str, sock: zmq.Socket, now: float) -> None:
        for _ in range(1000):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                msg = load(frames)
            except WireError as e:
                log.warning("bad message from %s: %s", address, e)
                continue
            self._run(self.core.handle(MessageFromUpstream(now, address, msg)))

    def _socket_to(self, address: str) -> zmq.Socket:
        """The DEALER to an upstream node, opened on first use (one per address)."""
        sock = self._upstream.get(address)
        if sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            configure_client(sock, self._security)
            sock.connect(address)
            self._upstream[address] = sock
            self._poller.register(sock, zmq.POLLIN)
        return sock

    def _drain_results(self) -> None:
        while True:
            try:
                event = self._results.get_nowait()
            except queue.Empty:
                return
            self._run(self.core.handle(event))

    def _run(self, instructions: list[Instruction]) -> None:
        for ins in instructions:
            match ins:
                case ReplyBelow(identity, msg):
                    self._send(self._front, [identity, *dump(msg)])
                case SendUpstream(address, msg):
                    self._send(self._socket_to(address), dump(msg))
                case WriteObject(oid, items):
                    try:
                        self._pool.submit(self._write, oid, items)
                    except RuntimeError:  # shutting down: the origins time out and retry
                        log.warning("node stopping; object %d not written", oid)

    def _send(self, sock: zmq.Socket, frames: list[Any]) -> None:
        try:
            sock.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            log.warning("send queue full; message dropped (the peer times out and retries)")
        except zmq.ZMQError as e:
            log.warning("send failed: %s", e)

    def _write(self, oid: int, items: tuple) -> None:
        t0 = time.monotonic()
        ok = False
        try:
            path, refs = self.writer.write(items)
            event: Event = ObjectWritten(time.monotonic(), oid, path, tuple(refs))
            ok = True
        except Exception as e:  # noqa: BLE001 - reported to the origins as an error ack
            log.warning("object write failed: %s", e)
            event = ObjectFailed(time.monotonic(), oid, str(e))
        if self.metrics is not None:
            size = sum(i.size for i in items)
            self.metrics.observe_upload(size, len(items), time.monotonic() - t0, ok)
        self._results.put(event)
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _close(self) -> None:
        self._pool.shutdown(wait=True)
        self._drain_results()
        if self.metrics is not None:
            with self._lock:
                self._stats = self.core.statistics(time.monotonic())
            self._update_metrics()
            self.metrics.close()
        self._front.close(0)
        for sock in self._upstream.values():
            sock.close(0)
        os.close(self._wake_r)
        os.close(self._wake_w)
