"""A node process under at least 100,000 malformed and hostile-but-well-formed messages
while a real writer keeps persisting: the node neither crashes nor hangs, every
legitimate persist is acked by the node and reads back, and the node's memory (RSS of
its PID) stays bounded. Deterministic (seeded); about 10 s on two loaded cores.

Kinds of messages (a pool of a few thousand, sent round-robin from several DEALER
sockets, pipelined with NOBLOCK): random frames, msgpack of the wrong types, truncated
headers, persist headers that lie about sizes and counts, huge declared sizes, huge
checkpoint ids, negative/infinite/NaN byte counts, absurd writer counts, ``../`` in log
ids (well-formed: written into objects under the base path, never elsewhere), messages
over the size limit (rejected, or the connection dropped by ``MAXMSGSIZE``), many fake
child nodes and writers, acks and plans sent the wrong way."""

from __future__ import annotations

import json
import math
import random
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import psutil
import zmq

from dstltree.client import ChangelogClient, ObjectStore
from dstltree.client.batching import PersistItem
from dstltree.client.reader import read_changes
from dstltree.client.segment import SegmentMeta
from dstltree.client.wire import (
    AckEntry,
    Persist,
    PersistAck,
    PersistRequest,
    Plan,
    Register,
    Stats,
    Unregister,
    dump,
)
from dstltree.security.curve import configure_client
from tests.support.tree_fixtures import metric, start
from tests.support.waiting import wait_until

MESSAGES = 100_000
SOCKETS = 8
MAX_MESSAGE = 256 * 1024  # the node's max_message_bytes
RSS_GROWTH_LIMIT = 150 * 1024 * 1024  # bytes over the RSS after the warm-up
TIME_LIMIT = 60.0  # seconds for the fuzz phase at most (a hang fails; ~10 s on 2 idle cores)
AHEAD = 20_000  # messages sent but not yet counted by the node, at most


def _persist(rng: random.Random, log: str, cp: Any, size: int) -> list[bytes]:
    meta = SegmentMeta(log, 0, 1, (rng.randrange(4),), size)
    item = PersistItem(meta, cp, bytes(rng.randrange(256) for _ in range(size)) or None)
    return [bytes(f) for f in dump(Persist((PersistRequest(rng.randrange(2**32), item),)))]


def _header(**h: Any) -> list[bytes]:
    return [msgpack.packb(h)]


def _random_frames(rng: random.Random) -> list[bytes]:
    return [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(1, 4))]


def _wrong_types(rng: random.Random) -> list[bytes]:
    junk = [None, -1, 2**64 - 1, 1.5, "x", [], {}, [1, 2], {"a": 1}, b"\x00", True]
    h = {"t": rng.choice([*junk, "persist", "stats", "register", "ack", "plan"])}
    for key in ("log", "items", "node", "writers", "bytes", "cp", "window", "sqn", "via"):
        if rng.random() < 0.5:
            h[key] = rng.choice(junk)
    return _header(**h)


def _truncated(rng: random.Random) -> list[bytes]:
    frames = _persist(rng, f"t{rng.randrange(9)}", rng.randrange(50), 16)
    cut = rng.randrange(1, len(frames[0]))
    return [frames[0][:cut], *frames[1:]]


def _lying_persist(rng: random.Random) -> list[bytes]:
    item = {"id": 1, "log": "liar", "sqn": [0, 1], "cp": 1, "kgs": [0], "crc": 0}
    size = rng.choice([2**62, 2**64 - 1, 10, 0, 5])
    frames = rng.choice([[], [b"abc"], [b"a" * 10, b"b" * 10]])
    items = [dict(item, size=size)] * rng.choice([1, 2, 3])
    sqn = rng.choice([[0, 1], [5, 1], [0], "x"])
    return [msgpack.packb({"t": "persist", "items": [dict(i, sqn=sqn) for i in items]}), *frames]


def _huge_checkpoint(rng: random.Random) -> list[bytes]:
    cp = rng.choice([2**63, 2**64 - 1, 2**40, 10**12])
    if rng.random() < 0.5:
        return [bytes(f) for f in dump(Stats(f"huge{rng.randrange(4)}", 1, 1.0, cp))]
    return _persist(rng, f"huge{rng.randrange(4)}", cp, 8)


def _bad_stats(rng: random.Random) -> list[bytes]:
    nbytes = rng.choice([-1.0, math.inf, -math.inf, math.nan, 1e300])
    writers = rng.choice([1, 2**40, -3])
    return _header(t="stats", node="bad", writers=writers, bytes=nbytes, cp=rng.randrange(100))


def _escaping_log(rng: random.Random) -> list[bytes]:
    log = rng.choice(["../escape", "../../escape", "/abs/escape", "a/../../escape", "\x00.."])
    return _persist(rng, log, rng.randrange(1, 50), rng.randrange(1, 64))


def _oversized(rng: random.Random) -> list[bytes]:
    if rng.random() < 0.5:  # over max_message_bytes, under MAXMSGSIZE: rejected by load
        return [msgpack.packb({"t": "register", "log": "big"}), b"z" * (MAX_MESSAGE + 1)]
    item = {"id": 1, "log": "many", "sqn": [0, 1], "cp": 1, "kgs": [0], "size": 0}
    return [msgpack.packb({"t": "persist", "items": [item] * 5000})]  # too many items


def _fake_peer(rng: random.Random) -> list[bytes]:
    n = rng.randrange(100_000)
    msg = rng.choice(
        [
            Stats(f"fake{n}", rng.randrange(1000), float(rng.randrange(10**6)), rng.randrange(60)),
            Register(f"fake-writer-{n}"),
            Unregister(f"fake-writer-{n}"),
            PersistAck((AckEntry(n, "/etc/passwd", 0),)),
            Plan(rng.randrange(10**9), "evil", "tcp://127.0.0.1:1"),
        ]
    )
    return [bytes(f) for f in dump(msg)]


KINDS = [
    (_random_frames, 20),
    (_wrong_types, 20),
    (_truncated, 10),
    (_lying_persist, 10),
    (_huge_checkpoint, 10),
    (_bad_stats, 8),
    (_escaping_log, 4),
    (_fake_peer, 18),
]


def _pool(rng: random.Random, n: int) -> list[list[bytes]]:
    kinds = [k for k, weight in KINDS for _ in range(weight)]
    return [rng.choice(kinds)(rng) for _ in range(n)]


class _LegitWriter(threading.Thread):
    """Persists one checkpoint after another until stopped; records what was acked."""

    def __init__(self, client: ChangelogClient) -> None:
        super().__init__(name="legit-writer", daemon=True)
        self.writer = client.create_writer("legit", range(4))
        self.stop = threading.Event()
        self.changes: list[bytes] = []
        self.handles: list[Any] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        cp = 1
        try:
            while not self.stop.is_set():
                for k in range(3):
                    change = f"cp{cp}-{k}".encode()
                    self.writer.append(k, change)
                    self.changes.append(change)
                self.handles.append(self.writer.persist_durably(0, checkpoint_id=cp).result(30))
                cp += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def _send_all(
    socks: list[zmq.Socket], pool: list[list[bytes]], rng: random.Random, url: str, count: int
) -> tuple[int, int]:
    """Send messages from ``pool`` (plus a few over MAXMSGSIZE) round-robin without
    blocking, draining replies, until the node counted ``count`` messages from below
    (its metric); at most ``AHEAD`` messages ahead of it. Returns (sent, counted)."""
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN | zmq.POLLOUT)
    sent = counted = 0
    deadline = time.monotonic() + TIME_LIMIT
    while counted < count:
        assert time.monotonic() < deadline, f"the node took {counted} messages in {TIME_LIMIT} s"
        for s, ev in poller.poll(100):
            if ev & zmq.POLLIN:
                _drain(s)
            if ev & zmq.POLLOUT and sent - counted < AHEAD:
                sent += _burst(s, pool, sent, rng)
        if sent - counted >= AHEAD // 2 or sent >= count:
            counted = int(metric(url, "dstl_messages_below_total"))
    return sent, counted


def _burst(s: zmq.Socket, pool: list[list[bytes]], sent: int, rng: random.Random) -> int:
    n = 0
    for k in range(64):
        frames = pool[(sent + k) % len(pool)]
        if (sent + k) % 20_000 == 0:  # now and then a message over MAXMSGSIZE
            frames = [frames[0], b"z" * (MAX_MESSAGE * 8)]
        elif (sent + k) % 1000 == 0:
            frames = _oversized(rng)
        try:
            s.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            break
        n += 1
    return n


def _drain(s: zmq.Socket) -> None:
    for _ in range(1000):
        try:
            s.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return


def test_a_node_survives_100k_hostile_messages_while_a_writer_persists(tmp_path: Path) -> None:
    rng = random.Random(11)
    pool = _pool(rng, 3000)
    base = tmp_path / "dfs"
    nodes = [{"id": "root", "bind": "auto"}]
    with start(tmp_path, nodes, max_message_bytes=MAX_MESSAGE, metrics_port=0) as tree:
        node = tree.nodes["root"]
        url = node.metrics_url
        assert url is not None
        proc = psutil.Process(node.pid)
        client = ChangelogClient.open(
            str(base), node=node.address, ack_timeout=15.0, security=tree.client_security
        )
        legit = _LegitWriter(client)
        legit.start()
        # the job's writer is there first (the first checkpoint seen starts the horizon)
        wait_until(lambda: len(legit.handles) >= 1, timeout=30)
        ctx = zmq.Context.instance()
        socks = [ctx.socket(zmq.DEALER) for _ in range(SOCKETS)]
        for s in socks:
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 2000)
            # insiders: the hostile peers hold the writers' key (CURVE is on), so every
            # message reaches the node's own checks
            configure_client(s, tree.client_security)
            s.connect(node.address)
        try:
            t0 = time.monotonic()
            warm, _ = _send_all(socks[:2], pool, rng, url, MESSAGES // 20)  # then the baseline
            baseline = proc.memory_info().rss
            sent, counted = _send_all(socks, pool, rng, url, MESSAGES)
            sent += warm
            peak = proc.memory_info().rss
            elapsed = time.monotonic() - t0
        finally:
            for s in socks:
                s.close(0)
        assert node.process.poll() is None, "the node died"
        legit.stop.set()
        legit.join(timeout=60)
        assert not legit.is_alive() and legit.error is None, legit.error
        fallbacks = client.uploader.statistics().fallbacks  # type: ignore[attr-defined]
        client.close()
    stats = json.loads(node.stats_file.read_text())  # type: ignore[union-attr]
    total = stats["messages_below"]
    print(
        f"\nfuzz: {sent} hostile messages sent, {total} taken by the node (legit ones"
        f" included) in {elapsed:.1f} s; legit persists "
        f"{len(legit.handles)}, fallbacks {fallbacks}; RSS {baseline >> 20} -> {peak >> 20} MiB;"
        f" rejected {stats['rejected_messages']}, refused checkpoints "
        f"{stats['refused_checkpoints']}, refused peers {stats['refused_peers']}, "
        f"undeliverable replies {stats['undeliverable_replies']}"
    )
    assert counted >= MESSAGES and sent >= MESSAGES
    assert peak - baseline < RSS_GROWTH_LIMIT
    assert len(legit.handles) >= 3
    assert fallbacks == 0, "every legitimate persist was acked by the node"
    assert stats["rejected_messages"] > 0 and stats["refused_checkpoints"] > 0
    assert stats["refused_peers"] > 0
    store = ObjectStore(str(base))
    got = [c for kg in range(4) for c in read_changes(store, legit.handles[-1], kg)]
    assert sorted(got) == sorted(legit.changes[: len(got)]) and len(got) == len(legit.changes)
    for outside in (tmp_path / "escape", tmp_path.parent / "escape", Path("/abs/escape")):
        assert not outside.exists(), f"a log id escaped the base path: {outside}"
