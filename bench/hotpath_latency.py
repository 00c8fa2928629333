"""Persist latency (hotpath.py's latency figures): one checkpoint through a real node
against three floors written here with pyzmq, sampled in alternating slices.

The topology floor is one round trip through a minimal node with the threads a node
and its client have and nothing else:

- the caller sends on a DEALER, under a lock shared with the client's I/O thread, and
  waits on a ``concurrent.futures.Future``;
- the client's I/O thread waits on the DEALER's descriptor (``zmq.FD``) and resolves
  the future with the reply;
- the node, in its own process: a loop thread waits on the ROUTER's descriptor and
  hands each body to a write thread (a queue), which writes it into a file created
  ahead, fsyncs it (:class:`~dstltree.bench.hotpath_raw.FloorFiles`) and sends the ack
  on the ROUTER under the loop's lock.

What that floor costs beyond the reserved floor (one round trip plus the same write)
is the thread topology's: the hand-offs between threads and processes on this machine.
What the real node costs beyond it is the code's: decoding, the core, the object's
format, the hedged upload, the client's segments and handles.
"""

from __future__ import annotations

import os
import queue
import select
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

import zmq

from dstltree.bench.hotpath_net import node_processes
from dstltree.bench.hotpath_raw import (
    ChildProcess,
    FloorFiles,
    cpu_seconds,
    raw_hop,
    raw_socket,
    spawn_child,
)
from dstltree.client.api import ChangelogClient
from dstltree.client.collector import serving_collector
from dstltree.client.links import readable

__all__ = ["TopologyClient", "latency_figures", "topology_floor"]

_LATENCY_SLICES = 8  # alternating slices of floor and node samples in latency_figures
_FASTEST_WRITE_S = 100e-6  # below any round trip with an fsynced write (files made ahead)
_IDLE_MS = 100  # ms a thread waits on a descriptor before it looks again (stop flags)
_REPLY_TIMEOUT_S = 10.0  # seconds a round trip may take before it counts as lost


class _TopologyNode:
    """The node of the topology floor (in its child process): ROUTER, loop thread,
    write thread. A message is ``[flag, body]``: b"r" writes ``body`` and acks it; b"p"
    makes as many files ahead as ``body`` says (ASCII) and answers how many writes so
    far found none ready; an empty body stops both threads after the answer b"done"."""

    def __init__(self, write_dir: str) -> None:
        self.router = raw_socket(zmq.ROUTER)
        self.port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.files = FloorFiles(write_dir)
        self.lock = threading.Lock()  # the ROUTER is used under it by both threads
        self.todo: queue.SimpleQueue[tuple[bytes, zmq.Frame] | None] = queue.SimpleQueue()
        self.wake_r, self.wake_w = os.pipe()
        self.threads = [
            threading.Thread(target=self._loop, daemon=True),
            threading.Thread(target=self._write, daemon=True),
        ]

    def _reply(self, ident: bytes, answer: bytes) -> None:
        """Send ``answer`` under the lock; wake the loop if a message waits (this send
        may have taken the descriptor's edge)."""
        with self.lock:
            self.router.send_multipart([ident, answer])
            waiting = readable(self.router)
        if waiting:
            os.write(self.wake_w, b"x")

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(int(self.router.getsockopt(zmq.FD)), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            with self.lock:
                frames = self.router.recv_multipart(copy=False) if readable(self.router) else None
            if frames is None:
                for fd, _ in poller.poll(_IDLE_MS):
                    if fd == self.wake_r:
                        os.read(self.wake_r, 4096)
                continue
            ident, flag, body = frames
            if not len(body):
                self.todo.put(None)
                self.files.discard()
                self._reply(ident.bytes, b"done")
                return
            if flag.bytes == b"p":
                self.files.prepare(int(body.bytes))
                self._reply(ident.bytes, str(self.files.fallbacks).encode())
            else:
                self.todo.put((ident.bytes, body))

    def _write(self) -> None:
        while (job := self.todo.get()) is not None:
            ident, body = job
            self.files.write(body, ahead=True)
            self._reply(ident, b"ok")

    def close(self) -> None:
        for t in self.threads:
            t.join(10)
        self.router.close()
        os.close(self.wake_r)
        os.close(self.wake_w)


def _serve_topology(conn: Connection, write_dir: str) -> None:
    """The child process of :func:`topology_floor`: serve a :class:`_TopologyNode`;
    send its endpoint, then answer ``"cpu"`` until anything else arrives (stop)."""
    node = _TopologyNode(write_dir)
    with serving_collector():  # as a node's process serves (run_node)
        for t in node.threads:
            t.start()
        conn.send(f"tcp://127.0.0.1:{node.port}")
        while conn.recv() == "cpu":
            conn.send(cpu_seconds())
        node.close()  # the client's empty message ended its threads
    conn.send("stopped")


class TopologyClient:
    """The client of the topology floor: :meth:`round_trip` sends on the caller's
    thread and waits for the reply that the I/O thread hands over in a future."""

    def __init__(self, address: str) -> None:
        self.dealer = raw_socket(zmq.DEALER)
        self.dealer.connect(address)
        self._lock = threading.Lock()
        self._waiting: Future[bytes] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._io, daemon=True)
        self._thread.start()

    def round_trip(self, flag: bytes, body: Any) -> bytes:
        """Send ``[flag, body]`` (``copy=False``) and return the reply. Raises
        TimeoutError after ``_REPLY_TIMEOUT_S`` seconds."""
        waiting: Future[bytes] = Future()
        with self._lock:
            self._waiting = waiting
            self.dealer.send_multipart([flag, body], copy=False)
        self._take_replies()  # this use of the socket may have taken the edge
        return waiting.result(_REPLY_TIMEOUT_S)

    def _take_replies(self) -> None:
        with self._lock:
            replies = []
            while readable(self.dealer):
                replies.append(self.dealer.recv())
            waiting = self._waiting if replies else None
            if waiting is not None:
                self._waiting = None
        if waiting is not None:
            waiting.set_result(replies[-1])

    def _io(self) -> None:
        poller = select.poll()
        poller.register(int(self.dealer.getsockopt(zmq.FD)), select.POLLIN)
        while not self._stop.is_set():
            poller.poll(_IDLE_MS)
            self._take_replies()

    def close(self) -> None:
        """Stop the I/O thread, then end the node's threads with an empty message."""
        self._stop.set()
        self._thread.join(10)
        with self._lock:
            self.dealer.send_multipart([b"", b""])
            if self.dealer.poll(int(_REPLY_TIMEOUT_S * 1000)):
                self.dealer.recv()
            self.dealer.close()


@contextmanager
def topology_floor(write_dir: str) -> Iterator[tuple[TopologyClient, ChildProcess]]:
    """A :class:`TopologyClient` connected to a topology node in a process of its own
    (spawned as the nodes of ``node_processes`` are) writing under ``write_dir``;
    stopped on exit, killed by PID if it does not stop in 40 s."""
    node = spawn_child(_serve_topology, (write_dir,), "topology node process")
    try:
        client = TopologyClient(node.conn.recv())
        try:
            yield client, node
        finally:
            client.close()
    finally:
        node.stop()


def _percentiles(samples: list[float]) -> dict[str, float]:
    """``p50`` and ``p99`` of ``samples`` (seconds), and ``n``."""
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return {"p50": q[49], "p99": q[98], "n": len(samples)}


def _timed(call: Callable[[], object], seconds: float, minimum: int) -> list[float]:
    """Seconds each of repeated ``call()``s took, for about ``seconds`` s (at least
    ``minimum`` calls)."""
    samples: list[float] = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end or len(samples) < minimum:
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return samples


def latency_figures(
    base_path: str, write_dir: str, payload: int, change: int, seconds: float, minimum: int = 20
) -> dict[str, Any]:
    """Persist latency through one node against three floors, sampled in alternating
    slices (8 of each, about ``seconds`` s for the node's and the first floor's, at least
    ``minimum`` samples each) so that the machine's noise hits all alike; slices, not
    single samples, so that one's disk work (the node's reserved object files) is not
    flushed by the other's fsync:

    - the checkpoint: stage ``payload`` bytes as changes of ``change`` bytes (on the
      writer's staging lists, as the state backend logs them), then
      ``persist_durably(..., checkpoint_id=k)`` until its handle is durable (staging
      included), through one node in its own process (:func:`node_processes`: how
      nodes run) writing under ``base_path``;
    - the floor: one raw round trip carrying ``payload`` bytes whose receiver writes
      and fsyncs them to a new file under ``write_dir`` before answering;
    - the reserved floor: the same into an empty file created ahead (before the
      slice, outside the timing), as the node writes its objects: where creating a
      file costs the disk more than filling one, the stricter floor;
    - the topology floor: the reserved floor's write through a minimal node with a
      node's and a client's threads (:func:`topology_floor`, the module docstring).

    Keys ``node``, ``floor``, ``floor_reserved`` and ``floor_topology`` (p50 / p99 in
    s, n), ``ratio_p50`` and ``ratio_p99`` (node / floor: times the floor),
    ``ratio_reserved_p50``, ``ratio_topology_p50``, ``reserved_fallbacks`` and
    ``topology_fallbacks`` (writes of those floors that found no file ready)."""
    raw_body = os.urandom(payload)
    series: dict[str, list[float]] = {
        "floor": [],
        "floor_reserved": [],
        "floor_topology": [],
        "node": [],
    }
    with (
        raw_hop(write_dir) as dealer,
        topology_floor(write_dir) as (topology, _),
        node_processes(base_path, 1, 1 << 40) as nodes,
        ChangelogClient.open(base_path, node=nodes[0].address) as client,
    ):
        node_once = _checkpoint_step(client, payload, change)

        def floor_once(flag: bytes) -> Callable[[], None]:
            def once() -> None:
                dealer.send_multipart([flag, raw_body], copy=False)
                dealer.recv()

            return once

        slice_s, least = seconds / _LATENCY_SLICES / 2, minimum // _LATENCY_SLICES + 1
        # files for writes of _FASTEST_WRITE_S each: no fsynced write is quicker
        ahead = str(int(slice_s / _FASTEST_WRITE_S) + least).encode()
        with serving_collector():  # as a task's loop runs (sparkplug/task_loop.py)
            for _ in range(_LATENCY_SLICES):
                new = _timed(floor_once(b"a"), slice_s, least)
                dealer.send_multipart([b"p", ahead])
                dealer.recv()
                topology.round_trip(b"p", ahead)
                series["floor"] += new
                series["floor_reserved"] += _timed(floor_once(b"r"), slice_s, least)
                series["floor_topology"] += _timed(
                    lambda: topology.round_trip(b"r", raw_body), slice_s, least
                )
                series["node"] += _timed(node_once, slice_s, least)
        dealer.send_multipart([b"p", b"0"])  # the files left unused are unlinked
        fallbacks = int(dealer.recv())
        topology_fallbacks = int(topology.round_trip(b"p", b"0"))
    p = {k: _percentiles(v) for k, v in series.items()}
    n, f, r, t = p["node"], p["floor"], p["floor_reserved"], p["floor_topology"]
    return {
        "payload_bytes": payload,
        "change_bytes": change,
        **p,
        "ratio_p50": n["p50"] / f["p50"],
        "ratio_p99": n["p99"] / f["p99"],
        "ratio_reserved_p50": n["p50"] / r["p50"],
        "ratio_topology_p50": n["p50"] / t["p50"],
        "reserved_fallbacks": fallbacks,
        "topology_fallbacks": topology_fallbacks,
    }


def _checkpoint_step(client: ChangelogClient, payload: int, change: int) -> Callable[[], None]:
    """One checkpoint of :func:`latency_figures` through ``client``: stage ``payload``
    bytes as changes of ``change`` bytes on a writer's staging lists (the state
    backend's way in), persist them with a checkpoint id until the handle is durable,
    truncate."""
    w = client.create_writer("bench-latency", range(128))
    staging = [w.staging(kg) for kg in range(128)]
    body, per = os.urandom(change), max(1, payload // change)
    state = {"after": 0, "k": 0}

    def step() -> None:
        for i in range(per):
            staging[i % 128].append(body)
        k = state["k"]
        w.persist_durably(state["after"], checkpoint_id=k).result()
        state["after"], state["k"] = w.next_sqn(), k + 1
        w.truncate(state["after"])

    return step
