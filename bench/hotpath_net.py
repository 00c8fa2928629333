"""Hot-path figures through real in-process aggregator nodes against floors written
here with pyzmq: a raw DEALER->ROUTER hop (bytes/s) and one round trip plus one local
file write with fsync (persist latency)."""

from __future__ import annotations

import os
import resource
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import zmq

from dstltree.aggregator.core import NodeConfig
from dstltree.aggregator.node import Node
from dstltree.client.api import ChangelogClient
from dstltree.client.handle import ChangelogHandle
from dstltree.storage.store import RESERVED_OBJECTS, ObjectStore

_WINDOW_BYTES = 64 * 1024 * 1024  # bytes in flight of a throughput sender
_SMALL_CHANGE = 100  # bytes of one change of the "1 MB of small changes" figure


def cpu_seconds() -> float:
    """User plus system CPU seconds of this process so far (all threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rate(nbytes: int, seconds: float, cpu: float) -> dict[str, float]:
    """``bytes_per_s`` and ``cpu_s_per_gb`` (CPU seconds per 10**9 bytes)."""
    return {"bytes_per_s": nbytes / seconds, "cpu_s_per_gb": cpu / (nbytes / 1e9)}


def _raw_receiver(router: zmq.Socket, write_dir: str | None) -> None:
    """Receive until an empty frame; acknowledge each message whose first frame is
    b"a" (after writing and fsyncing its body to a NEW file under ``write_dir`` when
    given: created for it, as a store creates an object) and the final empty one."""
    n, run = 0, os.urandom(4).hex()  # names never used before: no write into an old file
    while True:
        ident, flag, body = router.recv_multipart(copy=False)
        if not len(body):
            router.send_multipart([ident, b"done"])
            return
        if write_dir is not None:
            n += 1
            path = os.path.join(write_dir, f"raw-{run}-{n}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, body.buffer)
                os.fsync(fd)
            finally:
                os.close(fd)
        if flag.bytes == b"a":
            router.send_multipart([ident, b"ok"])


@contextmanager
def raw_hop(write_dir: str | None = None) -> Iterator[zmq.Socket]:
    """A DEALER connected over loopback TCP to a ROUTER served by a thread (see
    :func:`_raw_receiver`); the receiver is stopped with an empty frame on exit."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for s in (router, dealer):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 64)
        s.setsockopt(zmq.RCVHWM, 64)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    t = threading.Thread(target=_raw_receiver, args=(router, write_dir), daemon=True)
    t.start()
    try:
        yield dealer
    finally:
        dealer.send_multipart([b"", b""])
        dealer.poll(10_000)
        t.join(10)
        dealer.close()
        router.close()


def raw_throughput(segment: int, seconds: float) -> dict[str, float]:
    """Bytes/s of ``segment``-byte messages sent with ``copy=False`` over a raw hop for
    about ``seconds`` s (timed until the receiver acknowledged the last one), and CPU
    seconds per GB of both ends."""
    body = os.urandom(segment)
    with raw_hop() as dealer:
        sent, cpu0, t0 = 0, cpu_seconds(), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(16):
                dealer.send_multipart([b"n", body], copy=False)
            sent += 16 * segment
        dealer.send_multipart([b"a", b"x"])
        dealer.recv()
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return _rate(sent, elapsed, cpu)


@contextmanager
def node_chain(base_path: str, depth: int, target_bytes: int) -> Iterator[list[Node]]:
    """``depth`` in-process nodes in a chain (root first, security None) writing under
    ``base_path``; the root writes objects of ``target_bytes``, the others forward
    hop by hop (no plans). Clients connect to the last one."""
    store = ObjectStore(base_path, reserve_objects=RESERVED_OBJECTS)  # as build_node's
    nodes: list[Node] = []
    try:
        for i in range(depth):
            parent = nodes[-1].address if nodes else None
            size = target_bytes if parent is None else 1 << 40
            node = Node(NodeConfig(f"n{i}", parent, size, plans=False), store, security=None)
            node.start()
            nodes.append(node)
        yield nodes
    finally:
        for n in reversed(nodes):
            n.stop()


def _pump(
    append: Callable[[], None],
    persist: Callable[[], Future[ChangelogHandle]],
    durable: Callable[[ChangelogHandle], None],
    size: int,
    seconds: float,
) -> int:
    """Append and persist one ``size``-byte segment at a time for ``seconds`` s with at
    most 64 MiB in flight, calling ``durable`` with each handle once it is durable (in
    order); returns the bytes persisted (all durable on return)."""
    inflight: deque[Future[ChangelogHandle]] = deque()
    sent, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        append()
        inflight.append(persist())
        sent += size
        if len(inflight) * size >= _WINDOW_BYTES:
            durable(inflight.popleft().result())
    for f in inflight:
        durable(f.result())
    return sent


def node_throughput(
    base_path: str, segment: int, seconds: float, depth: int = 1
) -> dict[str, float]:
    """Bytes/s of ``segment``-byte segments persisted by one writer through a chain of
    ``depth`` nodes (:func:`node_chain`, root objects of 4 MiB) for about ``seconds``
    s, until durable; CPU seconds per GB of client and nodes. The writer drops what is
    durable (``truncate``), as a task does once its state is safe: its memory stays
    bounded by the 64 MiB in flight."""
    body = os.urandom(segment)
    with (
        node_chain(base_path, depth, 4 * 1024 * 1024) as nodes,
        ChangelogClient.open(base_path, node=nodes[-1].address) as client,
    ):
        w = client.create_writer("bench-forward", range(128))
        state = {"after": 0}

        def persist() -> Future[ChangelogHandle]:
            f = w.persist_durably(state["after"])
            state["after"] = w.next_sqn()
            return f

        def durable(handle: ChangelogHandle) -> None:  # as a task, once its state is safe
            w.truncate(handle.sqn_range[1])

        cpu0, t0 = cpu_seconds(), time.perf_counter()
        sent = _pump(lambda: w.append(0, body), persist, durable, segment, seconds)
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    return _rate(sent, elapsed, cpu)


def store_throughput(
    base_path: str, object_bytes: int, seconds: float, threads: int = 4
) -> dict[str, float]:
    """Bytes/s of ``object_bytes``-byte objects put durably (the store's fsyncs) under
    ``base_path`` by ``threads`` threads (a node's default upload threads) for about
    ``seconds`` s: the most any node can write there, whatever its forwarding costs."""
    store, body = ObjectStore(base_path), os.urandom(object_bytes)
    t_end = time.perf_counter() + seconds

    def put_until_deadline() -> int:
        n = 0
        while time.perf_counter() < t_end:
            store.put(store.new_object_path(), body)
            n += object_bytes
        return n

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        written = sum(pool.map(lambda _: put_until_deadline(), range(threads)))
    return {"bytes_per_s": written / (time.perf_counter() - t0)}


def _percentiles(samples: list[float]) -> dict[str, float]:
    """``p50`` and ``p99`` of ``samples`` (seconds), and ``n``."""
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return {"p50": q[49], "p99": q[98], "n": len(samples)}


def floor_latency(
    write_dir: str, payload: int, seconds: float, minimum: int = 20
) -> dict[str, float]:
    """Latency (s) of one raw round trip carrying ``payload`` bytes whose receiver
    writes and fsyncs them to a new file under ``write_dir`` before answering; repeated
    for about ``seconds`` s (at least ``minimum`` times)."""
    body, samples = os.urandom(payload), list[float]()
    with raw_hop(write_dir) as dealer:
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end or len(samples) < minimum:
            t0 = time.perf_counter()
            dealer.send_multipart([b"a", body], copy=False)
            dealer.recv()
            samples.append(time.perf_counter() - t0)
    return _percentiles(samples)


def node_latency(
    base_path: str, payload: int, change: int, seconds: float, minimum: int = 20
) -> dict[str, float]:
    """Latency (s) of one checkpoint through one node: append ``payload`` bytes as
    changes of ``change`` bytes, then ``persist_durably(..., checkpoint_id=k)`` until
    its handle is durable (appends included); repeated for about ``seconds`` s (at
    least ``minimum`` times)."""
    body, samples = os.urandom(change), list[float]()
    per = max(1, payload // change)
    with (
        node_chain(base_path, 1, 1 << 40) as nodes,
        ChangelogClient.open(base_path, node=nodes[0].address) as client,
    ):
        w = client.create_writer("bench-latency", range(128))
        after, k, t_end = 0, 0, time.perf_counter() + seconds
        while time.perf_counter() < t_end or len(samples) < minimum:
            t0 = time.perf_counter()
            for i in range(per):
                w.append(i % 128, body)
            w.persist_durably(after, checkpoint_id=k).result()
            samples.append(time.perf_counter() - t0)
            after, k = w.next_sqn(), k + 1
            w.truncate(after)
    return _percentiles(samples)


def latency_figures(
    base_path: str, write_dir: str, payload: int, change: int, seconds: float
) -> dict[str, Any]:
    """Node persist latency against its floor (both halves of ``seconds``): keys
    ``node`` and ``floor`` (p50 / p99 in s), ``ratio_p50`` and ``ratio_p99`` (node /
    floor: times the floor)."""
    floor = floor_latency(write_dir, payload, seconds / 2)
    node = node_latency(base_path, payload, change, seconds / 2)
    return {
        "payload_bytes": payload,
        "change_bytes": change,
        "node": node,
        "floor": floor,
        "ratio_p50": node["p50"] / floor["p50"],
        "ratio_p99": node["p99"] / floor["p99"],
    }
