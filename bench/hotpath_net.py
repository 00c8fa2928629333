"""Forwarding figures through real aggregator nodes, each in its own process, against
the raw pyzmq hops of hotpath_raw.py (bytes/s), the node processes the persist latency
figures share (hotpath_latency.py), and the rate at which a directory takes objects."""

from __future__ import annotations

import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection

import zmq

from dstltree.aggregator.core import NodeConfig
from dstltree.aggregator.node import Node
from dstltree.bench.hotpath_raw import (
    ChildProcess,
    cpu_seconds,
    rate,
    raw_hop,
    raw_hop_process,
    raw_send,
    raw_send_apart,
    spawn_child,
)
from dstltree.client.api import ChangelogClient
from dstltree.client.collector import serving_collector
from dstltree.client.handle import ChangelogHandle
from dstltree.client.writer import ChangelogWriter
from dstltree.storage.store import RESERVED_OBJECTS, ObjectStore

_WINDOW_BYTES = 64 * 1024 * 1024  # bytes in flight of a throughput sender
_CHECKPOINT_BYTES = 32 * 1024 * 1024  # bytes a forwarding writer appends between persists
_PENDING_PERSISTS = 2  # persists a forwarding writer lets wait, as a task's acks
_MAX_DEFERRED_BYTES = 8 << 30  # dropped objects a forwarding stream leaves until it ends


class _Stream:
    """One writer streaming changes of ``len(body)`` bytes (each becomes one segment
    through a pre-emptive upload; the client's in-flight limit blocks the appends).
    Every ``_CHECKPOINT_BYTES`` it persists what was appended; at most two persists
    wait (as a task's acknowledgements do, ``sparkplug.acks.PendingAcks``). Once one is
    durable it truncates it; the objects only truncated changes are in are dropped.

    Deleting them is the shared state registry's work after a materialization, on the
    driver, not the task's or the node's: while the dropped objects hold at most
    ``defer_bytes`` (stream bytes), they are left for :meth:`close` (after the timed
    window, like the store figure's, which deletes nothing while it runs). Beyond
    that (a long run on a tmpfs would fill the memory), ``drop`` deletes them on a
    thread of its own during the run: that CPU counts, but it does not hold the
    producer up."""

    def __init__(
        self,
        w: ChangelogWriter,
        body: bytes,
        drop: Callable[[set[str]], object],
        defer_bytes: int = 0,
    ):
        self.w, self.body, self.drop = w, body, drop
        self.after = 0
        self.held: frozenset[str] = frozenset()
        self.defer_bytes = defer_bytes
        self.deferred_bytes = 0  # stream bytes whose objects are left for close()
        self.dropped_bytes = 0  # stream bytes whose objects were deleted during the run
        self._deferred: set[str] = set()
        self._per_persist = max(1, _CHECKPOINT_BYTES // len(body)) * len(body)
        self._deleter = ThreadPoolExecutor(1, thread_name_prefix="bench-drop")

    def run(self, seconds: float) -> int:
        """Stream for about ``seconds`` s; returns the bytes appended, all durable on
        return."""
        w, body = self.w, self.body
        pending: deque[Future[ChangelogHandle]] = deque()
        sent, t0 = 0, time.perf_counter()
        per_checkpoint = self._per_persist // len(body)
        while time.perf_counter() - t0 < seconds:
            for _ in range(per_checkpoint):
                w.append(0, body)
            sent += self._per_persist
            pending.append(w.persist_durably(self.after))
            self.after = w.next_sqn()
            if len(pending) > _PENDING_PERSISTS:
                self._durable(pending.popleft().result())
        while pending:
            self._durable(pending.popleft().result())
        return sent

    def drain(self) -> None:
        """Wait for the deletions asked for during the run (not the deferred ones)."""
        self._deleter.submit(lambda: None).result()

    def close(self) -> None:
        """Delete the deferred objects; wait for every deletion."""
        if self._deferred:
            self._deleter.submit(self.drop, self._deferred)
            self._deferred = set()
        self._deleter.shutdown(wait=True)

    def _durable(self, handle: ChangelogHandle) -> None:
        self.w.truncate(handle.sqn_range[1])
        paths = handle.object_paths()
        gone = set(self.held - paths)
        self.held = paths
        if self.deferred_bytes + self._per_persist <= self.defer_bytes:
            self._deferred |= gone
            self.deferred_bytes += self._per_persist
        else:
            self._deleter.submit(self.drop, gone)
            self.dropped_bytes += self._per_persist


def deferrable_bytes(path: str) -> int:
    """Bytes of dropped objects a forwarding stream may leave under ``path`` until its
    timed window ends: a quarter of the free space of its filesystem (of the nearest
    existing ancestor), at most ``_MAX_DEFERRED_BYTES``."""
    existing = os.path.abspath(path)
    while not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    return min(shutil.disk_usage(existing).free // 4, _MAX_DEFERRED_BYTES)


def _serve_node(
    conn: Connection, base_path: str, node_id: str, parent: str | None, target: int
) -> None:
    """A node process of :func:`node_processes`: serve one :class:`Node` writing under
    ``base_path``; send its address, then answer ``"cpu"`` with this process's CPU
    seconds until anything else arrives (stop)."""
    store = ObjectStore(base_path, reserve_objects=RESERVED_OBJECTS)  # as build_node's
    node = Node(NodeConfig(node_id, parent, target, plans=False), store, security=None)
    with serving_collector():  # as run_node serves
        serving = node.start()
        conn.send(node.address)
        while conn.recv() == "cpu":
            conn.send(cpu_seconds())
        node.stop()
        serving.join(30)  # the node closes its sockets and its store (reserved files) first
    conn.send("stopped")


@dataclass
class NodeProcess(ChildProcess):
    """A node of :func:`node_processes`: its process, control pipe and endpoint."""

    address: str


@contextmanager
def node_processes(base_path: str, depth: int, target_bytes: int) -> Iterator[list[NodeProcess]]:
    """``depth`` nodes in a chain (root first, security None, no plans) writing under
    ``base_path``: the root writes objects of ``target_bytes``, the others relay hop by
    hop; clients connect to the last one. Each node runs in its own process, as nodes
    are deployed (``dstl node``, never inside a task's process), started with
    multiprocessing's spawn; stopped through their pipes, killed by PID if they do not
    stop in 40 s."""
    nodes: list[NodeProcess] = []
    try:
        for i in range(depth):
            parent = nodes[-1].address if nodes else None
            size = target_bytes if parent is None else 1 << 40
            child = spawn_child(
                _serve_node, (base_path, f"n{i}", parent, size), f"node process n{i}"
            )
            nodes.append(NodeProcess(child.process, child.conn, address=child.conn.recv()))
        yield nodes
    finally:
        for n in reversed(nodes):
            n.stop()


def forwarding_throughput(
    base_path: str, segment: int, seconds: float, depth: int = 1
) -> dict[str, dict[str, float]]:
    """Bytes/s of ``segment``-byte segments written by one writer through a chain of
    ``depth`` node processes (:func:`node_processes`, root objects of 4 MiB) until
    durable, for half of about ``seconds`` s, against a raw hop sending the same sizes
    (:func:`raw_hop`, both ends in this process) for a quarter before and a quarter
    after it, so that a change of the machine's load during the run hits both; and,
    for an eighth before and an eighth after each, against the same hop with its
    receiver in a process of its own (:func:`raw_hop_process`, writing nothing) and
    against a minimal node chain of ``depth`` processes written with pyzmq alone that
    stores what it receives in files of 4 MiB in a directory next to ``base_path``
    (:func:`raw_hop_process` with a ``write_dir``; removed after each turn, untimed).
    The client uploads pre-emptively at ``segment`` bytes with 64 MiB in flight at
    most, so each change of ``segment`` bytes goes out as one segment
    (:class:`_Stream`; dropped objects are deleted right after the node's turn,
    untimed, while they fit in :func:`deferrable_bytes`).

    Keys ``node``, ``raw``, ``raw_apart`` and ``least``, each with ``bytes_per_s``
    and ``cpu_s_per_gb`` (CPU seconds per 10**9 bytes: of the client's and the nodes'
    processes; of the raw hop's process; of the sending and the receiving
    processes); ``node`` also has ``deferred_bytes`` and ``dropped_bytes`` (stream
    bytes whose objects were deleted after the run / during it)."""
    body, least_dir = os.urandom(segment), base_path.rstrip("/") + "-least"
    os.makedirs(least_dir, exist_ok=True)
    try:
        with (
            raw_hop() as dealer,
            raw_hop_process() as apart,
            raw_hop_process(least_dir, depth) as least,
            node_processes(base_path, depth, 4 * 1024 * 1024) as nodes,
            ChangelogClient.open(
                base_path,
                node=nodes[-1].address,
                preemptive_bytes=segment,
                max_in_flight_bytes=_WINDOW_BYTES,
            ) as client,
        ):
            w = client.create_writer("bench-forward", range(128))
            stream = _Stream(w, body, client.store.delete, deferrable_bytes(base_path))
            turns = [_floor_turns(dealer, apart, least, least_dir, body, seconds)]
            sent, elapsed, cpu = _node_turn(stream, nodes, seconds / 2)
            stream.close()  # the deferred deletions, untimed: the floors write into
            # a directory as empty as the node's was when it started
            turns.append(_floor_turns(dealer, apart, least, least_dir, body, seconds))
    finally:
        shutil.rmtree(least_dir, ignore_errors=True)
    node = rate(sent, elapsed, cpu) | {
        "deferred_bytes": stream.deferred_bytes,
        "dropped_bytes": stream.dropped_bytes,
    }
    floors = {
        key: rate(*[a + b for a, b in zip(turns[0][key], turns[1][key], strict=True)])
        for key in turns[0]
    }
    return {"node": node, **floors}


def _floor_turns(
    dealer: zmq.Socket,
    apart: tuple[zmq.Socket, list[ChildProcess]],
    least: tuple[zmq.Socket, list[ChildProcess]],
    least_dir: str,
    body: bytes,
    seconds: float,
) -> dict[str, tuple[int, float, float]]:
    """One turn of each floor of :func:`forwarding_throughput`: (bytes, seconds, CPU
    seconds) under ``raw`` (``seconds / 4``), ``raw_apart`` and ``least`` (an eighth
    each); the files of ``least`` are removed after its turn, untimed."""
    out = {
        "raw": raw_send(dealer, body, seconds / 4),
        "raw_apart": raw_send_apart(*apart, body, seconds / 8),
        "least": raw_send_apart(*least, body, seconds / 8),
    }
    for name in os.listdir(least_dir):
        os.unlink(os.path.join(least_dir, name))
    return out


def _node_turn(
    stream: _Stream, nodes: list[NodeProcess], seconds: float
) -> tuple[int, float, float]:
    """The stream through the nodes for about ``seconds`` s: (bytes, seconds, CPU
    seconds of this process and the nodes', deletions during the run included)."""
    node_cpu0 = sum(n.cpu_seconds() for n in nodes)
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    with serving_collector():  # as a task's loop runs (sparkplug/task_loop.py)
        sent = stream.run(seconds)
    elapsed = time.perf_counter() - t0
    stream.drain()  # the CPU of deletions during the run counts too
    cpu = cpu_seconds() - cpu0 + sum(n.cpu_seconds() for n in nodes) - node_cpu0
    return sent, elapsed, cpu


def store_throughput(
    base_path: str, object_bytes: int, seconds: float, threads: int = 4
) -> dict[str, float]:
    """Bytes/s of ``object_bytes``-byte objects put durably (the store's fsyncs) under
    ``base_path`` by ``threads`` threads (a node's default upload threads) for about
    ``seconds`` s, into object files reserved ahead as a node's store does: the most
    any node can write there, whatever its forwarding costs; and the CPU seconds per
    10**9 bytes of those puts (``cpu_s_per_gb``)."""
    store, body = ObjectStore(base_path, reserve_objects=RESERVED_OBJECTS), os.urandom(object_bytes)
    t_end = time.perf_counter() + seconds

    def put_until_deadline() -> int:
        n = 0
        while time.perf_counter() < t_end:
            store.put(store.new_object_path(), body)
            n += object_bytes
        return n

    try:
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            written = sum(pool.map(lambda _: put_until_deadline(), range(threads)))
        return rate(written, time.perf_counter() - t0, cpu_seconds() - cpu0)
    finally:
        store.close()
