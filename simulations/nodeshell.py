"""The tree designs of the simulator on the real node core: one
:class:`dstltree.aggregator.core.NodeCore` per executor node, driven inside simpy.

The nodes' rules (batching, routing, plans, expected writers, markers, acks, stats,
timeouts) are the node core's own; only the shell differs from ``aggregator.node``:

What the shell models:

* **Writers.** Each executor's tasks are writers ``t<i>.<j>`` of one client (one
  ROUTER identity per executor, as ``client.node_uploader``): they Register at time 0;
  at each checkpoint trigger every writer persists and the client sends the
  executor's requests in one real wire :class:`Persist` message to its own node (the
  uploader sends what is queued together): one :class:`PersistRequest` per writer, a
  :class:`PersistItem` with its :class:`SegmentMeta` and a zero-copy slice of one
  shared zero buffer as payload (a marker when a task has no bytes). A checkpoint
  completes when every writer got its ack; an error ack makes the writer write its
  segment straight to the store (DFS fallback).
* **Transport.** A writer and its node share a host: no hop latency. Between nodes a
  message pays the sender's NIC (``node_bandwidth`` bytes/s, FIFO), ``hop_latency_s``
  and the receiver's NIC (FIFO). Payload bytes only; headers, Stats, Plans and acks
  count 0 bytes.
* **Node CPU.** ``cpu_per_message_s`` per message received. Messages that arrive while
  the node is busy wait and are then handled together with
  :meth:`NodeCore.handle_many` (the real shell drains bursts of ready messages the same
  way); the burst's events carry the time its first message is done, the rest of its
  CPU delays the next burst.
* **Time.** A ``TimePassed`` at :meth:`NodeCore.next_deadline` (persist delay, stats
  interval, upstream ack deadlines), one pending timer per node.
* **Storage.** :class:`WriteObject` goes to the simulated store
  (:class:`dstltree.simulations.storage.SimulatedStore`: latency model, throttling,
  retries, hedging); the node gets ``ObjectWritten`` when the store says it is durable.
* **Node failures** (``node_failures_per_hour`` > 0): :mod:`dstltree.simulations.failures`
  kills and restarts nodes through :meth:`NodeCoreCluster.handle`, ``deliver``,
  ``disconnect`` and ``restart``; a dead node drops what reaches it and what it was
  doing. Only then do writers have ack deadlines (the job's ack timeout,
  ``parent_timeout_s`` x (height + 1)): a request not acked by then is written to the
  store by its writer (DFS fallback); an ack that comes later is counted in
  ``late_acks`` and ignored.
* **Configuration.** As ``aggregator.process.node_config``: target, persist delay,
  plan window, plans on (``tree``) or off (``tree-noplan``), a node at depth d waits
  ``parent_timeout_s * max(d, 1)`` for an upstream ack, its further parents (a DAG's)
  as ``fallback_addresses``, ``hold_down_s`` as ``parent_retry_after``.

What it does not model: message encoding and decoding (the message objects are passed
as they are; the node core re-stamps each item's origin as the real one does), CPU per
byte, segment encoding, socket high-water marks and
back-pressure (``NodeCore.accepting`` is not consulted), ``ObjectFailed`` (the
simulated store retries until the object is durable), leases running out,
authentication, and the coordinator (the caller triggers checkpoints: on a fixed
interval, or the coordinator core of :mod:`dstltree.simulations.coordshell`, which
hooks in through ``on_writer_done`` and ``object_path``).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import simpy

from dstltree.aggregator.core import NodeConfig, NodeCore
from dstltree.aggregator.events import (
    Event,
    Instruction,
    MessageFromBelow,
    MessageFromUpstream,
    ObjectWritten,
    ReplyBelow,
    SendUpstream,
    TimePassed,
    WriteObject,
)
from dstltree.client.batching import PersistItem, RemoteOrigin
from dstltree.client.handle import SegmentRef
from dstltree.client.segment import SegmentMeta
from dstltree.client.wire import Message, Persist, PersistAck, PersistRequest, Register
from dstltree.simulations.config import SimConfig
from dstltree.simulations.storage import SimulatedStore

__all__ = ["NodeCoreCluster"]

_INF = math.inf


class _Host:
    """The shell state of one node: its core, queued messages (from below?, identity
    or address, message), when its CPU and NICs are free, its pending timer."""

    __slots__ = (
        "core",
        "inbox",
        "busy",
        "cpu_free",
        "tx_free",
        "rx_free",
        "timer",
        "ident",
        "dead",
    )

    def __init__(self, core: NodeCore, ident: bytes) -> None:
        self.core = core
        self.dead = False  # killed: its pending work is dropped (a restart is a new _Host)
        self.inbox: list[tuple[bool, Any, Message]] = []
        self.busy = False
        self.cpu_free = 0.0
        self.tx_free = 0.0
        self.rx_free = 0.0
        self.timer = _INF
        self.ident = ident


class NodeCoreCluster:
    """One node core per executor of ``cfg.build_tree()`` (designs ``tree`` and
    ``tree-noplan``), the executors' writers and the store, on the simpy environment
    ``env``. :meth:`trigger` starts checkpoint ``c`` now; ``done[c]`` is when its last
    writer got its ack (seconds); ``relayed[c]`` the bytes of checkpoint ``c`` that nodes
    passed on without having produced them; ``objects[c]`` the objects holding its
    segments; ``fallbacks`` the segments writers wrote themselves after an error ack or
    their ack deadline; ``route[i]`` the node executor i's client sends to."""

    def __init__(self, cfg: SimConfig, env: simpy.Environment, store: SimulatedStore) -> None:
        self.cfg = cfg
        self.env = env
        self.store = store
        self.tree = tree = cfg.build_tree()
        self.ids = tree.nodes
        self.index = {n: i for i, n in enumerate(self.ids)}
        self.hosts = [self._host(n) for n in self.ids]
        self.by_ident = {h.ident: i for i, h in enumerate(self.hosts)}
        self.writer_ident = [b"x" + n.encode() for n in self.ids]
        self.by_writer_ident = {w: i for i, w in enumerate(self.writer_ident)}
        tasks = cfg.tasks_per_executor
        self.logs = [[f"t{i}.{j}" for j in range(tasks)] for i in range(len(self.ids))]
        self.sqn = [[0] * tasks for _ in self.ids]  # next sequence number per writer
        self.rids = itertools.count(1)
        self.pending: dict[int, tuple[int, int, int, SegmentMeta | None]] = {}
        # rid -> (checkpoint, executor, task, its segment or None for a marker)
        self.left: dict[int, int] = {}
        self.done: dict[int, float] = {}
        self.relayed: defaultdict[int, int] = defaultdict(int)
        self.objects: defaultdict[int, int] = defaultdict(int)
        self.fallbacks = 0
        # the executors' clients: the node each sends to now (its own unless failed
        # over, simulations.failures); with node failures, every request's ack deadline
        self.route = list(range(len(self.ids)))
        self.ack_timeout = cfg.parent_timeout_s * (tree.height() + 1) if cfg.failures else None
        self.deadline: dict[int, float] = {}
        self.sent: dict[int, PersistItem] = {}  # with node failures: rid -> its item
        # messages of clients (executor, message) queued for a dead node, in order
        self.parked: defaultdict[int, list[tuple[int, Message]]] = defaultdict(list)
        self.late_acks = 0  # acks of requests already acked or written directly
        self.abandoned_writes = 0  # objects whose node died before they were durable
        self._zero = memoryview(b"")
        self._paths = itertools.count()
        # hooks of the coordinator shell (simulations.coordshell): a writer's segment
        # is durable (checkpoint, executor, task, its SegmentRef or None for a marker),
        # and the name of each new object (default: o0, o1, ...)
        self.on_writer_done: Callable[[int, int, int, SegmentRef | None], None] | None = None
        self.object_path: Callable[[], str] = lambda: f"o{next(self._paths)}"

    def _host(self, node: str, generation: int = 0) -> _Host:
        """A fresh node core for ``node``; a restarted one (``generation`` > 0) gets a
        new identity, as a reconnecting ROUTER peer does."""
        cfg, tree = self.cfg, self.tree
        parents = tree.parents(node)
        core = NodeCore(
            NodeConfig(
                node_id=node,
                parent_address=parents[0] if parents else None,
                fallback_addresses=parents[1:],
                parent_retry_after=cfg.hold_down_s,
                target_bytes=cfg.target_object_bytes,
                address=node,
                persist_delay=cfg.persist_delay_s,
                parent_timeout=cfg.parent_timeout_s * max(tree.depth(node), 1),
                plans=cfg.design == "tree",
                plan_window=cfg.plan_window,
                stats_interval=cfg.stats_interval_s,
            ),
            validate=cfg.check_invariants,
        )
        suffix = f"#{generation}" if generation else ""
        return _Host(core, f"n{node}{suffix}".encode())

    # -- the clock -----------------------------------------------------------------------
    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` at time ``t`` (seconds; now if in the past)."""
        ev = self.env.timeout(max(0.0, t - self.env.now))
        ev.callbacks.append(lambda _e: fn(*args))

    # -- writers -------------------------------------------------------------------------
    def start(self) -> None:
        """Every writer registers with its node; every node starts its clock."""
        for i, logs in enumerate(self.logs):
            for log in logs:
                self._arrive(i, True, self.writer_ident[i], Register(log))
            self._arm(i)

    def _payload(self, size: int) -> memoryview:
        if size > len(self._zero):
            self._zero = memoryview(bytes(max(size, 2 * len(self._zero))))
        return self._zero[:size]

    def trigger(self, c: int, sizes: np.ndarray) -> None:
        """Checkpoint ``c``: writer j of executor i persists ``sizes[i, j]`` bytes; an
        executor's writers persist at once, so its client sends their requests in one
        Persist message (``client.node_uploader`` sends what is queued together)."""
        now = self.env.now
        self.done[c] = now
        self.left[c] = sizes.size
        pending = self.pending
        rids = self.rids
        sent = self.sent if self.ack_timeout is not None else None
        for i, row in enumerate(sizes.tolist()):
            logs, sqn = self.logs[i], self.sqn[i]
            requests = []
            for j, size in enumerate(row):
                lo = sqn[j]
                rid = next(rids)
                if size:
                    sqn[j] = lo + 1
                    meta = SegmentMeta(logs[j], lo, lo + 1, (), size)
                    item = PersistItem(meta, c, self._payload(size))
                    pending[rid] = (c, i, j, meta)
                else:
                    item = PersistItem.marker(logs[j], lo, c)
                    pending[rid] = (c, i, j, None)
                if sent is not None:
                    sent[rid] = item
                requests.append(PersistRequest(rid, item))
            self.send_requests(i, requests)

    def send_requests(self, i: int, requests: list[PersistRequest]) -> None:
        """Executor ``i``'s client sends ``requests`` in one Persist to the node it sends
        to now (lost on the way if that node is dead); with node failures each gets an
        ack deadline, after which the writer writes its segment itself."""
        if self.ack_timeout is not None:
            deadline = self.env.now + self.ack_timeout
            for r in requests:
                self.deadline[r.id] = deadline
            self.at(deadline, self._ack_deadline, [r.id for r in requests])
        self.deliver(i, self.route[i], Persist(tuple(requests)))

    def _ack_deadline(self, rids: list[int]) -> None:
        now = self.env.now
        for rid in rids:
            if rid in self.pending and self.deadline.get(rid, _INF) <= now:
                self._fall_back(rid)

    def _acked(self, entries: Any) -> None:
        for e in entries:
            if e.id not in self.pending:  # acked already, or written directly
                self.late_acks += 1
                continue
            if e.error is not None:  # the writer writes its segment itself
                self._fall_back(e.id)
                continue
            c, i, j, meta = self.pending.pop(e.id)
            self.deadline.pop(e.id, None)
            self.sent.pop(e.id, None)
            ref = None if meta is None or e.path is None else SegmentRef(meta, e.path, e.offset)
            self._writer_done(c, i, j, ref)

    def _fall_back(self, rid: int) -> None:
        """The writer of request ``rid`` writes its segment to the store itself."""
        c, i, j, meta = self.pending.pop(rid)
        self.deadline.pop(rid, None)
        self.sent.pop(rid, None)
        self.fallbacks += 1
        self.objects[c] += 1
        size = 0 if meta is None else meta.length
        ref = None if meta is None else SegmentRef(meta, self.object_path(), 0)
        durable = float(self.store.put(c, self.env.now, size))
        self.at(durable, self._writer_done, c, i, j, ref)

    def _writer_done(self, c: int, i: int, j: int, ref: SegmentRef | None) -> None:
        """Writer j of executor i has its ack (its segment ``ref`` is durable)."""
        self.left[c] -= 1
        if self.left[c] == 0:
            self.done[c] = self.env.now
            del self.left[c]
        if self.on_writer_done is not None:
            self.on_writer_done(c, i, j, ref)

    def unacknowledged(self, i: int) -> list[tuple[int, PersistItem]]:
        """(request id, item) of executor ``i``'s requests awaiting their ack (with
        node failures only: the items are kept for sending again)."""
        return [(rid, item) for rid, item in self.sent.items() if self.pending[rid][1] == i]

    # -- failures (simulations.failures decides when) ------------------------------------
    def handle(self, v: int, event: Event) -> None:
        """Node ``v``'s core handles ``event`` now; its instructions are carried out."""
        self._run(v, self.hosts[v].core.handle(event))

    def deliver(self, i: int, v: int, msg: Message) -> None:
        """Executor ``i``'s client sends ``msg`` to node ``v``: it arrives now, or, if
        ``v`` is dead, waits in the client's socket until ``v`` is back (a connecting
        DEALER queues what it sends; ZeroMQ's default, no ``IMMEDIATE``)."""
        if self.hosts[v].dead:
            self.parked[v].append((i, msg))
        else:
            self._arrive(v, True, self.writer_ident[i], msg)

    def disconnect(self, i: int) -> None:
        """Executor ``i``'s client closes its connection (it moves to another node):
        what it queued for a dead node is dropped (the socket does not linger)."""
        for v, queued in self.parked.items():
            self.parked[v] = [(k, m) for k, m in queued if k != i]

    def restart(self, v: int, generation: int) -> None:
        """Node ``v`` comes back: a fresh core with a new identity, its clock started,
        the clients' queued messages delivered."""
        h = self._host(self.ids[v], generation)
        self.hosts[v] = h
        self.by_ident[h.ident] = v
        self._arm(v)
        for i, msg in self.parked.pop(v, []):
            self._arrive(v, True, self.writer_ident[i], msg)

    # -- transport -----------------------------------------------------------------------
    def _arrive(self, v: int, below: bool, key: Any, msg: Message) -> None:
        """A message is in node ``v``'s receive queue now (dropped if ``v`` is dead)."""
        h = self.hosts[v]
        if h.dead:
            return
        h.inbox.append((below, key, msg))
        if not h.busy:
            h.busy = True
            start = h.cpu_free if h.cpu_free > self.env.now else self.env.now
            self.at(start + self.cfg.cpu_per_message_s, self._burst, v, h)

    def _send(self, src: int, dst: int, below: bool, key: Any, msg: Message) -> None:
        """One message between nodes: sender NIC, hop, receiver NIC."""
        cfg = self.cfg
        nbytes = sum(r.item.size for r in msg.requests) if isinstance(msg, Persist) else 0
        h = self.hosts[src]
        start = h.tx_free if h.tx_free > self.env.now else self.env.now
        h.tx_free = start + nbytes / cfg.node_bandwidth
        self.at(h.tx_free + cfg.hop_latency_s, self._receive, dst, below, key, msg, nbytes)

    def _receive(self, dst: int, below: bool, key: Any, msg: Message, nbytes: int) -> None:
        h = self.hosts[dst]
        if h.dead:
            return
        start = h.rx_free if h.rx_free > self.env.now else self.env.now
        h.rx_free = start + nbytes / self.cfg.node_bandwidth
        if h.rx_free > self.env.now:
            self.at(h.rx_free, self._arrive, dst, below, key, msg)
        else:
            self._arrive(dst, below, key, msg)

    # -- the node ------------------------------------------------------------------------
    def _burst(self, v: int, h: _Host) -> None:
        """Node ``v`` handles every message waiting (one NodeCore.handle_many)."""
        if h.dead:
            return
        now = self.env.now
        inbox, h.inbox, h.busy = h.inbox, [], False
        h.cpu_free = now + self.cfg.cpu_per_message_s * (len(inbox) - 1)
        events: list[Event] = [
            MessageFromBelow(now, key, msg) if below else MessageFromUpstream(now, key, msg)
            for below, key, msg in inbox
        ]
        self._run(v, h.core.handle_many(events))

    def _arm(self, v: int) -> None:
        """Keep one timer at node ``v``'s next deadline."""
        h = self.hosts[v]
        nd = h.core.next_deadline()
        if nd is None or nd >= h.timer:
            return
        nd = max(nd, self.env.now + 1e-9)
        h.timer = nd
        self.at(nd, self._tick, v, nd, h)

    def _tick(self, v: int, when: float, h: _Host) -> None:
        if h.dead or h.timer != when:
            return  # dead, or superseded by an earlier timer
        h.timer = _INF
        nd = h.core.next_deadline()
        if nd is not None and nd > self.env.now:  # it moved later (a flush, a report)
            self._arm(v)
            return
        self._run(v, h.core.handle(TimePassed(self.env.now)))

    def _run(self, v: int, out: list[Instruction]) -> None:
        """Execute node ``v``'s instructions, then re-arm its timer."""
        h = self.hosts[v]
        for ins in out:
            if isinstance(ins, SendUpstream):
                if isinstance(ins.message, Persist):
                    self._count_relayed(ins.message)
                self._send(v, self.index[ins.address], True, h.ident, ins.message)
            elif isinstance(ins, ReplyBelow):
                node = self.by_ident.get(ins.identity)
                if node is not None:
                    self._send(v, node, False, self.ids[v], ins.message)
                elif isinstance(ins.message, PersistAck):
                    self._acked(ins.message.items)
            elif isinstance(ins, WriteObject):
                self._write(v, ins)
        self._arm(v)

    def _count_relayed(self, msg: Persist) -> None:
        """Bytes passed on by a node that received them from another node."""
        for r in msg.requests:
            o = r.item.origin
            if isinstance(o, RemoteOrigin) and o.relayed and r.item.checkpoint_id is not None:
                self.relayed[r.item.checkpoint_id] += r.item.size

    def _write(self, v: int, ins: WriteObject) -> None:
        items = ins.items
        now = self.env.now
        cps = {i.checkpoint_id for i in items}
        for c in cps:
            if c is not None:
                self.objects[c] += 1
        first = min((c for c in cps if c is not None), default=0)
        durable = float(self.store.put(first, now, sum(i.size for i in items)))
        self.at(durable, self._written, v, ins, self.hosts[v])

    def _written(self, v: int, ins: WriteObject, h: _Host) -> None:
        if h.dead:  # its writer died with it: the object is never referenced
            self.abandoned_writes += 1
            return
        path = self.object_path()
        refs, off = [], 0
        for i in ins.items:
            refs.append(SegmentRef(i.meta, path, off))
            off += i.size
        ev = ObjectWritten(self.env.now, ins.object_id, path, tuple(refs))
        self._run(v, h.core.handle(ev))
