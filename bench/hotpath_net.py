"""Forwarding figures through real aggregator nodes, each in its own process, against a
raw DEALER->ROUTER hop written here with pyzmq (bytes/s); the pieces the persist
latency figures share (hotpath_latency.py): the raw hop, the floors' files made ahead,
child processes and the node processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import zmq

from dstltree.aggregator.core import NodeConfig
from dstltree.aggregator.node import Node
from dstltree.client.api import ChangelogClient
from dstltree.client.collector import serving_collector
from dstltree.client.handle import ChangelogHandle
from dstltree.client.writer import ChangelogWriter
from dstltree.storage.store import RESERVED_OBJECTS, ObjectStore, fsync_dir

_WINDOW_BYTES = 64 * 1024 * 1024  # bytes in flight of a throughput sender
_CHECKPOINT_BYTES = 32 * 1024 * 1024  # bytes a forwarding writer appends between persists
_PENDING_PERSISTS = 2  # persists a forwarding writer lets wait, as a task's acks
_MAX_DEFERRED_BYTES = 8 << 30  # dropped objects a forwarding stream leaves until it ends


def cpu_seconds() -> float:
    """User plus system CPU seconds of this process so far (all threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rate(nbytes: float, seconds: float, cpu: float) -> dict[str, float]:
    """``bytes_per_s`` and ``cpu_s_per_gb`` (CPU seconds per 10**9 bytes)."""
    return {"bytes_per_s": nbytes / seconds, "cpu_s_per_gb": cpu / (nbytes / 1e9)}


class _FloorFiles:
    """The files a raw receiver writes under ``write_dir``, with names never used
    before: a NEW file per write (created for it, as a store creates an object), or a
    file created ahead (:meth:`prepare`, one directory fsync for them all, as a node's
    reserved object files: storage/reserve.py) when one is ready."""

    def __init__(self, write_dir: str) -> None:
        self.dir, self.run, self.n = write_dir, os.urandom(4).hex(), 0
        self.ready: deque[str] = deque()
        self.fallbacks = 0  # writes into a new file because none was ready

    def _name(self) -> str:
        self.n += 1
        return os.path.join(self.dir, f"raw-{self.run}-{self.n}")

    def prepare(self, count: int) -> None:
        """Unlink the files made ahead and never written; create ``count`` more."""
        self.discard()
        for _ in range(count):
            path = self._name()
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            self.ready.append(path)
        fsync_dir(self.dir)

    def write(self, body: zmq.Frame, ahead: bool) -> None:
        """Write ``body`` and fsync it: into a file made ahead if ``ahead`` (a new file
        when none is left, counted in :attr:`fallbacks`), else into a new file."""
        if ahead and self.ready:
            fd = os.open(self.ready.popleft(), os.O_WRONLY)
        else:
            self.fallbacks += ahead
            fd = os.open(self._name(), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, body.buffer)
            os.fsync(fd)
        finally:
            os.close(fd)

    def discard(self) -> None:
        while self.ready:
            with suppress(OSError):
                os.unlink(self.ready.popleft())


def _raw_receiver(router: zmq.Socket, write_dir: str | None) -> None:
    """Receive until an empty frame; acknowledge each message whose first frame is
    b"a" (after writing and fsyncing its body to a NEW file under ``write_dir`` when
    given), b"r" (the same into a file made ahead, :class:`_FloorFiles`) or b"p" (after
    making as many files ahead as its body says, in ASCII; the answer is the number of
    b"r" writes so far that found none ready) and the final empty one."""
    files = None if write_dir is None else _FloorFiles(write_dir)
    while True:
        ident, flag, body = router.recv_multipart(copy=False)
        if not len(body):
            if files is not None:
                files.discard()
            router.send_multipart([ident, b"done"])
            return
        kind = flag.bytes
        if files is not None and kind == b"p":
            files.prepare(int(body.bytes))
            router.send_multipart([ident, str(files.fallbacks).encode()])
            continue
        if files is not None:
            files.write(body, ahead=kind == b"r")
        if kind in (b"a", b"r"):
            router.send_multipart([ident, b"ok"])


def _raw_socket(kind: int) -> zmq.Socket:
    """A socket of a raw hop: no linger, 64 messages queued each way."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 64)
    sock.setsockopt(zmq.RCVHWM, 64)
    return sock


def _end_hop(dealer: zmq.Socket) -> None:
    """Stop a raw hop's receiver with an empty frame (its answer awaited up to 10 s)
    and close the DEALER."""
    dealer.send_multipart([b"", b""])
    dealer.poll(10_000)
    dealer.close()


@contextmanager
def raw_hop(write_dir: str | None = None) -> Iterator[zmq.Socket]:
    """A DEALER connected over loopback TCP to a ROUTER served by a thread (see
    :func:`_raw_receiver`); the receiver is stopped with an empty frame on exit."""
    router, dealer = _raw_socket(zmq.ROUTER), _raw_socket(zmq.DEALER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    t = threading.Thread(target=_raw_receiver, args=(router, write_dir), daemon=True)
    t.start()
    try:
        yield dealer
    finally:
        _end_hop(dealer)
        t.join(10)
        router.close()


def _raw_send(dealer: zmq.Socket, body: bytes, seconds: float) -> tuple[int, float, float]:
    """Send ``body`` with ``copy=False`` over an open raw hop for about ``seconds`` s,
    timed until the receiver acknowledged the last one: (bytes, seconds, CPU seconds
    of this process)."""
    sent, cpu0, t0 = 0, cpu_seconds(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(16):
            dealer.send_multipart([b"n", body], copy=False)
        sent += 16 * len(body)
    dealer.send_multipart([b"a", b"x"])
    dealer.recv()
    return sent, time.perf_counter() - t0, cpu_seconds() - cpu0


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


def _serve_raw(conn: Connection) -> None:
    """The receiving process of :func:`raw_hop_process`: a ROUTER on a free loopback
    port served by :func:`_raw_receiver` on a thread; sends its endpoint, then answers
    ``"cpu"`` with this process's CPU seconds until anything else arrives (stop)."""
    router = _raw_socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    receiving = threading.Thread(target=_raw_receiver, args=(router, None), daemon=True)
    receiving.start()
    conn.send(f"tcp://127.0.0.1:{port}")
    while conn.recv() == "cpu":
        conn.send(cpu_seconds())
    receiving.join(10)  # the sender's empty frame ended it
    router.close()
    conn.send("stopped")


@dataclass
class ChildProcess:
    """A process of :func:`raw_hop_process` or :func:`node_processes` and its control
    pipe (it answers ``"cpu"``; anything else stops it)."""

    process: BaseProcess
    conn: Connection

    def cpu_seconds(self) -> float:
        """User plus system CPU seconds of the process so far."""
        self.conn.send("cpu")
        return float(self.conn.recv())

    def stop(self) -> None:
        """Ask it to stop through the pipe; kill it by PID if it has not ended 40 s
        later."""
        with suppress(OSError, EOFError):
            self.conn.send("stop")
            self.conn.poll(30)
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)


def _spawn(target: Callable[..., None], args: tuple[Any, ...], what: str) -> ChildProcess:
    """Start ``target(conn, *args)`` in a process of its own (multiprocessing's spawn,
    daemon) and wait up to 60 s for its first message (then on the pipe: ``recv``).
    Raises TimeoutError, after killing it, if none came."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=target, args=(theirs, *args), daemon=True)
    proc.start()
    child = ChildProcess(proc, ours)
    if not ours.poll(60):
        child.stop()
        raise TimeoutError(f"{what} did not start in 60 s")
    return child


@contextmanager
def raw_hop_process() -> Iterator[tuple[zmq.Socket, ChildProcess]]:
    """A raw hop whose ROUTER end runs in a process of its own (:func:`_spawn`, as
    the nodes of :func:`node_processes`): a DEALER here and the receiver. Stopped with
    an empty frame and through its pipe; killed by PID if it does not stop in 40 s."""
    receiver = _spawn(_serve_raw, (), "raw receiver process")
    try:
        dealer = _raw_socket(zmq.DEALER)
        dealer.connect(receiver.conn.recv())
        try:
            yield dealer, receiver
        finally:
            _end_hop(dealer)
    finally:
        receiver.stop()


def _raw_send_apart(
    dealer: zmq.Socket, receiver: ChildProcess, body: bytes, seconds: float
) -> tuple[int, float, float]:
    """:func:`_raw_send` over :func:`raw_hop_process`: the CPU seconds are the sending
    process's plus the receiving process's."""
    far0 = receiver.cpu_seconds()
    sent, elapsed, cpu = _raw_send(dealer, body, seconds)
    return sent, elapsed, cpu + receiver.cpu_seconds() - far0


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
            child = _spawn(_serve_node, (base_path, f"n{i}", parent, size), f"node process n{i}")
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
    after it, so that a change of the machine's load during the run hits both, and
    against the same hop between two processes (:func:`raw_hop_process`) for an
    eighth before and an eighth after. The client uploads pre-emptively at
    ``segment`` bytes with 64 MiB in flight at most, so each change of ``segment``
    bytes goes out as one segment (:class:`_Stream`; dropped objects are deleted after
    the raw hops' second turn while they fit in :func:`deferrable_bytes`).

    Keys ``node``, ``raw`` and ``raw_apart``, each with ``bytes_per_s`` and
    ``cpu_s_per_gb`` (CPU seconds per 10**9 bytes: of the client's and the nodes'
    processes; of the raw hop's process; of both raw processes); ``node`` also has
    ``deferred_bytes`` and ``dropped_bytes`` (stream bytes whose objects were deleted
    after the run / during it)."""
    body = os.urandom(segment)
    with (
        raw_hop() as dealer,
        raw_hop_process() as (far, receiver),
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
        before = _raw_send(dealer, body, seconds / 4)
        apart_before = _raw_send_apart(far, receiver, body, seconds / 8)
        node_cpu0 = sum(n.cpu_seconds() for n in nodes)
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        with serving_collector():  # as a task's loop runs (sparkplug/task_loop.py)
            sent = stream.run(seconds / 2)
        elapsed = time.perf_counter() - t0
        stream.drain()  # the CPU of deletions during the run counts too
        cpu = cpu_seconds() - cpu0 + sum(n.cpu_seconds() for n in nodes) - node_cpu0
        after = _raw_send(dealer, body, seconds / 4)
        apart_after = _raw_send_apart(far, receiver, body, seconds / 8)
        stream.close()  # the deferred deletions: after the raw hops, untimed
    raw = [a + b for a, b in zip(before, after, strict=True)]
    apart = [a + b for a, b in zip(apart_before, apart_after, strict=True)]
    node = _rate(sent, elapsed, cpu) | {
        "deferred_bytes": stream.deferred_bytes,
        "dropped_bytes": stream.dropped_bytes,
    }
    return {"node": node, "raw": _rate(*raw), "raw_apart": _rate(*apart)}


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
        return _rate(written, time.perf_counter() - t0, cpu_seconds() - cpu0)
    finally:
        store.close()
