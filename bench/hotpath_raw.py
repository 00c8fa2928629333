"""The raw pyzmq hops the hot-path figures are measured against (hotpath_net.py,
hotpath_latency.py): a DEALER->ROUTER hop in one process or with its receiver in
processes of its own, the floors' files made ahead, and a minimal node written with
pyzmq alone (:func:`raw_hop_process` with a ``write_dir``): what any node process
that stores what it receives could reach on this machine."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import resource
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

from dstltree.storage.store import fsync_dir


def cpu_seconds() -> float:
    """User plus system CPU seconds of this process so far (all threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rate(nbytes: float, seconds: float, cpu: float) -> dict[str, float]:
    """``bytes_per_s`` and ``cpu_s_per_gb`` (CPU seconds per 10**9 bytes)."""
    return {"bytes_per_s": nbytes / seconds, "cpu_s_per_gb": cpu / (nbytes / 1e9)}


class FloorFiles:
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
        _write_durably(fd, [body])

    def discard(self) -> None:
        while self.ready:
            with suppress(OSError):
                os.unlink(self.ready.popleft())


def _raw_receiver(router: zmq.Socket, write_dir: str | None) -> None:
    """Receive until an empty frame; acknowledge each message whose first frame is
    b"a" (after writing and fsyncing its body to a NEW file under ``write_dir`` when
    given), b"r" (the same into a file made ahead, :class:`FloorFiles`) or b"p" (after
    making as many files ahead as its body says, in ASCII; the answer is the number of
    b"r" writes so far that found none ready) and the final empty one."""
    files = None if write_dir is None else FloorFiles(write_dir)
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


_DEALER_TIMEOUT_MS = 60_000  # a raw hop's sender gives up on a receiver that hangs


def raw_socket(kind: int) -> zmq.Socket:
    """A socket of a raw hop: no linger, 64 messages queued each way; a DEALER's sends
    and receives raise ``zmq.Again`` after ``_DEALER_TIMEOUT_MS`` (a receiver that
    died or hangs fails the figure instead of hanging the benchmark)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 64)
    sock.setsockopt(zmq.RCVHWM, 64)
    if kind == zmq.DEALER:
        sock.setsockopt(zmq.SNDTIMEO, _DEALER_TIMEOUT_MS)
        sock.setsockopt(zmq.RCVTIMEO, _DEALER_TIMEOUT_MS)
    return sock


def _end_hop(dealer: zmq.Socket) -> None:
    """Stop a raw hop's receiver with an empty frame (its answer awaited up to 10 s)
    and close the DEALER; a receiver that takes nothing any more is left to its
    process's stop."""
    with suppress(zmq.Again):
        dealer.send_multipart([b"", b""])
        dealer.poll(min(10_000, _DEALER_TIMEOUT_MS))
    dealer.close()


@contextmanager
def raw_hop(write_dir: str | None = None) -> Iterator[zmq.Socket]:
    """A DEALER connected over loopback TCP to a ROUTER served by a thread (see
    :func:`_raw_receiver`); the receiver is stopped with an empty frame on exit."""
    router, dealer = raw_socket(zmq.ROUTER), raw_socket(zmq.DEALER)
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


def raw_send(dealer: zmq.Socket, body: bytes, seconds: float) -> tuple[int, float, float]:
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


class _ObjectFiles:
    """Segments a minimal node receives, gathered into objects of at least
    ``object_bytes`` bytes, each written to a new file under ``write_dir`` and
    fsynced by one of ``threads`` write threads (as a node's upload threads): the
    least a node that stores what it receives must do (no directory fsync, no footer:
    less than a node's objects)."""

    def __init__(self, write_dir: str, object_bytes: int, threads: int = 4) -> None:
        self.dir, self.object_bytes = write_dir, object_bytes
        self.run, self.n = os.urandom(4).hex(), 0
        self.frames: list[zmq.Frame] = []
        self.filled = 0
        self.threads = threads
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="least-write")
        self.writes: list[Future[None]] = []

    def append(self, body: zmq.Frame) -> None:
        """Add ``body`` to the object being gathered; hand it to a write thread once
        it holds ``object_bytes``."""
        self.frames.append(body)
        self.filled += len(body)
        if self.filled >= self.object_bytes:
            self._write()

    def _write(self) -> None:
        """Hand the gathered object to a write thread; with ``4 * threads`` writes
        undone, wait for the oldest first (a node stops reading while its uploads
        are behind, too)."""
        self.n += 1
        path = os.path.join(self.dir, f"least-{self.run}-{self.n}")
        self.writes = [f for f in self.writes if not f.done()]
        if len(self.writes) >= 4 * self.threads:
            self.writes.pop(0).result()
        self.writes.append(self.pool.submit(_write_file, path, self.frames))
        self.frames, self.filled = [], 0

    def flush(self) -> None:
        """Write what was gathered and wait until every write is durable (raises what
        a write raised)."""
        if self.frames:
            self._write()
        for f in self.writes:
            f.result()
        self.writes = []

    def close(self) -> None:
        """:meth:`flush`, then end the write threads."""
        try:
            self.flush()
        finally:
            self.pool.shutdown(wait=True)


def _write_file(path: str, frames: list[zmq.Frame]) -> None:
    """Write ``frames`` to the new file ``path`` and fsync it."""
    _write_durably(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), frames)


def _write_durably(fd: int, frames: list[zmq.Frame]) -> None:
    """Write ``frames`` back to back to ``fd`` in one ``writev`` (the rest of a short
    write in a loop), fsync and close it."""
    try:
        views = [memoryview(f.buffer) for f in frames]
        done = os.writev(fd, views)
        if done < sum(len(v) for v in views):
            rest = memoryview(b"".join(views))[done:]
            while rest:
                rest = rest[os.write(fd, rest) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _least_writer(router: zmq.Socket, write_dir: str, object_bytes: int) -> None:
    """The receiving end of a minimal node chain: gather each body into objects
    written by threads (:class:`_ObjectFiles`); a b"a" message makes everything
    received durable before its answer (the end of a timed turn); an empty body ends
    it (answered b"done")."""
    files = _ObjectFiles(write_dir, object_bytes)
    try:
        while True:
            ident, flag, body = router.recv_multipart(copy=False)
            if not len(body):
                files.flush()
                router.send_multipart([ident, b"done"])
                return
            if flag.bytes == b"a":
                files.flush()
                router.send_multipart([ident, b"ok"])
            else:
                files.append(body)
    finally:
        files.close()


def _least_relay(router: zmq.Socket, dealer: zmq.Socket) -> None:
    """A relay of a minimal node chain: each message from below passes up unchanged
    (``copy=False``), each answer from above goes back to the last sender below; ends
    after passing down the answer b"done"."""
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(dealer, zmq.POLLIN)
    ident: zmq.Frame | bytes = b""  # no answer comes before a message
    while True:
        for sock, _ in poller.poll():
            if sock is router:
                ident, *frames = router.recv_multipart(copy=False)
                dealer.send_multipart(frames, copy=False)
                continue
            answer = dealer.recv_multipart()
            router.send_multipart([ident, *answer])
            if answer == [b"done"]:
                return


def _serve_raw(
    conn: Connection, write_dir: str | None = None, parent: str | None = None, object_bytes: int = 0
) -> None:
    """A receiving process of :func:`raw_hop_process`: a ROUTER on a free loopback
    port served on a thread by :func:`_least_relay` to ``parent`` if given, else by
    :func:`_least_writer` into ``write_dir`` if given, else by :func:`_raw_receiver`
    (writing nothing); sends its endpoint, then answers ``"cpu"`` with this
    process's CPU seconds until anything else arrives (stop)."""
    router = raw_socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = None
    serve: Callable[[], None]
    if parent is not None:
        dealer = raw_socket(zmq.DEALER)
        dealer.connect(parent)
        serve = functools.partial(_least_relay, router, dealer)
    elif write_dir is not None:
        serve = functools.partial(_least_writer, router, write_dir, object_bytes)
    else:
        serve = functools.partial(_raw_receiver, router, None)
    receiving = threading.Thread(target=serve, daemon=True)
    receiving.start()
    conn.send(f"tcp://127.0.0.1:{port}")
    while conn.recv() == "cpu":
        conn.send(cpu_seconds())
    receiving.join(10)  # the sender's empty frame ended it
    router.close()
    if dealer is not None:
        dealer.close()
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


def spawn_child(target: Callable[..., None], args: tuple[Any, ...], what: str) -> ChildProcess:
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


@dataclass
class ReceiverProcess(ChildProcess):
    """A receiving process of :func:`raw_hop_process` and its endpoint."""

    address: str


@contextmanager
def raw_hop_process(
    write_dir: str | None = None, depth: int = 1, object_bytes: int = 4 * 1024 * 1024
) -> Iterator[tuple[zmq.Socket, list[ChildProcess]]]:
    """A raw hop whose receiving end runs in processes of its own (:func:`spawn_child`, as
    the nodes of :func:`~dstltree.bench.hotpath_net.node_processes`): a DEALER here
    and the receivers, the one it talks to last. Without ``write_dir``: one receiver
    that writes nothing. With it: a minimal node chain of ``depth`` processes, the
    first appending what arrives to files of ``object_bytes`` under ``write_dir``
    (:func:`_least_writer`), the others relaying to the one before
    (:func:`_least_relay`). Stopped with an empty frame and through their pipes;
    killed by PID if they do not stop in 40 s."""
    receivers: list[ReceiverProcess] = []
    try:
        for i in range(depth if write_dir is not None else 1):
            parent = receivers[-1].address if receivers else None
            child = spawn_child(
                _serve_raw, (write_dir, parent, object_bytes), f"raw receiver process {i}"
            )
            receivers.append(ReceiverProcess(child.process, child.conn, child.conn.recv()))
        dealer = raw_socket(zmq.DEALER)
        dealer.connect(receivers[-1].address)
        try:
            yield dealer, list(receivers)
        finally:
            _end_hop(dealer)
    finally:
        for r in reversed(receivers):
            r.stop()


def raw_send_apart(
    dealer: zmq.Socket, receivers: list[ChildProcess], body: bytes, seconds: float
) -> tuple[int, float, float]:
    """:func:`raw_send` over :func:`raw_hop_process`: the CPU seconds are the sending
    process's plus the receiving processes'."""
    far0 = sum(r.cpu_seconds() for r in receivers)
    sent, elapsed, cpu = raw_send(dealer, body, seconds)
    return sent, elapsed, cpu + sum(r.cpu_seconds() for r in receivers) - far0
