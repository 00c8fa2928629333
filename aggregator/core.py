"""The aggregator node as a pure state machine: ``handle(event) -> instructions``.

No sockets, threads or clocks here (pattern of dask/distributed's worker state machine):
``aggregator.node`` drives it over ZeroMQ; tests drive it directly.

Rules (DESIGN.md, Data flow 3-4, The plan, Invariants):
- Items from below join the batch. The batch is flushed on size (>= target bytes),
  when every writer routed here has persisted for one checkpoint, or ``persist_delay``
  seconds after its first item (FLIP-158, Implementation notes).
- At a flush each item goes to its route: with a plan for the item's window, the
  planned writer node (this node, or an ancestor reached directly: one hop); without a
  plan, the parent (hop by hop), except on a size flush, at the root or while the
  parent is unreachable, when this node writes ONE object itself.
- Frames are passed on untouched; acks go back to whoever sent the items.
- An item not acked within ``parent_timeout`` is written by this node itself; the
  unresponsive address is marked down and, if it was the parent, the node re-homes to
  its next live ancestor (plans carry the ancestors). A late ack is ignored; the
  duplicate copy becomes an orphan for cleanup.
- Acks are sent only after the object holding the item was fully written.
- Statistics flow up (residual writers and bytes per checkpoint, highest checkpoint
  seen); plans for window w+1 flow down during window w (FLIP-158, Future directions).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from aggregator.events import (
    Event,
    FromBelow,
    FromUpstream,
    Instruction,
    ObjectFailed,
    ObjectWritten,
    Reply,
    SendTo,
    Tick,
    WriteObject,
)
from client.batching import Batch, PersistItem
from client.wire import (
    Ack,
    AckEntry,
    Error,
    Persist,
    Plan,
    Register,
    Stats,
    Unregister,
    WireItem,
)
from topology.plan import ByteEstimator, decide_local, window_of

SELF = ""  # route: write here


@dataclass(frozen=True)
class NodeConfig:
    """Thresholds of one node. Sizes in bytes, times in seconds. ``address`` is this
    node's own endpoint (passed down in plans); ``parent_address`` None at the root."""

    node_id: str
    parent_address: str | None
    target_bytes: int
    address: str = ""
    persist_delay: float = 0.05
    parent_timeout: float = 2.0
    parent_retry_after: float = 5.0
    writer_lease: float = 10.0
    stats_interval: float = 0.2
    plans: bool = True
    plan_window: int = 16

    @property
    def has_parent(self) -> bool:
        return self.parent_address is not None


@dataclass(frozen=True)
class NodeStatistics:
    """A snapshot of a node's counters (bytes are segment payload bytes)."""

    node_id: str
    writers_below: int
    objects_written: int
    bytes_written: int
    segments_written: int
    bytes_forwarded: int
    bytes_relayed: int
    bytes_received: int
    bytes_own: int
    queued_bytes: int
    in_flight_up: int
    parent_timeouts: int
    rejected_messages: int
    parent_down: bool
    plan_changes: int
    plan_window: int | None
    writes_for_window: bool


@dataclass
class _Sent:
    item: PersistItem
    address: str
    deadline: float


@dataclass
class _Child:
    identity: bytes
    writers: int
    reported_bytes: float
    seen: float


@dataclass
class NodeCore:
    """State of one node; see the module docstring for the rules."""

    config: NodeConfig
    batch: Batch = field(init=False)
    parent: str | None = field(init=False)
    _writers: dict[str, float] = field(default_factory=dict)  # own log_id -> last seen
    _writer_cp: dict[str, int] = field(default_factory=dict)  # own log_id -> last checkpoint
    _children: dict[str, _Child] = field(default_factory=dict)
    _sent: dict[int, _Sent] = field(default_factory=dict)
    _writing: dict[int, tuple[PersistItem, ...]] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _down: dict[str, float] = field(default_factory=dict)  # address -> down until
    _plans: dict[int, tuple[str, str]] = field(default_factory=dict)  # window -> writer
    _pushed: dict[tuple[bytes, int], bool] = field(default_factory=dict)
    _ancestors: tuple[tuple[str, str], ...] = ()
    _estimator: ByteEstimator = field(default_factory=lambda: ByteEstimator(16))
    _own_cp_bytes: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    _max_cp: int = -1
    _last_stats: float = 0.0
    _reported_writers: int = -1
    _counters: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def __post_init__(self) -> None:
        self.batch = Batch(self.config.target_bytes, self.config.persist_delay)
        self.parent = self.config.parent_address

    # -- public --------------------------------------------------------------------------
    def handle(self, event: Event) -> list[Instruction]:
        """Apply one event; return what the shell must do, in order."""
        match event:
            case FromBelow(identity, msg, now):
                out = self._from_below(identity, msg, now)
            case FromUpstream(address, msg, now):
                out = self._from_upstream(address, msg, now)
            case ObjectWritten(oid, _, refs, now):
                out = self._written(oid, refs)
            case ObjectFailed(oid, error, now):
                out = self._failed(oid, error)
            case Tick(now):
                out = []
            case _:
                raise TypeError(f"unknown event {event!r}")
        out += self._housekeeping(now)
        return out

    def reject(self, identity: bytes, reason: str) -> list[Instruction]:
        """A message from below could not be decoded: reply with an error."""
        self._counters["rejected"] += 1
        return [Reply(identity, Error(reason))]

    def next_deadline(self) -> float | None:
        """The earliest time a Tick would change something (None: nothing pending)."""
        times = [s.deadline for s in self._sent.values()]
        if (d := self.batch.deadline()) is not None:
            times.append(d)
        if self.parent is not None:
            times.append(self._last_stats + self.config.stats_interval)
        return min(times) if times else None

    @property
    def writers_below(self) -> int:
        """Residual writers of this subtree: own plus the children's residual writers."""
        return self._live_writers() + sum(c.writers for c in self._children.values())

    def _live_writers(self) -> int:
        """Own writers expected to persist for the next checkpoint: registered ones that
        persisted for the current or previous checkpoint, or have not persisted for any
        yet. A writer of a crashed task stops counting within two checkpoints, long
        before its lease ends, so the all-persisted rule works right after a recovery."""
        recent = self._max_cp - 1
        return sum(1 for w in self._writers if self._writer_cp.get(w, recent) >= recent)

    def expected_writers(self) -> int:
        """Writers whose persist requests reach this node's batch: with a plan naming
        another writer node, the children send there directly and only this executor's
        own writers come here; otherwise the whole residual subtree does."""
        planned = self.writer_for(None)
        if planned is not None and planned[0] != self.config.node_id:
            return self._live_writers()
        return self.writers_below

    def writer_for(self, checkpoint: int | None) -> tuple[str, str] | None:
        """(writer id, address) planned for ``checkpoint``'s window, or None."""
        if not self.config.plans:
            return None
        cp = self._max_cp if checkpoint is None else checkpoint
        if cp < 0:
            return None
        return self._plans.get(window_of(cp, self.config.plan_window))

    def statistics(self, now: float = 0.0) -> NodeStatistics:
        c = self._counters
        window = None if self._max_cp < 0 else window_of(self._max_cp, self.config.plan_window)
        planned = self.writer_for(None)
        return NodeStatistics(
            self.config.node_id, self.writers_below, c["objects"], c["bytes_written"],
            c["segments_written"], c["bytes_forwarded"], c["bytes_relayed"], c["bytes_received"],
            c["bytes_own"], self.batch.nbytes, len(self._sent), c["parent_timeouts"],
            c["rejected"], self.parent is not None and not self._up(self.parent, now),
            c["plan_changes"], window, planned is not None and planned[0] == self.config.node_id,
        )  # fmt: skip

    # -- messages from below -------------------------------------------------------------
    def _from_below(self, identity: bytes, msg: object, now: float) -> list[Instruction]:
        match msg:
            case Register(log_id):
                self._writers[log_id] = now
                return []
            case Unregister(log_id):
                self._writers.pop(log_id, None)
                self._writer_cp.pop(log_id, None)
                return []
            case Stats(node, writers, nbytes, cp):
                known = node in self._children
                self._children[node] = _Child(identity, writers, nbytes, now)
                self._see_checkpoint(cp)
                return [] if known else self._push_plans(now)
            case Persist(items, payloads, via):
                self._accept(identity, items, payloads, via, now)
                return []
        return self.reject(identity, f"unexpected {type(msg).__name__} from below")

    def _accept(
        self, identity: bytes, items: tuple[WireItem, ...], payloads: tuple[Any, ...],
        via: str | None, now: float,
    ) -> None:  # fmt: skip
        frames = iter(payloads)
        for w in items:
            data = next(frames) if w.size > 0 else None
            item = PersistItem(
                w.log_id, w.sqn_from, w.sqn_to, w.checkpoint_id, w.key_groups, data, w.crc32,
                token=(identity, w.id, via is not None),
            )  # fmt: skip
            self._counters["bytes_received"] += item.size
            if via is None:  # from this executor's own writers
                self._writers[w.log_id] = now  # a persist also renews the writer's lease
                if w.checkpoint_id is not None:
                    self._writer_cp[w.log_id] = w.checkpoint_id
                self._counters["bytes_own"] += item.size
                self._own_bytes(w.checkpoint_id, item.size)
            self.batch.add(item, now)

    def _own_bytes(self, checkpoint: int | None, size: int) -> None:
        cp = self._max_cp + 1 if checkpoint is None else checkpoint
        self._own_cp_bytes[cp] += size
        self._see_checkpoint(cp if checkpoint is not None else -1)

    def _see_checkpoint(self, cp: int) -> None:
        if cp <= self._max_cp:
            return
        done = {c: b for c, b in self._own_cp_bytes.items() if c < cp}
        for c in sorted(done):
            self._estimator.update({SELF: float(self._own_cp_bytes.pop(c))})
        for c in range(self._max_cp + 1, cp):
            if self._max_cp >= 0 and c not in done:
                self._estimator.update({SELF: 0.0})  # a checkpoint with no own bytes
        self._max_cp = cp

    # -- messages from upstream ----------------------------------------------------------
    def _from_upstream(self, address: str, msg: object, now: float) -> list[Instruction]:
        if isinstance(msg, Ack):
            return self._relay_acks(msg.items)
        if isinstance(msg, Plan) and address == self.parent:
            return self._on_plan(msg, now)
        return []

    def _on_plan(self, plan: Plan, now: float) -> list[Instruction]:
        """The parent's writer for ``plan.window``: decide locally and pass down."""
        self._ancestors = plan.ancestors
        decision = decide_local(
            self.config.node_id, self._own_estimate(), self._child_reports(),
            self.config.target_bytes, is_root=False,
        )  # fmt: skip
        mine = (self.config.node_id, self.config.address)
        writer = mine if decision.writes else (plan.writer, plan.address)
        if self._plans.get(plan.window) != writer:
            self._counters["plan_changes"] += 1
        self._plans[plan.window] = writer
        self._forget_old_plans(plan.window)
        return self._push_plans(now)

    def _relay_acks(self, entries: tuple[AckEntry, ...]) -> list[Instruction]:
        replies: dict[bytes, list[AckEntry]] = defaultdict(list)
        failed: list[PersistItem] = []
        for e in entries:
            sent = self._sent.pop(e.id, None)
            if sent is None:
                continue  # late ack after a timeout: this node wrote the item itself
            if e.error is not None:
                failed.append(sent.item)
                continue
            identity, orig_id, _ = sent.item.token
            replies[identity].append(AckEntry(orig_id, e.path, e.offset, e.length))
        out: list[Instruction] = [Reply(i, Ack(tuple(a))) for i, a in replies.items()]
        if failed:
            out += self._write(failed)
        return out

    # -- objects -------------------------------------------------------------------------
    def _written(self, oid: int, refs: tuple[Any, ...]) -> list[Instruction]:
        items = self._writing.pop(oid, ())
        replies: dict[bytes, list[AckEntry]] = defaultdict(list)
        for item, ref in zip(items, refs, strict=True):
            identity, orig_id, _ = item.token
            replies[identity].append(AckEntry(orig_id, ref.path, ref.offset, ref.length))
        if items:
            self._counters["objects"] += 1
            self._counters["segments_written"] += len(items)
            self._counters["bytes_written"] += sum(i.size for i in items)
        return [Reply(i, Ack(tuple(a))) for i, a in replies.items()]

    def _failed(self, oid: int, error: str) -> list[Instruction]:
        items = self._writing.pop(oid, ())
        replies: dict[bytes, list[AckEntry]] = defaultdict(list)
        for item in items:
            identity, orig_id, _ = item.token
            replies[identity].append(AckEntry(orig_id, error=f"object write failed: {error}"))
        return [Reply(i, Ack(tuple(a))) for i, a in replies.items()]

    def _write(self, items: list[PersistItem]) -> list[Instruction]:
        data = tuple(i for i in items if i.data is not None)
        if not data:
            return []
        oid = next(self._ids)
        self._writing[oid] = data
        return [WriteObject(oid, data)]

    # -- routing and flushing ------------------------------------------------------------
    def _route(self, item: PersistItem, reason: str, now: float) -> str:
        """SELF or the upstream address for ``item`` at a flush."""
        planned = self.writer_for(item.checkpoint_id)
        if planned is not None:
            node_id, address = planned
            if node_id == self.config.node_id or not address:
                return SELF
            if self._up(address, now):
                return address
        if reason == "size" or self.parent is None or not self._up(self.parent, now):
            return SELF
        return self.parent

    def _flush(self, reason: str, now: float) -> list[Instruction]:
        groups: dict[str, list[PersistItem]] = defaultdict(list)
        for item in self.batch.take(reason, self.expected_writers()):
            groups[self._route(item, reason, now)].append(item)
        out: list[Instruction] = []
        for dest, items in groups.items():
            if dest == SELF:
                out += self._write(items) + self._markers_upstream(items, now)
            else:
                out += self._send(dest, items, now)
        return out

    def _markers_upstream(self, written: list[PersistItem], now: float) -> list[Instruction]:
        """Items written here that would otherwise have gone upstream (a size cut): the
        node upstream still counts their writers for the all-persisted rule, so it gets
        a data-less marker per (writer, checkpoint) instead of waiting for its delay."""
        markers: dict[str, dict[tuple[str, int], PersistItem]] = defaultdict(dict)
        for item in written:
            upstream = self._upstream_of(item, now)
            if upstream is None or item.checkpoint_id is None:
                continue
            key = (item.log_id, item.checkpoint_id)
            markers[upstream][key] = PersistItem(
                item.log_id, item.sqn_to, item.sqn_to, item.checkpoint_id, (), None
            )
        return [
            i for address, m in markers.items() for i in self._send(address, list(m.values()), now)
        ]

    def _upstream_of(self, item: PersistItem, now: float) -> str | None:
        """Where ``item`` goes when it is not written here: the planned writer node,
        else the parent; None when that is this node or unreachable."""
        planned = self.writer_for(item.checkpoint_id)
        if planned is not None:
            node_id, address = planned
            if node_id == self.config.node_id or not address or not self._up(address, now):
                return None
            return address
        if self.parent is None or not self._up(self.parent, now):
            return None
        return self.parent

    def _send(self, address: str, items: list[PersistItem], now: float) -> list[Instruction]:
        wire_items, payloads = [], []
        for item in items:
            fid = next(self._ids)
            if item.data is not None:
                self._sent[fid] = _Sent(item, address, now + self.config.parent_timeout)
                payloads.append(item.data)
                self._counters["bytes_forwarded"] += item.size
                if item.token[2]:
                    self._counters["bytes_relayed"] += item.size
            wire_items.append(
                WireItem(fid, item.log_id, item.sqn_from, item.sqn_to, item.checkpoint_id,
                         item.key_groups, item.size, item.crc32)
            )  # fmt: skip
        return [SendTo(address, Persist(tuple(wire_items), tuple(payloads), self.config.node_id))]

    def _up(self, address: str, now: float) -> bool:
        return now >= self._down.get(address, float("-inf"))

    def _expire_sent(self, now: float) -> list[Instruction]:
        late = [fid for fid, s in self._sent.items() if s.deadline <= now]
        if not late:
            return []
        self._counters["parent_timeouts"] += 1
        for address in {self._sent[fid].address for fid in late}:
            self._down[address] = now + self.config.parent_retry_after
        if self.parent is not None and not self._up(self.parent, now):
            self._rehome(now)
        return self._write([self._sent.pop(fid).item for fid in late])

    def _rehome(self, now: float) -> None:
        """The parent is unreachable: report to the next live ancestor instead."""
        for _, address in self._ancestors[1:]:
            if address and address != self.parent and self._up(address, now):
                self.parent = address
                self._plans.clear()  # the next plan comes from the new parent
                return

    # -- time-driven rules ---------------------------------------------------------------
    def _housekeeping(self, now: float) -> list[Instruction]:
        out = self._expire_sent(now)
        self._expire_leases(now)
        reason = self.batch.due(now, self.expected_writers())
        if reason is not None:
            out += self._flush(reason, now)
        out += self._root_plans(now)
        out += self._report_stats(now)
        return out

    def _expire_leases(self, now: float) -> None:
        lease = self.config.writer_lease
        for log_id in [w for w, seen in self._writers.items() if now - seen > lease]:
            del self._writers[log_id]
            self._writer_cp.pop(log_id, None)
        for node in [n for n, c in self._children.items() if now - c.seen > lease]:
            del self._children[node]

    def _own_estimate(self) -> float:
        return self._estimator.estimate().get(SELF, 0.0)

    def _child_reports(self) -> list[float]:
        return [c.reported_bytes for c in self._children.values()]

    def _root_plans(self, now: float) -> list[Instruction]:
        """The root (or a node acting as one) plans window w+1 from the middle of window
        w on, so that every node decides from half a window of byte estimates; window
        0 has no plan (hop by hop)."""
        if not self.config.plans or self.parent is not None or self._max_cp < 0:
            return []
        n = self.config.plan_window
        w = window_of(self._max_cp, n)
        mine = (self.config.node_id, self.config.address)
        due = [w] if w > 0 else []
        if self._max_cp - w * n >= n // 2:
            due.append(w + 1)
        changed = False
        for window in due:
            if window not in self._plans:
                self._plans[window] = mine
                changed = True
        if changed:
            self._forget_old_plans(w + 1)
        return self._push_plans(now) if changed else []

    def _forget_old_plans(self, newest: int) -> None:
        for window in [x for x in self._plans if x < newest - 2]:
            del self._plans[window]
        self._pushed = {k: v for k, v in self._pushed.items() if k[1] >= newest - 2}

    def _push_plans(self, now: float) -> list[Instruction]:
        """Send every plan a child has not had yet (with the ancestors chain)."""
        if not self._plans:
            return []
        chain = ((self.config.node_id, self.config.address), *self._ancestors)
        out: list[Instruction] = []
        for child in self._children.values():
            for window, (writer, address) in sorted(self._plans.items()):
                key = (child.identity, window)
                if self._pushed.get(key):
                    continue
                self._pushed[key] = True
                out.append(Reply(child.identity, Plan(window, writer, address, chain)))
        return out

    def _report_stats(self, now: float) -> list[Instruction]:
        """Stats to the parent every ``stats_interval`` seconds, and at once when the
        residual writer count changes (the parent's all-persisted rule depends on it)."""
        if self.parent is None:
            return []
        planned = self.writer_for(None)
        writes = planned is not None and planned[0] == self.config.node_id
        writers = 0 if writes else self.writers_below
        due = now >= self._last_stats + self.config.stats_interval
        if not due and writers == self._reported_writers:
            return []
        self._last_stats = now
        self._reported_writers = writers
        residual = self._own_estimate() + sum(self._child_reports())
        stats = Stats(self.config.node_id, writers, 0.0 if writes else residual, self._max_cp)
        return [SendTo(self.parent, stats)]
