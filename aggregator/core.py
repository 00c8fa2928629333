"""The aggregator node as a pure state machine: ``handle(event) -> instructions``.

No sockets, threads or clocks here (pattern of dask/distributed's worker state machine):
``aggregator.node`` drives it over ZeroMQ, the simulator can drive it directly.

Rules (DESIGN.md, Data flow 3-4 and Invariants):
- Items from below join the batch. The batch is flushed on size (>= target bytes),
  when every writer registered below has persisted for one checkpoint, or
  ``persist_delay`` seconds after its first item (FLIP-158, Implementation notes).
- On a size flush, at the root, or while the parent is unreachable the node writes ONE
  object and acks every item to its origin; otherwise it forwards the items to its
  parent, frames untouched, and relays the parent's acks to the origins.
- A forwarded item not acked within ``parent_timeout`` is written by this node itself
  (correctness never depends on the parent); a late ack for it is ignored, and the
  duplicate copy becomes an orphan for cleanup.
- Acks are sent only after the object holding the item was fully written.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

from aggregator.events import (
    Event,
    FromBelow,
    FromParent,
    Instruction,
    ObjectFailed,
    ObjectWritten,
    Reply,
    SendUp,
    Tick,
    WriteObject,
)
from client.batching import Batch, PersistItem
from client.wire import Ack, AckEntry, Error, Persist, Register, Stats, Unregister, WireItem


@dataclass(frozen=True)
class NodeConfig:
    """Thresholds of one node. Sizes in bytes, times in seconds."""

    node_id: str
    has_parent: bool
    target_bytes: int
    persist_delay: float = 0.05
    parent_timeout: float = 2.0
    parent_retry_after: float = 5.0
    writer_lease: float = 10.0
    stats_interval: float = 1.0


@dataclass(frozen=True)
class NodeStatistics:
    """A snapshot of a node's counters (bytes are segment payload bytes)."""

    node_id: str
    writers_below: int
    objects_written: int
    bytes_written: int
    segments_written: int
    bytes_forwarded: int
    bytes_received: int
    queued_bytes: int
    in_flight_up: int
    parent_timeouts: int
    rejected_messages: int
    parent_down: bool


@dataclass
class _Forwarded:
    item: PersistItem
    deadline: float


@dataclass
class NodeCore:
    """State of one node; see the module docstring for the rules."""

    config: NodeConfig
    batch: Batch = field(init=False)
    _writers: dict[str, float] = field(default_factory=dict)  # log_id -> last seen
    _children: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    _child_identities: set[bytes] = field(default_factory=set)
    _up: dict[int, _Forwarded] = field(default_factory=dict)
    _writing: dict[int, tuple[PersistItem, ...]] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    _parent_down_until: float = float("-inf")
    _last_stats: float = 0.0
    _reported: tuple[int, float] | None = None
    _counters: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def __post_init__(self) -> None:
        self.batch = Batch(self.config.target_bytes, self.config.persist_delay)

    # -- public --------------------------------------------------------------------------
    def handle(self, event: Event) -> list[Instruction]:
        """Apply one event; return what the shell must do, in order."""
        match event:
            case FromBelow(identity, msg, now):
                out = self._from_below(identity, msg, now)
            case FromParent(msg, now):
                out = self._from_parent(msg, now)
            case ObjectWritten(oid, path, refs, now):
                out = self._written(oid, path, refs)
            case ObjectFailed(oid, error, now):
                out = self._failed(oid, error)
            case Tick(now):
                out = []
            case _:
                raise TypeError(f"unknown event {event!r}")
        out += self._housekeeping(now)
        return out

    def next_deadline(self) -> float | None:
        """The earliest time a Tick would change something (None: nothing pending)."""
        times = [f.deadline for f in self._up.values()]
        if (d := self.batch.deadline()) is not None:
            times.append(d)
        if self.config.has_parent:
            times.append(self._last_stats + self.config.stats_interval)
        return min(times) if times else None

    @property
    def writers_below(self) -> int:
        return len(self._writers) + sum(c[0] for c in self._children.values())

    def parent_up(self, now: float) -> bool:
        return self.config.has_parent and now >= self._parent_down_until

    def statistics(self, now: float = 0.0) -> NodeStatistics:
        c = self._counters
        return NodeStatistics(
            self.config.node_id,
            self.writers_below,
            c["objects"],
            c["bytes_written"],
            c["segments_written"],
            c["bytes_forwarded"],
            c["bytes_received"],
            self.batch.nbytes,
            len(self._up),
            c["parent_timeouts"],
            c["rejected"],
            self.config.has_parent and not self.parent_up(now),
        )

    def reject(self, identity: bytes, reason: str) -> list[Instruction]:
        """A message from below could not be decoded: reply with an error."""
        self._counters["rejected"] += 1
        return [Reply(identity, Error(reason))]

    # -- messages from below -------------------------------------------------------------
    def _from_below(self, identity: bytes, msg: object, now: float) -> list[Instruction]:
        match msg:
            case Register(log_id):
                self._writers[log_id] = now
                return []
            case Unregister(log_id):
                self._writers.pop(log_id, None)
                return []
            case Stats(node, writers, nbytes):
                self._children[node] = (writers, nbytes, now)
                self._child_identities.add(identity)
                return []
            case Persist(items, payloads):
                self._accept(identity, items, payloads, now)
                return []
        return self.reject(identity, f"unexpected {type(msg).__name__} from below")

    def _accept(
        self, identity: bytes, items: tuple[WireItem, ...], payloads: tuple[object, ...], now: float
    ) -> None:
        frames = iter(payloads)
        from_child = identity in self._child_identities
        for w in items:
            data = next(frames) if w.size > 0 else None
            if not from_child:
                self._writers[w.log_id] = now  # a persist also renews the writer's lease
            item = PersistItem(
                w.log_id, w.sqn_from, w.sqn_to, w.checkpoint_id, w.key_groups, data, w.crc32,
                token=(identity, w.id),
            )  # fmt: skip
            self._counters["bytes_received"] += item.size
            self.batch.add(item, now)

    # -- messages from the parent --------------------------------------------------------
    def _from_parent(self, msg: object, now: float) -> list[Instruction]:
        if isinstance(msg, Ack):
            return self._relay_acks(msg.items, now)
        return []  # plans arrive here (issue 3); errors are answered per item by acks

    def _relay_acks(self, entries: tuple[AckEntry, ...], now: float) -> list[Instruction]:
        replies: dict[bytes, list[AckEntry]] = defaultdict(list)
        failed: list[PersistItem] = []
        for e in entries:
            fwd = self._up.pop(e.id, None)
            if fwd is None:
                continue  # late ack after a timeout: this node wrote the item itself
            if e.error is not None:
                failed.append(fwd.item)
                continue
            identity, orig_id = fwd.item.token
            replies[identity].append(AckEntry(orig_id, e.path, e.offset, e.length))
        out: list[Instruction] = [Reply(i, Ack(tuple(a))) for i, a in replies.items()]
        if failed:
            out += self._write(failed)
        return out

    # -- objects -------------------------------------------------------------------------
    def _written(self, oid: int, path: str, refs: tuple) -> list[Instruction]:
        items = self._writing.pop(oid, ())
        replies: dict[bytes, list[AckEntry]] = defaultdict(list)
        for item, ref in zip(items, refs, strict=True):
            identity, orig_id = item.token
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
            identity, orig_id = item.token
            replies[identity].append(AckEntry(orig_id, error=f"object write failed: {error}"))
        return [Reply(i, Ack(tuple(a))) for i, a in replies.items()]

    def _write(self, items: list[PersistItem]) -> list[Instruction]:
        data = tuple(i for i in items if i.data is not None)
        if not data:
            return []
        oid = next(self._ids)
        self._writing[oid] = data
        return [WriteObject(oid, data)]

    # -- time-driven rules ---------------------------------------------------------------
    def _housekeeping(self, now: float) -> list[Instruction]:
        out = self._expire_forwards(now)
        self._expire_leases(now)
        reason = self.batch.due(now, self.writers_below)
        if reason is not None:
            out += self._flush(reason, now)
        out += self._report_stats(now)
        return out

    def _flush(self, reason: str, now: float) -> list[Instruction]:
        items = self.batch.take()
        if reason == "size" or not self.parent_up(now):
            return self._write(items)
        return self._forward(items, now)

    def _forward(self, items: list[PersistItem], now: float) -> list[Instruction]:
        wire_items, payloads = [], []
        for item in items:
            fid = next(self._ids)
            if item.data is not None:
                self._up[fid] = _Forwarded(item, now + self.config.parent_timeout)
                payloads.append(item.data)
                self._counters["bytes_forwarded"] += item.size
            wire_items.append(
                WireItem(fid, item.log_id, item.sqn_from, item.sqn_to, item.checkpoint_id,
                         item.key_groups, item.size, item.crc32)
            )  # fmt: skip
        return [SendUp(Persist(tuple(wire_items), tuple(payloads)))]

    def _expire_forwards(self, now: float) -> list[Instruction]:
        late = [fid for fid, f in self._up.items() if f.deadline <= now]
        if not late:
            return []
        self._counters["parent_timeouts"] += 1
        self._parent_down_until = now + self.config.parent_retry_after
        return self._write([self._up.pop(fid).item for fid in late])

    def _expire_leases(self, now: float) -> None:
        lease = self.config.writer_lease
        for log_id in [w for w, seen in self._writers.items() if now - seen > lease]:
            del self._writers[log_id]
        for node in [n for n, c in self._children.items() if now - c[2] > lease]:
            del self._children[node]

    def _report_stats(self, now: float) -> list[Instruction]:
        if not self.config.has_parent:
            return []
        current = (self.writers_below, 0.0)
        if current == self._reported and now < self._last_stats + self.config.stats_interval:
            return []
        self._reported = current
        self._last_stats = now
        return [SendUp(Stats(self.config.node_id, current[0], current[1]))]
